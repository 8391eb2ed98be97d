"""Runs of the ``fedaug`` command in a subprocess, for the tests that interrupt them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedaug.config.load import dump_toml
from fedaug.engine.records.rundir import RunDir


def start_run(cfg_file: Path, **popen: Any) -> subprocess.Popen:
    """``fedaug run CFG -q`` in a subprocess (stdout discarded, stderr piped)."""
    return subprocess.Popen([sys.executable, "-m", "fedaug", "run", str(cfg_file), "-q"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, **popen)


def wait_for_rounds(proc: subprocess.Popen, runs: Path, name: str, rounds: int, timeout: float = 120) -> Path:
    """The ``metrics.jsonl`` of run ``name`` under ``runs`` once it holds ``rounds`` records, with the run
    still going (asserted: a run that ends first cannot be interrupted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(runs.glob(f"{name}-*/metrics.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= rounds:
            assert proc.poll() is None, "the run ended before it could be interrupted"
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"round {rounds} was not recorded in time: {proc.stderr.read() if proc.poll() is not None else ''}")


def kill_and_resume(raw: dict[str, Any], tmp_path: Path, after_rounds: int) -> Path:
    """Run config ``raw`` (its ``out_dir`` and ``name`` set) with ``fedaug run``, SIGKILL it once
    ``after_rounds`` rounds are recorded, then finish it with ``fedaug resume``; its run directory."""
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(dump_toml(raw))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = start_run(cfg_file, env=env)
    run_dir = wait_for_rounds(proc, Path(raw["out_dir"]), raw["name"], after_rounds).parent
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(RunDir(run_dir).rounds()) < raw["train"]["rounds"] and not (run_dir / "summary.json").exists()
    out = subprocess.run([sys.executable, "-m", "fedaug", "resume", str(run_dir), "-q", "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return run_dir
