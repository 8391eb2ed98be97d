"""Live progress of a run: the round, elapsed time, ETA and the latest metric, drawn with rich.

Before anything loads, one line says what is about to run and where (:func:`announce`). In a
terminal (rich's ``Console.is_interactive``) a bar then redraws in place; in a pipe or a CI log a plain
line is printed for the first round, then at most every :data:`LINE_INTERVAL_S` seconds, and for the
last round; ``quiet`` prints nothing. rich is a dependency of fedaug (already one of Flower's
and Typer's); nothing here changes what a run computes. A comparison grid's display
(:mod:`fedaug.report.progress`) reuses :class:`RoundUpdate`, :class:`LineThrottle` and :func:`clock`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

#: the shortest time between two plain progress lines (pipes, CI logs)
LINE_INTERVAL_S = 5.0
#: how often a terminal display redraws by itself (the elapsed clock); each round redraws it at once
REFRESH_PER_S = 2.0


def clock(seconds: float) -> str:
    """``75`` -> ``"01:15"``, ``3725`` -> ``"1:02:05"``."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def plural(n: int, noun: str) -> str:
    """``plural(1, "thread")`` -> ``"1 thread"``, ``plural(2, "thread")`` -> ``"2 threads"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class RoundUpdate:
    """Where a run stands after one of its rounds.

    Attributes:
        round: the round just finished (1-based).
        total: the run's rounds.
        start: the last round done before this process took the run over (0; a resumed run's checkpoint).
        elapsed: seconds since this process started its first round.
        metric: the latest metric, as text (``"train loss 0.4321  mean test acc 0.8100"``).
        first: seconds this process's first round took (it carries one-off costs: the first
            evaluation, allocations).
    """

    round: int
    total: int
    start: int
    elapsed: float
    metric: str
    first: float

    @property
    def eta(self) -> float:
        """Seconds left at this process's mean time per round, its first round left out once there is a
        second: ``(elapsed - first) / (done - 1) * (total - round)`` (``elapsed / done * ...`` after one).

        >>> RoundUpdate(3, 10, 0, elapsed=14.0, metric="", first=6.0).eta
        28.0
        """
        done = self.round - self.start
        if done <= 0:
            return 0.0
        per_round = (self.elapsed - self.first) / (done - 1) if done > 1 else self.elapsed
        return per_round * (self.total - self.round)

    def line(self) -> str:
        """The plain progress line: ``round  3/20  elapsed 00:45  eta 04:15  <metric>``."""
        return (f"round {self.round:>{len(str(self.total))}}/{self.total}  elapsed {clock(self.elapsed)}  "
                f"eta {clock(self.eta)}  {self.metric}")


class LineThrottle:
    """Lets a plain line through the first time, then at most every ``interval`` seconds, and always when
    ``final``.

    >>> t = LineThrottle(5.0, now=iter([0.0, 1.0, 6.0, 7.0]).__next__)
    >>> [t.due(), t.due(), t.due(), t.due(final=True)]
    [True, False, True, True]
    """

    def __init__(self, interval: float = LINE_INTERVAL_S, now: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.now = interval, now
        self.last: float | None = None

    def due(self, final: bool = False) -> bool:
        t = self.now()
        if final or self.last is None or t - self.last >= self.interval:
            self.last = t
            return True
        return False


def console(stream: TextIO | None = None) -> Console:
    """A rich console on ``stream`` (default: stderr, so that stdout stays the results')."""
    return Console(file=stream if stream is not None else sys.stderr)


def announce(line: str, quiet: bool = False, stream: TextIO | None = None) -> None:
    """Print ``line`` at once on ``stream`` (default stderr; nothing with ``quiet``): what a run is about to do,
    before its data loads and its first round trains, so that a pipe hears from it at once."""
    if not quiet:
        out = console(stream).file
        out.write(line + "\n")
        out.flush()


class LiveBar:
    """A context whose rich bar (``bar``, set by the subclass's ``__enter__`` on an interactive console, else
    ``None``) stops when the context closes, however it closes; lines go above the bar, or to ``console``'s
    stream as they are."""

    bar: RichProgress | None = None
    console: Console

    def _print(self, line: str) -> None:
        """Print ``line`` at once: above the bar while it is drawn, else as a plain line."""
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False)
        else:
            self.console.file.write(line + "\n")
            self.console.file.flush()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class Progress(LiveBar):
    """A run's progress display, fed by the server after every round (:meth:`update`); a context
    manager, which draws and clears the terminal display.

    Args:
        total: number of rounds of the whole run.
        start: the last round already done (resumed runs).
        quiet: show nothing (``on_update`` is still called).
        stream: where to show it (default stderr).
        on_update: also called with each round's :class:`RoundUpdate` (e.g. a comparison grid's display).
        now: the clock (tests pass their own).
    """

    def __init__(self, total: int, start: int = 0, quiet: bool = False, stream: TextIO | None = None,
                 on_update: Callable[[RoundUpdate], None] | None = None,
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.total, self.start, self.quiet, self.on_update, self.now = total, start, quiet, on_update, now
        self.console = console(stream)
        self.throttle = LineThrottle(now=now)
        self.bar: RichProgress | None = None
        self.t0 = now()
        self.first: float | None = None

    def __enter__(self) -> "Progress":
        if not self.quiet and self.console.is_interactive:
            self.bar = RichProgress(TextColumn("round"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    TextColumn("eta {task.fields[eta]}"), TextColumn("{task.fields[metric]}"),
                                    console=self.console, refresh_per_second=REFRESH_PER_S)
            self.task = self.bar.add_task("round", total=self.total, completed=self.start, eta="--:--", metric="")
            self.bar.start()
        self.t0 = self.now()
        return self

    def update(self, round: int, metric: str) -> None:
        """Show that ``round`` has finished, with its ``metric`` text."""
        elapsed = self.now() - self.t0
        self.first = elapsed if self.first is None else self.first
        update = RoundUpdate(round, self.total, self.start, elapsed, metric, self.first)
        if self.on_update is not None:
            self.on_update(update)
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=round, eta=clock(update.eta), metric=metric, refresh=True)
        elif self.throttle.due(final=round == self.total):
            self._print(update.line())
