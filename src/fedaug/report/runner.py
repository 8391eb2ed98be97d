"""Running a comparison grid: one run directory per (setting, method, seed), resumable, in one
process, in parallel worker processes, or as tasks on a Ray cluster (:mod:`fedaug.report.ray_cells`).

Layout under the output directory::

    grid.json                                       the grid (labels, seeds, baseline, what it reproduces)
    invocations.jsonl                               one line per `fedaug compare` run on it: wall time, cells
    <setting>/<method>/seed<k>/<method>-<timestamp>/  the cell's run directory (docs/engine.md)
    <setting>/<method>/seed<k>/.lock                  held (pid inside) while a process works on the cell (on
                                                    Ray: the driver's, for the cells it has submitted)

A cell whose newest run directory holds ``summary.json`` is finished and is not run again; one
without it is resumed from its newest checkpoint (:func:`resume_experiment`). A finished or
started cell whose stored config differs from the grid's (``threads``, ``out_dir`` and ``name``
aside) is an error, so results of an edited grid are never mixed with stale ones. With ``reuse``,
a cell not started yet whose config equals that of a finished run found elsewhere (another grid's
cell, say) gets a copy of that run instead of training again (:func:`finished_runs`). A run's
recorded options (:mod:`fedaug.methods.recorded`, e.g. the FFA layers' ``kernel``) take part in
both comparisons: a cell that does not set one means its default, and a stored run that predates
its record means its legacy value, which equals no cell's (such a run is not reused, and a grid
cell holding one asks for its value to be written into its ``config.toml``). The two keys whose default
became ``"auto"`` count by what they do (:func:`~fedaug.engine.execution.compared`; docs/engine.md, "Which
execution runs"): ``train.cuda_graph`` as the execution it resolves to on this machine, ``data.on_device``
not at all, so that on a CPU a grid archived before counts as done.

Each cell runs with its config's ``threads`` (capped; a resumed cell keeps the count it started
with) and the previous thread count is restored after it; worker processes (``jobs > 1``) are
set up with :func:`~fedaug.core.runtime.configure_process`. A ``watch``
(:class:`~fedaug.report.progress.GridProgress`) hears each cell's start and rounds as they happen,
from worker processes through a queue (:func:`run_grid`).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedaug.config.load import flatten, parse_config, read_toml
from fedaug.config.schema import choice_text, with_legacy
from fedaug.core.errors import ConfigError, FedaugError, RunStopped
from fedaug.core.runtime import available_cores, configure_process, torch_threads
from fedaug.core.serialize import atomic_write_json
from fedaug.engine.records.progress import RoundUpdate
from fedaug.engine.records.rundir import CONFIG, SUMMARY, RunDir, stored_config
from fedaug.engine.fleet.inprocess import Trainer
from fedaug.engine.execution import compared
from fedaug.engine.run import resume_experiment, run_experiment
from fedaug.methods.recorded import fill_legacy, legacy_notes, pin
from fedaug.report.deadline import Deadline, RoundWatch, now
from fedaug.report.grid import GridSpec, slug

if TYPE_CHECKING:
    from fedaug.report.ray_cells import RayCells

GRID_FILE = "grid.json"
INVOCATIONS = "invocations.jsonl"
STALE_EMPTY_LOCK_S = 60.0
#: how long the grid waits for a worker process's last progress events of a finished cell
EVENTS_WAIT_S = 30.0

#: ``(cell label, "start" | "round" | "end", the round's update or None)``: what a cell reports while it runs
Report = Callable[[str, str, "RoundUpdate | None"], None]


class GridWatch(Protocol):
    """What :func:`run_grid` tells while cells run (:class:`fedaug.report.progress.GridProgress`): the plan
    before any cell starts (its cells, what runs them: ``--jobs N`` or ``--ray ADDRESS``, and how many at once:
    ``None`` on Ray until :meth:`connected` says how many its cluster holds), each cell's start and rounds."""

    def planned(self, cells: Sequence[Cell], scheduler: str, jobs: int | None) -> None: ...
    def connected(self, cluster: str, jobs: int) -> None: ...
    def started(self, label: str) -> None: ...
    def round_done(self, label: str, update: RoundUpdate) -> None: ...


