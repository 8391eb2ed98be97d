"""docs/data.md's ``DATASETS.register`` example runs as written: the module and the config file of the
page give a run directory, resume and a report from the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fedaug.cli.main import main

DOC = Path(__file__).parents[2] / "docs" / "data.md"


def run(capsys, *args: str) -> dict:
    assert main([*args, "-q", "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_register_example_runs_resumes_and_reports(tmp_path, monkeypatch, capsys, own_registries):
    text = DOC.read_text()
    (module,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (config,) = [b for b in re.findall(r"```toml\n(.*?)```", text, flags=re.S) if "my_experiment.toml" in b]
    (tmp_path / "my_data.py").write_text(module)
    (tmp_path / "my_experiment.toml").write_text("threads = 1\n" + config)
    monkeypatch.chdir(tmp_path)
    done = run(capsys, "run", "my_experiment.toml")
    run_dir = tmp_path / done["run_dir"]  # relative to where it ran: out_dir = "runs"
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("my_hospitals-fedavg-") and run_dir.is_dir()
    assert done["clients"] == ["north", "south"] and done["rounds"] == 3
    assert run(capsys, "resume", str(run_dir), "--from-round", "2")["final"] == done["final"]
    assert main(["report", str(run_dir)]) == 0 and (run_dir / "report" / "report.html").is_file()
    capsys.readouterr()
    assert main(["list", "datasets", "my_hospitals", "--import", "my_data.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("my_hospitals: two hospitals' scans, one client each (my_data.py)") and "image side." in out
