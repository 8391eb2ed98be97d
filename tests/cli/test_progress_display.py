"""``fedaug compare`` shows its progress while the cells train (issue 50, Must show): a 2-cell grid run
through a pseudo-terminal redraws a live display, run through a pipe prints plain lines, and in both the
running cell's round appears before the first cell ends. The command runs as a user runs it, in a
subprocess; the pipe's run uses two jobs where there are two cores (cells in worker processes, their
rounds sent back through a queue), the terminal's one (cells in the command's own process)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

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
