"""A run's progress: the line that says what is about to run (before the data loads), the ETA rule, the plain
lines of a pipe (first, throttled, last), quiet, and the updates a caller receives (a grid's display) with or
without a display."""

from __future__ import annotations

import io
import re

import pytest

from fedaug.config.schema import validate
from fedaug.engine.records.progress import LineThrottle, Progress, RoundUpdate, announce, clock
from fedaug.engine.run import heading, run_experiment
from tests.conftest import tiny_raw


@pytest.mark.parametrize(("update", "eta"), [
    (RoundUpdate(1, 10, 0, elapsed=6.0, metric="", first=6.0), 54.0),     # one round: 6 s a round, 9 left
    (RoundUpdate(3, 10, 0, elapsed=14.0, metric="", first=6.0), 28.0),    # (14 - 6) / 2 = 4 s a round, 7 left
    (RoundUpdate(6, 10, 4, elapsed=5.0, metric="", first=3.0), 8.0),      # resumed at 4: (5 - 3) / 1, 4 left
    (RoundUpdate(10, 10, 0, elapsed=40.0, metric="", first=6.0), 0.0),    # done
    (RoundUpdate(4, 10, 4, elapsed=0.0, metric="", first=0.0), 0.0),      # nothing done in this process yet
])
def test_eta_is_the_mean_round_after_the_first_times_the_rounds_left(update, eta):
    assert update.eta == eta


@pytest.mark.parametrize(("seconds", "text"), [(0, "00:00"), (75, "01:15"), (3599.6, "1:00:00"), (3725, "1:02:05")])
def test_clock(seconds, text):
    assert clock(seconds) == text


def test_the_throttle_lets_the_first_line_through_then_one_per_interval_and_the_last():
    times = iter([0.0, 1.0, 4.9, 5.0, 6.0, 6.5])
    t = LineThrottle(5.0, now=lambda: next(times))
    assert [t.due(), t.due(), t.due(), t.due(), t.due(), t.due(final=True)] == [True, False, False, True, False, True]


def test_in_a_pipe_the_first_and_last_rounds_are_plain_lines_and_quiet_prints_nothing():
    t = [0.0]
    stream, seen = io.StringIO(), []
    with Progress(4, stream=stream, on_update=seen.append, now=lambda: t[0]) as p:  # StringIO: not a terminal
        for r in range(1, 5):
            t[0] += 1.0  # a round a second
            p.update(r, f"train loss {1 / r:.4f}")
    assert stream.getvalue().splitlines() == [  # rounds 2 and 3 fall within the interval of round 1's line
        "round 1/4  elapsed 00:01  eta 00:03  train loss 1.0000",
        "round 4/4  elapsed 00:04  eta 00:00  train loss 0.2500"]
    assert "\x1b" not in stream.getvalue()
    assert [(u.round, u.elapsed, u.first) for u in seen] == [(1, 1.0, 1.0), (2, 2.0, 1.0), (3, 3.0, 1.0), (4, 4.0, 1.0)]
    quiet, heard = io.StringIO(), []
    with Progress(2, quiet=True, stream=quiet, on_update=heard.append) as p:
        announce("fedaug: what runs", quiet=True, stream=quiet)
        p.update(1, "x")
        p.update(2, "y")
    assert quiet.getvalue() == "" and [u.metric for u in heard] == ["x", "y"]


def test_a_run_reports_every_round_with_its_metric(tmp_path, capsys):
    raw = {**tiny_raw(rounds=3), "out_dir": str(tmp_path), "device": "cpu"}
    seen: list[RoundUpdate] = []
    run_experiment(validate(raw), on_round=seen.append)
    assert [(u.round, u.total, u.start) for u in seen] == [(1, 3, 0), (2, 3, 0), (3, 3, 0)]
    assert all(re.fullmatch(r"train loss \d\.\d{4}  mean test acc \d\.\d{4}", u.metric) for u in seen)
    err = capsys.readouterr().err  # pytest's capture is no terminal: plain lines, the first and the last
    assert err.splitlines()[0] == ("fedaug: synthetic-fedavg: data synthetic, model small_cnn, rounds 1-3 of 3, "
                                   "device cpu, this process at 2 threads")  # what runs, before its rounds
    assert re.search(r"^round 1/3  elapsed \d\d:\d\d  eta \d\d:\d\d  train loss", err, re.M)
    assert re.search(r"^round 3/3  elapsed \d\d:\d\d  eta 00:00  train loss", err, re.M)


@pytest.mark.parametrize(("extra", "start", "line"), [
    ({}, 0, "rounds 1-3 of 3, device cpu, this process at 2 threads"),
    ({"threads": 1}, 2, "rounds 3-3 of 3, device cpu, this process at 1 thread"),  # resumed after round 2
    ({}, 3, "all 3 rounds done, device cpu, this process at 2 threads"),
    ({"workers": 2}, 0, "rounds 1-3 of 3, device cpu, 2 worker processes on cpu at 2 threads each"),
    ({"workers": 2, "devices": ["cpu", "cpu"]}, 0,
     "rounds 1-3 of 3, device cpu, 2 worker processes on cpu, cpu at 2 threads each"),
    ({"fleet": "ray", "ray": {"address": "head:6379"}}, 0,
     "rounds 1-3 of 3, device cpu, 1 Ray actor (Ray: head:6379) at 2 threads each"),
    ({"fleet": "ray", "workers": 3, "ray": {"address": "local"}, "name": "mine"}, 0,
     "rounds 1-3 of 3, device cpu, 3 Ray actors (Ray: local) at 2 threads each"),
])
def test_the_first_line_names_the_run_its_rounds_device_and_what_trains_its_clients(extra, start, line):
    cfg = validate({**tiny_raw(rounds=3), "device": "cpu", "threads": 2, **extra})
    name = extra.get("name", "synthetic-fedavg")
    assert heading(cfg, start) == f"fedaug: {name}: data synthetic, model small_cnn, {line}"
