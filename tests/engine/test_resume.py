"""Resume: an interrupted run (exception or SIGKILL) finishes with exactly the uninterrupted numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedaug.config.load import dump_toml
from fedaug.config.schema import validate
from fedaug.core.errors import CheckpointError
from fedaug.engine.records import RunDir
from fedaug.engine.simulate import resume_experiment, run_experiment
from tests.conftest import tiny_raw


def comparable(run_dir: Path):
    recs = RunDir(run_dir).rounds()
    return [{k: v for k, v in r.items() if k != "time"} for r in recs]


def summary_numbers(run_dir: Path):
    s = json.loads((run_dir / "summary.json").read_text())
    return s["final"], s["best"], s["comm_total"]


def test_resume_after_an_exception_equals_uninterrupted(tmp_path, monkeypatch):
    raw = tiny_raw(rounds=5)
    raw.update(out_dir=str(tmp_path / "a"), checkpoint_every=2)
    cfg = validate(raw)
    _, full = run_experiment(cfg, quiet=True)

    from fedaug.engine import simulate

    original = simulate.Simulation.run_round

    def crash_in_round_4(self, r):
        if r == 4:
            raise KeyboardInterrupt
        return original(self, r)

    raw["out_dir"] = str(tmp_path / "b")
    monkeypatch.setattr(simulate.Simulation, "run_round", crash_in_round_4)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(validate(raw), quiet=True)
    monkeypatch.setattr(simulate.Simulation, "run_round", original)
    (part,) = list((tmp_path / "b").iterdir())
    assert [r["round"] for r in RunDir(part).rounds()] == [1, 2, 3]
    resume_experiment(str(part), quiet=True)
    assert comparable(part) == comparable(full.path)
    assert summary_numbers(part) == summary_numbers(full.path)


def test_resume_after_sigkill_between_checkpoints_equals_uninterrupted(tmp_path):
    raw = tiny_raw(rounds=8)
    raw.update(out_dir=str(tmp_path / "runs"), checkpoint_every=3, name="killed")
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(dump_toml(validate(raw).to_dict()))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "fedaug", "run", str(cfg_file), "-q"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    metrics = None
    while time.monotonic() < deadline and proc.poll() is None:  # wait until round 4 is recorded
        found = list((tmp_path / "runs").glob("killed-*/metrics.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 4:
            metrics = found[0]
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_dir = metrics.parent
    done = len(RunDir(run_dir).rounds())
    assert done < 8 and not (run_dir / "summary.json").exists()
    out = subprocess.run([sys.executable, "-m", "fedaug", "resume", str(run_dir), "-q", "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    raw["out_dir"] = str(tmp_path / "ref")
    _, ref = run_experiment(validate(raw), quiet=True)
    assert comparable(run_dir) == comparable(ref.path)
    assert summary_numbers(run_dir) == summary_numbers(ref.path)


def test_corrupted_checkpoint_is_reported_and_nothing_is_damaged(tmp_path):
    raw = tiny_raw(rounds=2)
    raw.update(out_dir=str(tmp_path), checkpoint_every=1)
    _, run = run_experiment(validate(raw), quiet=True)
    ckpt = run.checkpoints()[-1][1]
    ckpt.write_bytes(b"garbage")
    before = (run.path / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match=r"round_000002.pt' is corrupted or truncated"):
        resume_experiment(str(run.path), quiet=True)
    assert (run.path / "metrics.jsonl").read_text() == before


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(CheckpointError, match=r"is not a fedaug run directory \(no config.toml\)"):
        resume_experiment(str(tmp_path), quiet=True)


def test_checkpoints_are_pruned_to_keep(tmp_path):
    raw = tiny_raw(rounds=4)
    raw.update(out_dir=str(tmp_path), checkpoint_every=1, keep_checkpoints=2)
    _, run = run_experiment(validate(raw), quiet=True)
    assert [r for r, _ in run.checkpoints()] == [3, 4]
