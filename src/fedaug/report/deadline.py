"""A time limit for long studies (``fedaug compare GRID --time-limit 9m``, ``fedaug resume RUN --time-limit 2h``).

A limit is an absolute deadline in :func:`time.time` seconds (:class:`Deadline`), so that cells in worker processes
stop by the same clock as the command. Each run asks its :meth:`Deadline.watch` after every round
(:meth:`~fedaug.engine.server.loop.Server.run`'s ``stop``); the watch says stop when the time now plus the
longest round the run has taken so far, times :data:`MARGIN`, would pass the deadline less its
``reserve`` (kept for what comes after the cells: writing tables). The run's first round is measured from
the watch's creation, so it includes the run's start-up (loading data, building the model, restoring a
checkpoint): an overestimate of later rounds, which makes the watch stop early rather than late. A grid
starts a cell only where its start-up and first round, estimated by the longest such seen so far, fit
(:meth:`Deadline.fits`). A stopped command exits with :data:`STOPPED_STATUS`; the same command continues.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fedaug.core.errors import ConfigError

#: the exit status of a command stopped at its time limit: sysexits.h's EX_TEMPFAIL ("try again later")
STOPPED_STATUS = 75
#: the next round is predicted to take at most this many times the longest round seen so far
MARGIN = 1.5
#: the time kept after the cells for writing tables: this many seconds at least ...
RESERVE_S = 10.0
#: ... or this fraction of the limit, whichever is longer
RESERVE_FRACTION = 0.02
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def now() -> float:
    """The time now, :func:`time.time` (looked up at each call: a test may replace this module's ``time``)."""
    return time.time()


def parse_time_limit(text: str) -> float:
    """Seconds in a duration written as hours, minutes and seconds: ``"90s"``, ``"9m"``, ``"2h"``, ``"1h30m"``.

    >>> parse_time_limit("1h30m"), parse_time_limit("90s")
    (5400.0, 90.0)

    Raises:
        ConfigError: ``text`` is not such a duration, or not longer than :data:`RESERVE_S` (the least time a
            command keeps for its tables); the message names it and the accepted forms.
    """
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ConfigError(f"--time-limit {text!r} is not a duration; write whole hours, minutes and seconds with "
                          "their units in that order, e.g. 90s, 9m, 2h or 1h30m")
    h, m, s = (int(g or 0) for g in match.groups())
    seconds = float(3600 * h + 60 * m + s)
    if seconds <= RESERVE_S:
        raise ConfigError(f"--time-limit {text!r} leaves no time to train: the command keeps the last "
                          f"{RESERVE_S:g} s for writing its tables; give a longer one, e.g. 9m")
    return seconds


@dataclass(frozen=True)
class Deadline:
    """When work must be done: ``at`` (seconds since the epoch, :func:`time.time`) less ``reserve``.

    Args:
        at: the deadline.
        reserve: seconds before ``at`` kept for what follows the runs (default: :meth:`until` sets it).
        margin: the factor on a measured time that :meth:`fits` asks room for.
        clock: the time now (:func:`now`; tests pass their own; picklable, for worker processes).

    >>> d = Deadline(at=100.0, reserve=10.0, clock=lambda: 60.0)
    >>> d.fits(20.0), d.fits(21.0)
    (True, False)
    """

    at: float
    reserve: float = 0.0
    margin: float = MARGIN
    clock: Callable[[], float] = field(default=now, compare=False)

    @classmethod
    def until(cls, at: float, clock: Callable[[], float] = now) -> "Deadline":
        """The deadline ``at`` with the reserve of the time left now: :data:`RESERVE_S`, or
        :data:`RESERVE_FRACTION` of it where that is longer."""
        return cls(at, max(RESERVE_S, RESERVE_FRACTION * (at - clock())), clock=clock)

    def fits(self, seconds: float, now: float | None = None) -> bool:
        """Whether work of about ``seconds`` (times :attr:`margin`), begun ``now`` (default: the clock), ends
        before ``at - reserve``."""
        now = self.clock() if now is None else now
        return now + seconds * self.margin <= self.at - self.reserve

    def watch(self) -> "RoundWatch":
        """A new run's stop predicate, its clock started now."""
        return RoundWatch(self)


class RoundWatch:
    """One run's ``stop`` (:meth:`~fedaug.engine.server.loop.Server.run`): called after each round, it says
    ``True`` once the longest round so far would not fit before the deadline (:meth:`Deadline.fits`).

    Args:
        deadline: the limit.

    Attributes:
        first: seconds from the watch's creation to the end of the run's first round here (start-up
            included; ``None`` until then): what the grid expects a cell to need before it can stop.
        longest: the longest round so far (the first included), seconds.
    """

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.last = deadline.clock()
        self.first: float | None = None
        self.longest = 0.0

    def __call__(self, round: int) -> bool:
        """Whether to stop after ``round`` (just recorded)."""
        now = self.deadline.clock()
        took, self.last = now - self.last, now
        self.first = took if self.first is None else self.first
        self.longest = max(self.longest, took)
        return not self.deadline.fits(self.longest, now)
