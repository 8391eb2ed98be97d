"""``fedaug compare``'s live progress: cells done, running and left, each running cell's round and ETA,
and the grid's ETA, with ``--jobs`` (cells in worker processes) and ``workers`` alike.

:func:`~fedaug.report.runner.run_grid` feeds a :class:`GridProgress` (its ``watch`` and ``on_done``):
the plan (one line at once: the grid, its cells, their devices and what runs them, ``--jobs N`` or ``--ray
ADDRESS``; on Ray a second line names the cluster once it is reached), a cell's start, each of its rounds
(:class:`~fedaug.engine.records.progress.RoundUpdate`) and its outcome. In a terminal the display redraws in
place (rich); in a pipe or a CI log a plain line is printed at most every
:data:`~fedaug.engine.records.progress.LINE_INTERVAL_S` seconds, and one line per finished cell. Once the
running cell has trained two rounds (a cell's first round carries one-off costs), one line says about
how long the whole grid will take on this machine or cluster (:func:`grid_eta`, from the rounds measured so far).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn
from rich.progress import Progress as RichProgress

from fedaug.config.load import parse_config
from fedaug.core.device import resolve_device
from fedaug.engine.records.progress import REFRESH_PER_S, LineThrottle, LiveBar, RoundUpdate, clock, console, plural
from fedaug.report.runner import Cell, CellOutcome


def grid_eta(running: Sequence[float], left: int, cell_s: float | None, jobs: int) -> float | None:
    """Seconds until a grid's last cell ends: each running cell ends after its own ETA, and each of the
    ``left`` cells not started takes ``cell_s`` on the first of the ``jobs`` slots that frees up.

    Args:
        running: the ETA (s) of each running cell (at most ``jobs`` of them).
        left: cells not started yet.
        cell_s: the seconds one cell takes (``None``: not known yet).
        jobs: cells run at once.

    Returns:
        The seconds, or ``None`` when cells are left and ``cell_s`` is not known.

    >>> grid_eta([10.0, 30.0], left=2, cell_s=100.0, jobs=2)
    130.0
    >>> grid_eta([], left=3, cell_s=10.0, jobs=2)
    20.0
    """
    if left and cell_s is None:
        return None
    slots = sorted([*running, *[0.0] * max(0, jobs - len(running))])
    for _ in range(left):
        heapq.heapreplace(slots, slots[0] + (cell_s or 0.0))
    return max(slots, default=0.0)


def about(seconds: float) -> str:
    """``"about 5 min 20 s"``: seconds under a minute, then minutes and tens of seconds, then hours and minutes."""
    if seconds < 60:
        return f"about {max(1, round(seconds))} s"
    if seconds < 3600:
        m, s = divmod(int(round(seconds / 10) * 10), 60)
        return f"about {m} min {s} s" if s else f"about {m} min"
    h, m = divmod(int(round(seconds / 60)), 60)
    return f"about {h} h {m} min"


def plan_text(name: str, cells: Sequence[Cell], scheduler: str) -> str:
    """A grid's first progress line: its cells (settings x methods x seeds), their devices (``auto`` with what
    it means on this machine) and what runs them.

    >>> from pathlib import Path
    >>> cells = [Cell("default", m, 0, Path(m), {"device": "cpu"}) for m in ("A", "B")]
    >>> plan_text("tiny", cells, "--jobs 2")
    'compare tiny: 2 cells (1 setting x 2 methods x 1 seed), device cpu, --jobs 2'
    """
    shape = " x ".join(plural(len({getattr(c, key) for c in cells}), key) for key in ("setting", "method", "seed"))
    devices = sorted({parse_config(c.raw).device for c in cells})
    shown = ", ".join(f"auto ({resolve_device('auto')} here)" if d == "auto" else d for d in devices)
    return f"compare {name}: {plural(len(cells), 'cell')} ({shape}), device {shown}, {scheduler}"


@dataclass
class _Running:
    started: float
    update: RoundUpdate | None = None
    task: TaskID | None = None


def _measured(cell: _Running) -> bool:
    """Whether a running cell's ETA leaves its first round's one-off costs aside (two rounds, or all)."""
    u = cell.update
    return u is not None and (u.round - u.start >= 2 or u.round == u.total)


class GridProgress(LiveBar):
    """The progress of one ``fedaug compare`` invocation; a context manager (draws and clears the terminal display).

    Args:
        name: the grid's name (the display's first line).
        stream: where to show it (default stderr).
        now: the clock (tests pass their own).
    """

    def __init__(self, name: str, stream: TextIO | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.name, self.now = name, now
        self.console = console(stream)
        self.throttle = LineThrottle(now=now)
        self.running: dict[str, _Running] = {}
        self.total = self.done = 0
        self.jobs, self.scheduler, self.place = 1, "--jobs 1", "this machine"
        self.durations: list[float] = []
        self.announced = False
        self.t0 = now()
        self.bar: RichProgress | None = None

    def __enter__(self) -> "GridProgress":
        if self.console.is_interactive:
            self.bar = RichProgress(TextColumn("{task.description}", markup=False), BarColumn(bar_width=24),
                                    MofNCompleteColumn(), TextColumn("eta {task.fields[eta]}"),
                                    TextColumn("{task.fields[metric]}", markup=False),
                                    console=self.console, refresh_per_second=REFRESH_PER_S)
            self.grid_task = self.bar.add_task(self._summary(), total=None, eta="--:--", metric="")
            self.bar.start()
        return self

    # --- what run_grid reports ----------------------------------------------------------------
    def planned(self, cells: Sequence[Cell], scheduler: str, jobs: int | None) -> None:
        """The invocation's cells (finished ones included: they end at once), what runs them (``--jobs N``,
        ``--ray ADDRESS``) and how many run at once (``None``: known once the cluster is reached,
        :meth:`connected`); one line says so at once (:func:`plan_text`)."""
        self.total, self.scheduler, self.t0 = len(cells), scheduler, self.now()
        self.jobs = self.jobs if jobs is None else jobs
        self._print(plan_text(self.name, cells, scheduler))
        self._show(line=False)

    def connected(self, cluster: str, jobs: int) -> None:
        """The Ray cluster reached (``cluster``: :func:`~fedaug.core.cluster.cluster_text`) and how many cells
        it runs at once; one line (and the estimate speaks of the cluster, not this machine)."""
        self.jobs, self.place = jobs, "the cluster"
        self._print(f"compare {self.name}: {self.scheduler}: {cluster}, {plural(jobs, 'cell')} at once")

    def started(self, label: str) -> None:
        """The cell ``label`` starts training (or resuming)."""
        self.running[label] = cell = _Running(self.now())
        if self.bar is not None:
            cell.task = self.bar.add_task(label, total=None, eta="--:--", metric="starting")
        self._show(line=False)

    def round_done(self, label: str, update: RoundUpdate) -> None:
        """The cell ``label`` finished a round."""
        cell = self.running.get(label)
        if cell is None:  # the cell's outcome came first
            return
        cell.update = update
        if self.bar is not None and cell.task is not None:
            self.bar.update(cell.task, total=update.total, completed=update.round, eta=clock(update.eta),
                            metric=update.metric)
        eta = self.eta()
        if not self.announced and eta is not None and all(map(_measured, self.running.values())):
            self.announced = True
            busy = self.total - self.done
            cells = f"{busy} cells left take" if busy != 1 else "1 cell left takes"
            self._print(f"fedaug compare: the {cells} {about(eta)} on {self.place} "
                        f"(estimated from the rounds so far; {self.scheduler})")
        self._show()

    def finished(self, k: int, total: int, outcome: CellOutcome) -> None:
        """A cell's outcome (``run_grid``'s ``on_done``): one line each."""
        cell = self.running.pop(outcome.cell.label, None)
        if cell is not None and cell.task is not None and self.bar is not None:
            self.bar.remove_task(cell.task)
        self.done = k
        if outcome.status in ("ran", "resumed"):
            self.durations.append(outcome.seconds)
        where = f" -> {outcome.run_dir}" if outcome.run_dir else ""
        took = f" in {outcome.seconds:.1f} s" if outcome.status in ("ran", "resumed", "stopped") else ""
        self._print(f"[{k}/{total}] {outcome.cell.label}: {outcome.status}{outcome.detail()}{took}{where}")
        self._show(final=k == total)

    # --- estimates and drawing ----------------------------------------------------------------
    def cell_seconds(self) -> float | None:
        """What one cell takes here: the mean of the cells this invocation trained, else the running
        cells' projections (time since their start plus their ETA), else ``None``."""
        if self.durations:
            return sum(self.durations) / len(self.durations)
        now = self.now()
        projected = [now - c.started + c.update.eta for c in self.running.values() if c.update is not None]
        return sum(projected) / len(projected) if projected else None

    def eta(self) -> float | None:
        """Seconds until the grid's last cell ends (:func:`grid_eta`); ``None`` while nothing is measured."""
        cell_s, now = self.cell_seconds(), self.now()
        if cell_s is None:
            return None if self.total - self.done else 0.0
        running = [c.update.eta if c.update is not None else max(0.0, cell_s - (now - c.started))
                   for c in self.running.values()]
        return grid_eta(running, self.total - self.done - len(self.running), cell_s, self.jobs)

    def _summary(self) -> str:
        left = self.total - self.done - len(self.running)
        return f"compare {self.name}: {self.done} done, {len(self.running)} running, {left} left"

    def _show(self, final: bool = False, line: bool = True) -> None:
        """Redraw the terminal display; in a pipe, print the grid's line if ``line`` and the throttle lets it."""
        eta = self.eta()
        text = "--:--" if eta is None else clock(eta)
        if self.bar is not None:
            self.bar.update(self.grid_task, description=self._summary(), total=self.total or None,
                            completed=self.done, eta=text, refresh=True)
        elif line and self.throttle.due(final=final):
            cells = "".join(f"  [{label}: " + (f"round {c.update.round}/{c.update.total} eta {clock(c.update.eta)}]"
                                               if c.update is not None else "starting]")
                            for label, c in self.running.items())
            self._print(f"{self._summary()}  elapsed {clock(self.now() - self.t0)}  eta {text}{cells}")
