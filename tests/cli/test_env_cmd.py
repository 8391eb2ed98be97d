"""``fedaug env`` / ``fedaug doctor``: the installation report as text and JSON."""

from __future__ import annotations

import json

import torch

from fedaug.cli.main import main
from fedaug.core.device import cpu_name
from fedaug.engine.records.installation import installation


def test_env_prints_the_report_as_text_and_json(capsys):
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"cpu: {cpu_name()}, torch capability {torch.backends.cpu.get_cpu_capability()}, " in text
    assert f"torch {torch.__version__}: CUDA {torch.version.cuda or 'none'}" in text
    assert "\ncompiled libraries (fedaug kernel):\n  ffa_kernel: " in text and "\n  server_ops: " in text and "\n  local_sgd: " in text
    assert "\ndata sources:\n  digits4: " in text and "TF32 in cuBLAS matmuls" in text
    assert main(["doctor", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == list(installation()) and report["cpu"] == installation()["cpu"]