class CellError(FedaugError):
    """Cells of a grid failed; the message names them and gives their errors. ``outcomes`` holds
    every cell's outcome of the invocation (failed ones included)."""

    def __init__(self, message: str, outcomes: Sequence[CellOutcome] = ()) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)


@dataclass(frozen=True)
class Cell:
    """One (setting, method, seed) of a grid and the config it runs with."""

    setting: str
    method: str
    seed: int
    dir: Path
    raw: dict[str, Any]
    reuse: Path | None = None
    grid: str = ""

    @property
    def label(self) -> str:
        return f"{self.setting} | {self.method} | seed {self.seed}"

    @property
    def tags(self) -> dict[str, str]:
        """The cell's tracking tags (``[log]``: each cell is its own MLflow run)."""
        return {"fedaug.grid": self.grid, "fedaug.setting": self.setting, "fedaug.method": self.method,
                "fedaug.seed": str(self.seed)}


@dataclass(frozen=True)
class CellOutcome:
    """What happened to a cell: ``status`` is ``"done before"``, ``"ran"``, ``"resumed"``,
    ``"reused"`` (a finished run with the same config was copied in), ``"busy"`` (another live
    process holds its lock), ``"failed"`` (``error`` says why), or, under a time limit (:func:`run_grid`'s
    ``deadline``), ``"stopped"`` (checkpointed after ``round`` of ``rounds``: the next invocation resumes it)
    or ``"not started"`` (in this invocation; ``round``: its run's newest checkpoint, if it has one).
    ``first_round_s``: under a time limit, the seconds from the cell's start to the end of its first round
    here (:attr:`~fedaug.report.deadline.RoundWatch.first`), if it trained one."""

    cell: Cell
    status: str
    run_dir: str | None
    seconds: float
    error: str = ""
    round: int | None = None
    rounds: int | None = None
    first_round_s: float | None = None

    @property
    def unfinished(self) -> bool:
        """Whether the time limit left the cell unfinished (``"stopped"`` or ``"not started"``)."""
        return self.status in ("stopped", "not started")

    def detail(self) -> str:
        """Where a stopped or not started cell is, in words (``" at round 4 of 10"``; else ``""``)."""
        if self.status == "stopped":
            return f" at round {self.round} of {self.rounds}"
        return f" (saved at round {self.round} of {self.rounds})" if self.status == "not started" and self.round else ""


def cell_dir(out: Path, setting: str, method: str, seed: int) -> Path:
    """The directory that holds a cell's run directory (directory names are :func:`slug` of the labels)."""
    return Path(out) / slug(setting) / slug(method) / f"seed{seed}"


def find_run(directory: Path) -> Path | None:
    """The newest run directory (one holding a config) in a cell's directory, if any."""
    runs = [p for p in Path(directory).iterdir() if (p / CONFIG).is_file()] if Path(directory).is_dir() else []
    return max(runs, key=lambda p: p.name) if runs else None


