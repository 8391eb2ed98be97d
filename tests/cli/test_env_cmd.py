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


def test_env_says_what_the_default_settings_do_here(capsys, monkeypatch):
    from fedaug.cli.env_cmd import render
    from fedaug.engine.records import installation as inst

    report = installation()
    if not torch.cuda.is_available():
        assert report["defaults"] == {"device": "cpu", "steps": "eager", "data": "host", "data_budget_gib": None}
        assert "\ndefaults here: device auto = cpu; steps eager (train.cuda_graph = auto); data on the host\n" in \
            render(report)
    # a machine with a GPU (faked: 10 GiB free), whose budget for the data is half of it
    monkeypatch.setattr(inst, "resolve_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(inst, "free_memory", lambda device: 10 * 2**30)
    gpu = {**report, "defaults": inst.defaults_here()}
    assert ("\ndefaults here: device auto = cuda:0; steps captured where the method can be captured, else eager "
            "(train.cuda_graph = auto); data on the device where it fits the budget, else host (data.on_device = "
            "auto: up to 5.0 GiB now)\n") in render(gpu)
