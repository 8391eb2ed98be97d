"""Time limits: the duration parser, the reserve, and the round watch's stop rule (on a clock set by hand)."""

from __future__ import annotations

import pickle

import pytest

from fedaug.core.errors import ConfigError
from fedaug.report.deadline import MARGIN, RESERVE_FRACTION, RESERVE_S, Deadline, parse_time_limit
from tests.report.conftest import TickClock


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90.0), ("9m", 540.0), ("2h", 7200.0), ("1h30m", 5400.0), ("1h0m5s", 3605.0), ("11s", 11.0),
    (" 45m ", 2700.0),
])
def test_durations_in_hours_minutes_and_seconds(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["9", "9x", "1.5h", "30m1h", "9 m", "-5m", "", "h", "1d"])
def test_a_malformed_duration_is_named_with_the_accepted_forms(text):
    with pytest.raises(ConfigError, match=rf"^--time-limit {text!r} is not a duration; write whole hours, minutes "
                                          r"and seconds with their units in that order, e\.g\. 90s, 9m, 2h or 1h30m$"):
        parse_time_limit(text)


@pytest.mark.parametrize("text", ["0s", "0h0m", "10s"])
def test_a_limit_within_the_reserve_is_refused(text):
    with pytest.raises(ConfigError, match=rf"^--time-limit {text!r} leaves no time to train: the command keeps the "
                                          r"last 10 s for writing its tables; give a longer one, e\.g\. 9m$"):
        parse_time_limit(text)


def test_the_reserve_is_ten_seconds_or_two_percent_of_the_time_left():
    assert (RESERVE_S, RESERVE_FRACTION) == (10.0, 0.02)
    assert Deadline.until(1060.0, clock=lambda: 1000.0).reserve == 10.0  # 2 % of 60 s is 1.2 s
    assert Deadline.until(8200.0, clock=lambda: 1000.0).reserve == pytest.approx(144.0)  # 2 % of 2 h


def test_work_fits_where_its_time_times_the_margin_ends_before_the_reserve():
    d = Deadline(at=100.0, reserve=10.0, clock=lambda: 60.0)  # 30 s left before the reserve
    assert MARGIN == 1.5
    assert d.fits(20.0) and not d.fits(20.5)  # 20 x 1.5 = 30 fits exactly
    assert d.fits(0.0) and not d.fits(0.0, now=90.5)  # nothing fits past at - reserve
    assert d.fits(10.0, now=75.0) and not d.fits(10.0, now=75.5)


def test_the_watch_stops_once_the_longest_round_would_not_fit():
    """Readings 1, 2, ...: the watch starts at 1; rounds end at 2, 3, 5 (round 3 took 2 s); the deadline less its
    reserve is 7.5: after round 2 (at 3) the longest round, 1 s x 1.5, fits (3 + 1.5 <= 7.5); after round 3 (at 5)
    2 s x 1.5 = 3 does not (5 + 3 > 7.5)."""
    clock = TickClock()
    watch = Deadline(at=17.5, reserve=10.0, clock=clock).watch()
    assert watch.first is None and watch.longest == 0.0
    assert watch(1) is False and watch(2) is False
    clock()  # a round that takes 2 s
    assert watch(3) is True
    assert (watch.first, watch.longest) == (1.0, 2.0)


def test_the_first_round_counts_the_start_up():
    clock = TickClock()
    watch = Deadline(at=1000.0, clock=clock).watch()  # read at 1
    for _ in range(4):  # start-up: data, model, checkpoint
        clock()
    assert watch(1) is False and watch.first == 5.0 and watch.longest == 5.0


def test_a_deadline_travels_to_a_worker_process_with_its_clock():
    d = Deadline.until(500.0, clock=TickClock())
    again = pickle.loads(pickle.dumps(d))
    assert again == d and again.clock() == d.clock() == 2.0  # its own copy of the clock, read once in until