def plan(spec: GridSpec, out: Path, jobs: int = 1, cores: int | None = None,
         reuse: dict[str, Path] | None = None, local: bool = True) -> list[Cell]:
    """Every cell of ``spec``, seed-major (a partial grid still pairs methods on the same seeds),
    and the finished run in ``reuse`` (from :func:`finished_runs`) with the same config, if any.

    The cores are shared, never oversubscribed: ``jobs`` cells run at once, each with its config's
    ``workers`` processes (1: the cell's own process) of ``threads`` torch threads, so ``threads`` is
    capped at ``cores // (jobs x workers)`` and ``jobs x workers x threads <= cores`` (docs/engine.md,
    "Workers"). Cells that run elsewhere (``local=False``: on a Ray cluster, which reserves each cell's
    CPUs) keep their config's ``threads``.

    Raises:
        ConfigError: ``jobs`` is below 1 or above the available cores, or ``jobs x workers`` of a cell
            exceeds them.
    """
    cores = cores or available_cores()
    if local and not 1 <= jobs <= cores:
        raise ConfigError(f"--jobs must be between 1 and the {cores} available cores, got {jobs}")
    cells = []
    for seed in spec.seeds:
        for setting in spec.settings:
            for method in spec.methods:
                raw = spec.raw(setting, method, seed)
                directory = cell_dir(out, setting, method, seed)
                cfg = parse_config(raw)
                if local and jobs * cfg.workers > cores:
                    raise ConfigError(f"--jobs {jobs} x workers {cfg.workers} = {jobs * cfg.workers} processes "
                                      f"would share {cores} cores; lower --jobs, or workers "
                                      f"(--set workers={max(1, cores // jobs)})")
                threads = min(cfg.threads, max(1, cores // (jobs * cfg.workers))) if local else cfg.threads
                raw.update(name=slug(method), out_dir=str(directory), threads=threads)
                source = (reuse or {}).get(config_key(raw))
                if source is not None and source.resolve().is_relative_to(directory.resolve()):
                    source = None  # the cell's own run
                cells.append(Cell(setting, method, seed, directory, raw, source, spec.name))
    return cells


#: keys that may differ between a cell's stored config and the grid's: a resumed cell keeps the
#: thread count it started with, a grid directory may be moved, a reused run keeps its name, where a run
#: computes (worker processes, their devices, Ray actors and what they reserve) changes none of its numbers, and
#: where it is tracked ([log]) is not part of the experiment
IGNORED = ("threads", "out_dir", "name", "workers", "devices", "fleet", "ray", "log")


def _resolved(raw: dict[str, Any], stored: bool = False) -> dict[str, Any]:
    cfg = parse_config(with_legacy(raw) if stored else raw)
    cfg = fill_legacy(cfg) if stored else pin(cfg)
    return {**flatten({k: v for k, v in cfg.to_dict().items() if k not in IGNORED}), **compared(cfg)}


def config_mismatch(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Dotted keys whose resolved values differ between a run's stored config and a cell's
    (:data:`IGNORED` aside; recorded options and the execution keys resolved as :func:`config_key` does)."""
    a, b = _resolved(stored, stored=True), _resolved(wanted)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _execution_note(stored: dict[str, Any], wanted: dict[str, Any]) -> str:
    """Why the ``train.cuda_graph`` of a run's stored config and of a cell's differ, and how to take the run."""
    ran, want = (parse_config(raw).train.cuda_graph for raw in (with_legacy(stored), wanted))
    steps = {True: "captured", False: "eager"}
    return (f"; train.cuda_graph counts as the execution it resolves to on this machine: the run's "
            f"{choice_text(ran)} gives {steps[_resolved(stored, True)['train.cuda_graph']]} steps, the cell's "
            f"{choice_text(want)} {steps[_resolved(wanted)['train.cuda_graph']]} steps (--set "
            f"train.cuda_graph={choice_text(ran)} takes the run as it is)")


def config_key(raw: dict[str, Any], *, stored: bool = False) -> str:
    """A digest of the resolved config (:data:`IGNORED` aside): equal keys, equal experiments.

    Recorded options (:mod:`fedaug.methods.recorded`) are resolved first: a cell's config
    (``stored=False``) that does not set one takes its default; a run directory's stored config
    (``stored=True``) that lacks one predates its record and takes its legacy value, so that a
    run is never matched with a cell that asks for a path the run may not have taken. So do the
    keys whose default became ``"auto"`` (:func:`~fedaug.config.schema.with_legacy`), which then count as
    the execution they resolve to on this machine (:func:`~fedaug.engine.execution.compared`): on a CPU,
    ``train.cuda_graph = "auto"`` is the experiment of ``false``, and ``data.on_device`` is placement.
    """
    text = json.dumps(_resolved(raw, stored), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def finished_runs(root: Path) -> dict[str, Path]:
    """Every finished run directory under ``root`` (it holds ``summary.json`` and a config), by
    :func:`config_key`; where several share a key, the last by directory name (a fixed choice, so
    every grid reusing that key gets the same run). Unreadable configs are skipped."""
    found: dict[str, Path] = {}
    for summary in sorted(Path(root).rglob(SUMMARY)):
        run = summary.parent
        try:
            key = config_key(read_toml(run / CONFIG), stored=True)
        except (FedaugError, OSError, ValueError):
            continue
        if key not in found or run.name > found[key].name:
            found[key] = run
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim(lock: Path) -> bool:
    """Create ``lock`` holding this pid, unless a live process holds it; a dead holder's lock
    (or an empty one older than a minute) is taken over."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                text = lock.read_text().strip()
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                continue
            if text.isdigit() and _alive(int(text)) or not text and age < STALE_EMPTY_LOCK_S:
                return False
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def run_cell(cell: Cell, report: Report | None = None, deadline: Deadline | None = None) -> CellOutcome:
    """Run, resume or skip one cell (in this process); a user error becomes a ``"failed"`` outcome.

    Args:
        report: told ``"start"`` when the cell trains, ``"round"`` after each of its rounds, and
            ``"end"`` when this call returns, whatever happened.
        deadline: a time limit: the run stops at a round boundary where its next round would not fit
            (:meth:`~fedaug.report.deadline.Deadline.watch`; status ``"stopped"``).
    """
    def note(kind: str, update: RoundUpdate | None = None) -> None:
        if report is not None:
            report(cell.label, kind, update)

    def on_round(update: RoundUpdate) -> None:
        note("round", update)

    watch = deadline.watch() if deadline is not None else None
    try:
        outcome = _run_cell(cell, note, on_round, watch)
    finally:
        note("end")
    return replace(outcome, first_round_s=watch.first) if watch is not None else outcome


def _run_cell(cell: Cell, note: Callable[[str], None], on_round: Callable[[RoundUpdate], None],
              stop: RoundWatch | None) -> CellOutcome:
    """:func:`run_cell`'s work; ``note("start")`` before training, ``on_round`` after each round."""
    lock = cell.dir / ".lock"
    t0 = time.perf_counter()
    if not claim(lock):
        return CellOutcome(cell, "busy", None, 0.0)
    try:
        return settle(cell) or compute(cell, cell.dir, note, on_round, stop)
    except FedaugError as exc:
        return CellOutcome(cell, "failed", None, time.perf_counter() - t0, str(exc))
    finally:
        lock.unlink(missing_ok=True)


def settle(cell: Cell) -> CellOutcome | None:
    """The outcome of a cell that needs no training (its run is finished: ``"done before"``; a finished
    run with its config is copied in: ``"reused"``), else ``None`` (it trains: :func:`compute`).

    Raises:
        ConfigError: the cell's run was started with another config (naming the keys that differ).
    """
    existing = find_run(cell.dir)
    if existing is not None:
        stored = read_toml(existing / CONFIG)
        diff = config_mismatch(stored, cell.raw)
        if diff:
            notes = "".join(f"; {note}" for note in legacy_notes(parse_config(stored)))
            fix = "write the value it ran with into its config.toml, or delete" if notes else "delete"
            if "train.cuda_graph" in diff:
                notes += _execution_note(stored, cell.raw)
            raise ConfigError(
                f"'{existing}' was run with a different config ({', '.join(diff)} differ{notes}); "
                f"{fix} that directory to rerun the cell, or give another --out")
        return CellOutcome(cell, "done before", str(existing), 0.0) if (existing / SUMMARY).is_file() else None
    if cell.reuse is not None:
        t0 = time.perf_counter()
        copy = cell.dir / cell.reuse.name
        shutil.copytree(cell.reuse, copy.with_name(copy.name + ".partial"))
        os.replace(copy.with_name(copy.name + ".partial"), copy)  # a half-copied run is never seen
        return CellOutcome(cell, "reused", str(copy), time.perf_counter() - t0)
    return None


def compute(cell: Cell, where: Path, note: Callable[[str], None],
            on_round: Callable[[RoundUpdate], None], stop: Callable[[int], bool] | None = None,
            trainer: Trainer | None = None) -> CellOutcome:
    """Train a cell that :func:`settle` left: resume its run found in ``where`` (at the thread count it
    started with), or run it anew there. ``where`` is the cell's directory, or (a Ray node that does not
    see it) a directory of the node's own whose run directory goes to the cell's afterwards; the run's
    ``config.toml`` names the cell's directory either way. ``stop`` is the run's
    (:meth:`~fedaug.engine.server.loop.Server.run`): where it says so, the outcome is ``"stopped"``. ``trainer``
    (a pack's slot, :mod:`fedaug.report.packing`) trains its clients with other cells'; the pack has set the
    thread count.

    Raises:
        FedaugError: the run failed.
    """
    t0 = time.perf_counter()
    existing = find_run(where)
    note("start")
    try:
        if existing is not None:
            threads = stored_config(existing).threads  # the thread count it started with
            with torch_threads(threads) if trainer is None else nullcontext():
                _, run = resume_experiment(str(existing), quiet=True, tags=cell.tags, on_round=on_round, stop=stop,
                                           trainer=trainer)
            return CellOutcome(cell, "resumed", str(run.path), time.perf_counter() - t0)
        with torch_threads(cell.raw["threads"]) if trainer is None else nullcontext():
            _, made = run_experiment(parse_config(cell.raw), quiet=True, tags=cell.tags, on_round=on_round,
                                     out_dir=None if where == cell.dir else str(where), stop=stop, trainer=trainer)
    except RunStopped as exc:
        return CellOutcome(cell, "stopped", getattr(exc, "run_dir", None), time.perf_counter() - t0,
                           round=exc.round, rounds=exc.rounds)
    return CellOutcome(cell, "ran", str(made.path) if made else None, time.perf_counter() - t0)


def not_started(cell: Cell) -> CellOutcome:
    """The outcome of a cell that a time limit kept from starting: ``"done before"`` where its run is
    finished, else ``"not started"`` (with its run's newest checkpoint, where it has one)."""
    run = find_run(cell.dir)
    if run is not None and (run / SUMMARY).is_file():
        return CellOutcome(cell, "done before", str(run), 0.0)
    saved = RunDir(run).checkpoints() if run is not None else []
    return CellOutcome(cell, "not started", str(run) if run else None, 0.0, round=saved[-1][0] if saved else None,
                       rounds=parse_config(cell.raw).train.rounds)


#: what one worker of a grid runs at once: a cell, or a pack of cells trained as one program
#: (:func:`fedaug.report.packing.run_pack`)
Unit = Cell | tuple[Cell, ...]


def cells_of(unit: Unit) -> tuple[Cell, ...]:
    """The cells of a unit."""
    return (unit,) if isinstance(unit, Cell) else unit


def run_unit(unit: Unit, report: Report | None = None, deadline: Deadline | None = None) -> list[CellOutcome]:
    """:func:`run_cell` of a cell, :func:`~fedaug.report.packing.run_pack` of a pack: each cell's outcome."""
    if isinstance(unit, Cell):
        return [run_cell(unit, report, deadline)]
    from fedaug.report.packing import run_pack

    return run_pack(unit, report, deadline)


#: a pool worker process's queue to the grid's process (set by :func:`_start_pool_worker`; None: no watch)
_EVENTS: Any = None


def _start_pool_worker(events: Any) -> None:
    """A ``--jobs`` worker process's initializer: process settings, and where its cells report."""
    global _EVENTS
    configure_process()
    _EVENTS = events


def _run_pooled(unit: Unit, deadline: Deadline | None) -> list[CellOutcome]:
    """:func:`run_unit` in a pool worker, its reports sent to the grid's process."""
    events = _EVENTS
    return run_unit(unit, None if events is None else lambda *event: events.put(event), deadline)


def deliver(events: Any, watch: GridWatch, ended: set[str], until_end_of: str | None = None) -> None:
    """Pass the queued cell reports to ``watch``, adding the labels of cells that reported their ``"end"``
    to ``ended``; with ``until_end_of``, wait (at most :data:`EVENTS_WAIT_S`) until that cell's is in,
    so that its rounds are shown before its outcome."""
    deadline = time.monotonic() + EVENTS_WAIT_S
    while until_end_of is None or until_end_of not in ended:
        try:
            if until_end_of is None:
                label, kind, update = events.get_nowait()
            else:
                label, kind, update = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return
        _tell(watch, label, kind, update)
        if kind == "end":
            ended.add(label)


def _tell(watch: GridWatch, label: str, kind: str, update: RoundUpdate | None) -> None:
    """Pass one cell report (:data:`Report`) to ``watch``."""
    if kind == "start":
        watch.started(label)
    elif kind == "round" and update is not None:
        watch.round_done(label, update)


def write_grid_file(spec: GridSpec, out: Path) -> None:
    """Record the grid in ``out/grid.json`` (read back by tables and reports)."""
    atomic_write_json(Path(out) / GRID_FILE, spec.meta())


def log_invocation(out: Path, command: str, jobs: int, wall_s: float, outcomes: Sequence[CellOutcome],
                   failed: bool, time_limit: str | None = None) -> None:
    """Append one line to ``out/invocations.jsonl``: when, the command, ``jobs``, the wall time and
    how many cells ended in each status (a results page sums the wall times); under a time limit, the
    limit as given and the cells it stopped (``{"cell", "round", "rounds"}`` each)."""
    cells = dict(sorted(Counter(o.status for o in outcomes).items()))
    record = {"finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
              "jobs": jobs, "wall_s": round(wall_s, 1), "cells": cells, "failed": failed}
    if time_limit is not None:
        record.update(time_limit=time_limit, stopped=[{"cell": o.cell.label, "round": o.round, "rounds": o.rounds}
                                                      for o in outcomes if o.status == "stopped"])
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / INVOCATIONS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def run_grid(spec: GridSpec, out: Path, jobs: int = 1,
             on_done: Callable[[int, int, CellOutcome], None] | None = None,
             reuse: Path | None = None, keep_going: bool = False,
             watch: GridWatch | None = None, ray: RayCells | None = None,
             deadline: float | None = None, clock: Callable[[], float] = now, pack: bool = False,
             pack_size: int | None = None, on_plan: Callable[[list[str]], None] | None = None) -> list[CellOutcome]:
    """Run every cell not yet finished, ``jobs`` at a time (worker processes when ``jobs > 1``), or as
    tasks on a Ray cluster (``ray``: as many at once as its resources allow, :mod:`fedaug.report.ray_cells`).

    Stops scheduling at the first failed cell (cells already running finish) and raises; with
    ``keep_going`` runs every other cell first, then raises naming all that failed.

    Args:
        spec: the grid.
        out: the output directory (created).
        jobs: parallel worker processes; each sets its torch threads to ``cores // jobs`` at most.
        on_done: called as ``on_done(k, total, outcome)`` after each cell (k counts from 1).
        reuse: a directory searched for finished runs (:func:`finished_runs`); a cell not started
            yet whose config equals one of them gets a copy of it instead of a new run.
        keep_going: do not stop at a failed cell (for long unattended grids).
        watch: told the plan, and each cell's start and rounds as they happen (from worker processes
            or Ray tasks through a queue; a cell's rounds always before its ``on_done``).
        ray: the cluster and how cells' files reach ``out`` (:class:`~fedaug.report.ray_cells.RayCells`).
        deadline: a time limit, in seconds since the epoch (``clock``'s): each running cell stops at a round
            boundary, checkpointed, where its next round would pass it (``"stopped"``), and a cell is started
            only where its start-up and first round fit (else ``"not started"``); a margin is kept for the
            tables (:meth:`~fedaug.report.deadline.Deadline.until`). The same call continues the grid.
        clock: the time now, for ``deadline`` (:func:`~fedaug.report.deadline.now`; picklable, for worker
            processes).
        pack: train the cells that share a step's shape as one program each (:mod:`fedaug.report.packing`; a
            pack is one unit of work, in this process or one worker process); ``on_plan`` is told the packs
            and, for each cell that trains alone, why (:meth:`~fedaug.report.packing.PackPlan.describe`).
        pack_size: the most cells a pack holds (``None``: every cell of one step's shape).

    Returns:
        Every cell's outcome, in completion order.

    Raises:
        ConfigError: ``jobs`` does not fit the cores, or is given with ``ray``, or ``deadline`` is (before
            anything runs).
        CellError: a cell failed; the message names it and gives its error.
    """
    if ray is not None and jobs != 1:
        raise ConfigError(f"--jobs {jobs} runs cells in processes of this machine; with --ray the cluster runs as "
                          "many cells at once as its resources allow: drop --jobs")
    if ray is not None and pack:
        raise ConfigError("--pack trains cells of one step's shape as one program in this machine's processes; "
                          "with --ray the cluster runs each cell as a task: drop --pack or --ray")
    if ray is not None and deadline is not None:
        raise ConfigError("--time-limit stops cells by this machine's clock, in this machine's processes; with "
                          "--ray the cluster runs them: drop --time-limit (give the cluster's job its own limit), "
                          "or run the grid here with --jobs N")
    cells = plan(spec, out, jobs, reuse=finished_runs(reuse) if reuse is not None else None, local=ray is None)
    write_grid_file(spec, out)
    outcomes: list[CellOutcome] = []

    def record(outcome: CellOutcome) -> None:
        outcomes.append(outcome)
        if on_done is not None:
            on_done(len(outcomes), len(cells), outcome)

    if ray is not None:
        from fedaug.report.ray_cells import run_on_ray

        run_on_ray(cells, Path(out), ray, record, keep_going, watch)
    else:
        limit = Deadline.until(deadline, clock) if deadline is not None else None
        units: list[Unit] = list(cells)
        if pack:
            from fedaug.report.packing import pack_units

            units, packed = pack_units(cells, pack_size)
            if on_plan is not None:
                on_plan(packed.describe())
        _run_here(cells, units, jobs, record, keep_going, watch, Starts(limit))
    failed = [o for o in outcomes if o.status == "failed"]
    if len(failed) == 1:
        raise CellError(f"cell {failed[0].cell.label} failed: {failed[0].error}", outcomes)
    if failed:
        raise CellError(f"{len(failed)} cells failed: " + "; ".join(f"{o.cell.label}: {o.error}" for o in failed),
                        outcomes)
    return outcomes


class Starts:
    """Whether a grid starts its next cell: not once a cell failed (unless ``keep_going``), nor, under a time
    limit, once a cell stopped at it or where a cell's start-up and first round (the longest seen so far)
    would not fit (:meth:`~fedaug.report.deadline.Deadline.fits`).

    Args:
        deadline: the time limit, if any.
    """

    def __init__(self, deadline: Deadline | None) -> None:
        self.deadline = deadline
        self.first_round_s = 0.0
        self.failed = self.stopped = False

    def note(self, outcome: CellOutcome) -> None:
        """Learn from a cell's outcome."""
        self.failed |= outcome.status == "failed"
        self.stopped |= outcome.status == "stopped"
        self.first_round_s = max(self.first_round_s, outcome.first_round_s or 0.0)

    def open(self, keep_going: bool) -> bool:
        """Whether to start the next cell (a failure's stop aside, :meth:`timed_out` says why not)."""
        return not (self.failed and not keep_going) and not self.timed_out()

    def timed_out(self) -> bool:
        """Whether the time limit keeps the next cell from starting."""
        return self.deadline is not None and (self.stopped or not self.deadline.fits(self.first_round_s))


def _run_here(cells: list[Cell], units: list[Unit], jobs: int, record: Callable[[CellOutcome], None],
              keep_going: bool, watch: GridWatch | None, starts: Starts) -> None:
    """:func:`run_grid`'s cells on this machine, by units (cells and packs): in this process, or ``jobs`` worker
    processes; the cells that a time limit keeps from starting are told as :func:`not_started`."""
    def keep(outcome: CellOutcome) -> None:
        starts.note(outcome)
        record(outcome)

    if watch is not None:
        packs = sum(not isinstance(u, Cell) for u in units)
        watch.planned(cells, f"--jobs {jobs}" + (f" --pack ({packs} pack{'s' if packs > 1 else ''})" if packs else ""),
                      jobs)
    todo = deque(units)
    if jobs == 1:
        report = None if watch is None else partial(_tell, watch)
        while todo and starts.open(keep_going):
            for outcome in run_unit(todo.popleft(), report, starts.deadline):
                keep(outcome)
    else:
        _run_pool(todo, jobs, keep, keep_going, watch, starts)
    if starts.timed_out() and not (starts.failed and not keep_going):
        for unit in todo:
            for cell in cells_of(unit):
                keep(not_started(cell))


def _run_pool(todo: deque[Unit], jobs: int, keep: Callable[[CellOutcome], None], keep_going: bool,
              watch: GridWatch | None, starts: Starts) -> None:
    """Units (cells, packs) from ``todo`` in ``jobs`` worker processes, each submitted as a process frees up
    while ``starts`` allows (those left stay in ``todo``)."""
    context = multiprocessing.get_context("spawn")
    events, ended = (context.Queue() if watch is not None else None), set[str]()
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_pool_worker,
                             initargs=(events,)) as pool:  # the pool's own processes
        running: set[Future[list[CellOutcome]]] = set()
        while True:
            while todo and len(running) < jobs and starts.open(keep_going):
                running.add(pool.submit(_run_pooled, todo.popleft(), starts.deadline))
            if not running:
                return
            done, running = wait(running, timeout=None if watch is None else 0.2, return_when=FIRST_COMPLETED)
            if watch is not None:
                deliver(events, watch, ended)
            for future in done:
                for outcome in future.result():
                    if watch is not None:
                        deliver(events, watch, ended, until_end_of=outcome.cell.label)
                    keep(outcome)
