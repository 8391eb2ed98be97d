"""Runs of the ``fedaug`` command in a subprocess, for the tests that interrupt them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any


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
