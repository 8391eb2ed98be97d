"""``fedaug compare``'s progress: the grid's ETA (a schedule of cells over jobs), the plan line (at once), the
estimate line (naming what runs the cells: ``--jobs N`` or ``--ray ADDRESS``), and the plain lines a pipe gets,
driven with a fake clock."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fedaug.engine.records.progress import RoundUpdate
from fedaug.report.progress import GridProgress, about, grid_eta
from fedaug.report.runner import Cell, CellOutcome


@pytest.mark.parametrize(("running", "left", "cell_s", "jobs", "eta"), [
    ([], 0, None, 2, 0.0),                # nothing to do
    ([10.0, 30.0], 0, None, 2, 30.0),     # the later of the two running cells
    ([10.0, 30.0], 2, 100.0, 2, 130.0),   # 10 -> 110, 30 -> 130
    ([10.0], 3, 100.0, 2, 200.0),         # a free job: 0 -> 100 -> 200; the other: 10 -> 110
    ([], 3, 10.0, 1, 30.0),               # one job: one cell after the other
    ([5.0], 1, None, 1, None),            # a cell left, no cell time known yet
])
def test_grid_eta_schedules_the_cells_left_on_the_first_free_job(running, left, cell_s, jobs, eta):
    assert grid_eta(running, left, cell_s, jobs) == eta


@pytest.mark.parametrize(("seconds", "text"), [(0.2, "about 1 s"), (42.4, "about 42 s"), (64, "about 1 min"),
                                               (319, "about 5 min 20 s"), (3600, "about 1 h 0 min"),
                                               (5430, "about 1 h 30 min")])
def test_about(seconds, text):
    assert about(seconds) == text


def cell(method: str) -> Cell:
    return Cell("default", method, 0, Path("/nowhere") / method, {"device": "cpu"})


def test_a_pipe_gets_throttled_grid_lines_one_estimate_and_a_line_per_cell():
    t = [0.0]
    stream = io.StringIO()
    a, b, c = cell("A"), cell("B"), cell("C")
    with GridProgress("tiny", stream=stream, now=lambda: t[0]) as g:  # StringIO: not a terminal
        g.planned([a, b, c], "--jobs 2", 2)
        g.started(a.label)
        g.started(b.label)
        t[0] = 10.0
        g.round_done(a.label, RoundUpdate(1, 4, 0, elapsed=8.0, metric="loss 1", first=8.0))  # printed: the first
        t[0] = 12.0
        g.round_done(b.label, RoundUpdate(1, 4, 0, elapsed=9.0, metric="loss 1", first=9.0))  # within 5 s: not
        t[0] = 14.0
        g.round_done(a.label, RoundUpdate(2, 4, 0, elapsed=12.0, metric="loss 0.9", first=8.0))
        t[0] = 16.0  # both cells measured over two rounds: the estimate, once
        g.round_done(b.label, RoundUpdate(2, 4, 0, elapsed=14.0, metric="loss 0.9", first=9.0))
        t[0] = 22.0
        g.finished(1, 3, CellOutcome(a, "ran", "/runs/a", 20.0))
        late = RoundUpdate(4, 4, 0, elapsed=20.0, metric="late", first=8.0)
        g.round_done(a.label, late)  # after its outcome (a worker's queue lagging): ignored
    assert stream.getvalue().splitlines() == [
        "compare tiny: 3 cells (1 setting x 3 methods x 1 seed), device cpu, --jobs 2",  # at once
        # A: 8 s for its first round, 3 left: 24 s; a cell: A's 10 s so far + 24 = 34 s; B, starting, ends
        # then in 34 - 10 = 24 s; C starts on the first free job (24 s) and ends at 58 s
        "compare tiny: 0 done, 2 running, 1 left  elapsed 00:10  eta 00:58  [default | A | seed 0: round 1/4 "
        "eta 00:24]  [default | B | seed 0: starting]",
        # second rounds without the first: A 4 s x 2 = 8 s, B 5 s x 2 = 10 s; a cell: (16 + 8 + 16 + 10) / 2
        # = 25 s; C after A: 8 + 25 = 33 s
        "fedaug compare: the 3 cells left take about 33 s on this machine (estimated from the rounds so far; --jobs 2)",
        "compare tiny: 0 done, 2 running, 1 left  elapsed 00:16  eta 00:33  [default | A | seed 0: round 2/4 "
        "eta 00:08]  [default | B | seed 0: round 2/4 eta 00:10]",
        "[1/3] default | A | seed 0: ran in 20.0 s -> /runs/a",
        # a cell took 20 s: C starts on the free job now and ends after B's 10 s
        "compare tiny: 1 done, 1 running, 1 left  elapsed 00:22  eta 00:20  [default | B | seed 0: round 2/4 "
        "eta 00:10]",
    ]


def test_a_time_limit_shows_where_cells_stopped_and_which_were_not_started():
    stream = io.StringIO()
    a, b, c = cell("A"), cell("B"), cell("C")
    with GridProgress("tiny", stream=stream, now=lambda: 0.0) as g:
        g.planned([a, b, c], "--jobs 1", 1)
        g.started(a.label)
        g.finished(1, 3, CellOutcome(a, "stopped", "/runs/a", 7.25, round=4, rounds=10))
        g.finished(2, 3, CellOutcome(b, "not started", None, 0.0, rounds=10))
        g.finished(3, 3, CellOutcome(c, "not started", "/runs/c", 0.0, round=2, rounds=10))
    assert [line for line in stream.getvalue().splitlines() if line.startswith("[")] == [
        "[1/3] default | A | seed 0: stopped at round 4 of 10 in 7.2 s -> /runs/a",
        "[2/3] default | B | seed 0: not started",
        "[3/3] default | C | seed 0: not started (saved at round 2 of 10) -> /runs/c",
    ]
    assert g.durations == []  # a stopped cell's time is not a cell's time


@pytest.mark.parametrize(("scheduler", "jobs", "cluster", "about"), [
    # A's 2 rounds took 4 s, 2 left: 4 s; a cell takes 8 s; B waits for no job (2 at once): 8 s, else after A: 12 s
    ("--jobs 2", 2, None, "8 s on this machine"),
    ("--jobs 1", 1, None, "12 s on this machine"),
    # on Ray the plan comes before the cluster is reached; then a line names it and the cells it holds at once
    ("--ray head:6379", None, ("the Ray cluster at 10.0.0.5:6379 (CPUs: 4, GPUs: 0)", 2, "2 cells"),
     "8 s on the cluster"),
    ("--ray local", None, ("a Ray started for this command at 127.0.0.1:6380 (CPUs: 1, GPUs: 0)", 1, "1 cell"),
     "12 s on the cluster"),
])
def test_the_plan_comes_at_once_and_the_estimate_names_what_runs_the_cells(scheduler, jobs, cluster, about):
    t = [0.0]
    stream = io.StringIO()
    a, b = cell("A"), cell("B")
    with GridProgress("tiny", stream=stream, now=lambda: t[0]) as g:
        g.planned([a, b], scheduler, jobs)
        assert stream.getvalue() == f"compare tiny: 2 cells (1 setting x 2 methods x 1 seed), device cpu, {scheduler}\n"
        if cluster is not None:
            g.connected(*cluster[:2])
        g.started(a.label)
        t[0] = 4.0
        g.round_done(a.label, RoundUpdate(2, 4, 0, elapsed=4.0, metric="", first=2.0))
    printed = stream.getvalue().splitlines()
    if cluster is not None:
        assert printed[1] == f"compare tiny: {scheduler}: {cluster[0]}, {cluster[2]} at once"
    assert (f"fedaug compare: the 2 cells left take about {about} (estimated from the rounds so far; "
            f"{scheduler})") in printed
