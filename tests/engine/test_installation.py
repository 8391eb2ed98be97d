"""``fedaug env``'s report (issue 50): what it says of torch, the CPU and its devices, the compiled
libraries (built, not built yet, no compiler), the extras, and that every run directory keeps it."""

from __future__ import annotations

import json
from importlib import metadata

import torch

from fedaug.config.schema import validate
from fedaug.core import native
from fedaug.core.device import cpu_name
from fedaug.engine.records import installation as inst
from fedaug.engine.records.rundir import ENVIRONMENT
from fedaug.engine.run import resume_experiment, run_experiment
from tests.conftest import tiny_raw

KEYS = ["fedaug", "python", "platform", "torch", "cpu", "devices", "defaults", "precision", "compiled", "triton",
        "flower", "extras", "data"]


def test_the_report_names_torch_the_cpu_its_devices_and_the_precision_flags():
    report = inst.installation()
    assert list(report) == KEYS
    assert report["torch"]["version"] == str(torch.__version__) and report["torch"]["cuda"] == torch.version.cuda
    assert report["cpu"]["model"] == cpu_name()
    assert report["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert report["cpu"]["threads"] == torch.get_num_threads()
    assert report["devices"][0] == {"device": "cpu", "name": cpu_name()}
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    assert [d["device"] for d in report["devices"]] == ["cpu", *cuda, *(["mps"] if torch.backends.mps.is_available()
                                                                        else [])]
    assert report["precision"]["cudnn_allow_tf32"] is torch.backends.cudnn.allow_tf32
    assert report["precision"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    json.dumps(report)  # JSON-ready


def test_a_library_is_built_not_built_yet_or_has_no_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "/usr/bin/my-g++")  # a compiler (never run: nothing is compiled here)
    status = inst.library_status("server_ops")
    assert status["built"] is False and status["path"] is None
    assert status["why_not"] == ("none for this CPU and torch in the cache yet: run fedaug kernel "
                                 "(compiler /usr/bin/my-g++)")
    assert status["costs"].startswith("the server takes its PyTorch path: the same numbers")
    source, flags, _ = inst.LIBRARIES["server_ops"]
    lib = native.library_path(source, "/usr/bin/my-g++", flags)
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")  # where `fedaug kernel` puts it
    assert inst.library_status("server_ops") == {"built": True, "path": str(lib), "costs": None, "why_not": None}
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, c++ or clang++
    assert inst.library_status("ffa_kernel")["why_not"] == (
        "no C++ compiler (looked at $CXX, g++, c++, clang++): apt-get install g++, then fedaug kernel")


def test_extras_are_read_from_the_installed_metadata(monkeypatch):
    monkeypatch.setattr(metadata, "requires", lambda name: [
        "torch<2.14,>=2.13", 'mlxtend>=0.23; extra == "data"', "scipy>=1.11 ; extra == 'data'",
        'wandb>=0.31; extra == "tracking"'])
    monkeypatch.setattr(metadata, "version", lambda name: {"mlxtend": "0.25.0", "wandb": "0.31.0"}.get(name) or (
        _ for _ in ()).throw(metadata.PackageNotFoundError(name)))
    assert inst.extras() == {"data": {"mlxtend": "0.25.0", "scipy": None}, "tracking": {"wandb": "0.31.0"}}


def test_every_run_directory_keeps_the_report_of_each_process_that_trained_it(tmp_path):
    raw = tiny_raw(rounds=2)
    raw["out_dir"] = str(tmp_path)
    _, run_dir = run_experiment(validate(raw), quiet=True)
    resume_experiment(str(run_dir.path), quiet=True, from_round=1)
    lines = [json.loads(line) for line in (run_dir.path / ENVIRONMENT).read_text().splitlines()]
    assert [line["from_round"] for line in lines] == [0, 1]
    here = inst.installation()
    for line in lines:
        assert set(line) == {"at", "from_round", *KEYS}
        assert {k: line[k] for k in ("torch", "cpu", "devices", "precision", "extras")} == \
            {k: here[k] for k in ("torch", "cpu", "devices", "precision", "extras")}
