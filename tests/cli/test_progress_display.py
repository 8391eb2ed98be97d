"""``fedaug compare`` shows its progress while the cells train (issue 50, Must show): a 2-cell grid run
through a pseudo-terminal redraws a live display, run through a pipe prints plain lines, and in both the
running cell's round appears before the first cell ends. The command runs as a user runs it, in a
subprocess; the pipe's run uses two jobs where there are two cores (cells in worker processes, their
rounds sent back through a queue), the terminal's one (cells in the command's own process).

A pipe hears what is about to run at once (issue 61): ``fedaug run`` and ``fedaug compare`` print their first
line while the data set has not loaded yet (a data set of the test's own that waits for a file)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedaug.core.runtime import available_cores
from tests.cli.test_compare_cmd import write_grid

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: the first cell's outcome line (either cell may end first): the cell has ended
FIRST_ENDS = re.compile(r"\[1/2\] default \| FedAvg( lr 0\.2)? \| seed 0: ran in")
CELL = r"default \| FedAvg( lr 0\.2)? \| seed 0"


def command(tmp_path, jobs: int) -> list[str]:
    grid = write_grid(tmp_path, seeds=[0])  # 2 cells: FedAvg, FedAvg lr 0.2
    return [sys.executable, "-m", "fedaug", "compare", str(grid), "--out", str(tmp_path / "out"), "--jobs", str(jobs),
            "--set", "train.rounds=4"]


def environment() -> dict[str, str]:
    """The caller's environment, without the variables that make rich draw (or not) whatever the output is."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE",
                                                            "TTY_INTERACTIVE", "COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}


def read_pty(cmd: list[str], timeout: float = 300.0) -> tuple[int, str]:
    """Run ``cmd`` with a pseudo-terminal as its stdout and stderr; everything it wrote, and its exit code."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=environment())
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 1 << 16)
            except OSError:  # EIO: the process closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    proc.kill()
    return proc.wait(), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_a_terminal_gets_a_live_display_with_the_running_cells_round_before_the_first_cell_ends(tmp_path):
    code, raw = read_pty(command(tmp_path, jobs=1))
    assert code == 0, raw[-3000:]
    text = ANSI.sub("", raw)
    end = FIRST_ENDS.search(text)
    assert end, text[-3000:]
    before, before_raw = text[:end.start()], raw[:raw.index("[1/2] default")]  # jobs=1: FedAvg first
    # the live rows: the grid's counts and the running cell's round (bar, done/total, ETA, metric)
    assert "compare tiny: 0 done, 1 running, 1 left" in before
    assert re.search(r"default \| FedAvg \| seed 0 +[━╸╺ ]+ [1-3]/4 eta \d\d:\d\d train loss \d\.\d{4}", before)
    assert "\x1b[2K" in before_raw and before_raw.count("\r") > before.count("\n") + 3  # redrawn in place
    assert "fedaug compare: the 2 cells left take about" in text


@pytest.mark.slow
def test_a_pipe_gets_plain_lines_with_the_running_cells_round_before_the_first_cell_ends(tmp_path):
    jobs = min(2, available_cores())
    proc = subprocess.run(command(tmp_path, jobs), capture_output=True, text=True, timeout=300, env=environment())
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\x1b" not in err and "\r" not in err  # no terminal codes in a log
    lines = err.splitlines()
    first_end = next(i for i, line in enumerate(lines) if FIRST_ENDS.search(line))
    progress = [i for i, line in enumerate(lines) if re.fullmatch(
        r"compare tiny: 0 done, [12] running, [01] left  elapsed \d\d:\d\d  eta (\d\d:\d\d|--:--)  "
        rf".*\[{CELL}: round [1-3]/4 eta \d\d:\d\d\].*", line)]
    assert progress and progress[0] < first_end, err
    assert any(re.match(r"fedaug compare: the (2 cells left take|1 cell left takes) about \d", line) for line in lines)
    assert "| FedAvg | 1 |" in proc.stdout  # the table, on stdout as before


#: a data set that loads only once the file its ``gate`` option names exists: until then nothing can train
GATED = '''"""A data set of the tests that waits for a file before it loads."""
import time
from pathlib import Path

from fedaug.data import DATASETS, FederatedData
from fedaug.data.synthetic import synthetic


@DATASETS.register("gated", "synthetic data, loaded once the file gate exists (a plugin of the tests)")
def gated(*, seed: int, gate: str) -> FederatedData:
    """The tiny synthetic federation, once ``gate`` exists."""
    while not Path(gate).exists():
        time.sleep(0.05)
    return synthetic(seed=seed, num_clients=3, samples_per_client=32, num_classes=4, size=8)
'''

#: what both commands train: the gated data, 2 rounds of a narrow CNN on the CPU
GATED_RUN = ["model.options.width=8", "train.rounds=2", "train.local_steps=1", "train.batch_size=16", "threads=1",
             "device=cpu", "data.name=gated"]


def first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first line ``proc`` writes to its stderr (a pipe) within ``timeout`` seconds, else ``""``."""
    ready, _, _ = select.select([proc.stderr], [], [], timeout)
    return proc.stderr.readline() if ready else ""


@pytest.mark.slow
@pytest.mark.parametrize(("command", "first"), [
    (["run", *GATED_RUN], "fedaug: gated-fedavg: data gated, model small_cnn, rounds 1-2 of 2, device cpu, this "
                          "process at 1 thread\n"),
    (["compare", "--method", "FedAvg", "--set", *GATED_RUN],
     "compare gated-fedavg: 1 cell (1 setting x 1 method x 1 seed), device cpu, --jobs 1\n"),
])
def test_a_pipe_hears_what_is_about_to_run_before_the_data_loads(tmp_path, command, first):
    gate = tmp_path / "gate"
    (tmp_path / "gated.py").write_text(GATED)
    cmd = [sys.executable, "-m", "fedaug", *command, f"data.options.gate={gate}", "--import", "gated.py"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment())
    try:
        line = first_line(proc, timeout=180.0)  # the command's start-up: Python, torch, the config
        runs = [p for name in ("config.toml", "metrics.jsonl") for p in tmp_path.rglob(name)]
        gate.touch()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert line == first, line + err
    assert runs == []  # the data had not loaded: no run directory, no round yet
    assert proc.returncode == 0, err
    assert re.search(r"^round 2/2  elapsed \d\d:\d\d  eta 00:00  train loss|^\[1/1\] default \| FedAvg \| seed 0: ran",
                     err, re.M), err
