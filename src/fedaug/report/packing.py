"""Which cells of a grid train as one pack (``fedaug compare --pack``, issue 62), and why the others do not.

Cells pack when their clients' steps have one shape: the same model and options, the same components taking part
in the step's loss and update (:func:`~fedaug.engine.client.step.in_step`: FedProx's proximal term, FFA's layers,
FLea's split forward, SCAFFOLD's correction; with equal options, apart from a component's
:attr:`~fedaug.methods.component.Component.pack_free` ones), the same device, precision, determinism, thread count,
plug-in imports and execution (captured or eager steps: what ``train.cuda_graph`` resolves to,
:func:`~fedaug.engine.execution.captures`), each on one worker in the grid's process. Everything else may differ
between the cells of a pack: the server rule where it only sends and receives weights (FedAvg, FedAvgM, FedBN,
FedAdam and the robust rules pack together), input-level augmentations made per client before the step (FedRDN),
the seed (and so the data's draws, the initial weights and every random stream), the data and its options, the
rounds, the local training schedule (learning rate and its schedule, weight decay, batch size, local epochs or
steps; clients whose batch schedules or optimisers differ train in separate groups of the pack), the evaluation,
the trust and attack settings, checkpoints and tracking. A method whose client hooks have no step form
(:func:`~fedaug.engine.client.step.step_blocker`) or a model with dropout cannot pack (the reason is given), nor
can a cell whose key no other cell shares.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from fedaug.config.load import parse_config
from fedaug.config.schema import RunConfig
from fedaug.core.errors import FedaugError
from fedaug.core.runtime import torch_threads
from fedaug.engine.client.step import in_step, step_blockers
from fedaug.engine.execution import captures, step_parts
from fedaug.engine.fleet.packed import Pack, PackSlot
from fedaug.engine.records.progress import RoundUpdate
from fedaug.engine.records.rundir import SUMMARY, stored_config
from fedaug.methods.recorded import pin
from fedaug.report.deadline import Deadline, RoundWatch
from fedaug.report.runner import Cell, CellOutcome, Report, Unit, claim, compute, find_run, settle

#: the configuration every cell of a pack shares (beside the method's options that are not free)
SHARED = ("imports", "device", "precision", "deterministic", "threads")


@dataclass(frozen=True)
class PackPlan:
    """A grid's cells to train, in packs of at least two and alone (each with the reason).

    Args:
        packs: the packs, each its cells in the grid's order.
        alone: the cells that train alone, each with why it does not pack.
    """

    packs: list[list[Cell]]
    alone: list[tuple[Cell, str]]

    def describe(self) -> list[str]:
        """One line per pack (its cells) and one per cell that trains alone (why)."""
        lines = [f"pack {k + 1} ({len(p)} cells): " + "; ".join(c.label for c in p) for k, p in enumerate(self.packs)]
        return lines + [f"not packed: {c.label}: {why}" for c, why in self.alone]


def step_key(cfg: RunConfig) -> tuple[str, str]:
    """``(key, "")``: the key that cells of one pack share (module docstring), or ``("", why)`` where ``cfg``'s
    run cannot train in a pack."""
    if cfg.workers > 1:
        return "", f"it trains on {cfg.workers} worker processes (workers = {cfg.workers}; a pack needs workers = 1)"
    if cfg.fleet != "local":
        return "", f"its clients train on Ray actors (fleet = '{cfg.fleet}'; a pack needs fleet = 'local')"
    cfg = pin(cfg)
    try:
        recipe, model = step_parts(cfg)
    except FedaugError as exc:
        return "", f"its method or model cannot be built ({exc})"
    why = step_blockers(recipe, model)
    if why:
        return "", "its clients cannot train grouped: " + "; ".join(why)
    step = [[type(c).__module__, type(c).__qualname__, {k: v for k, v in cfg.method.options.get(c.name, {}).items()
                                                         if k not in c.pack_free}]
            for c in recipe.components if in_step(c)]
    key = {"model": [cfg.model.name, cfg.model.options], "step": step, "captured": captures(cfg, (recipe, model)),
           **{k: getattr(cfg, k) for k in SHARED}}
    return json.dumps(key, sort_keys=True, default=repr), ""


def plan_packs(cells: Sequence[tuple[Cell, RunConfig]], size: int | None = None) -> PackPlan:
    """The packs of ``cells`` (each with the config it trains with: a resumed cell's stored one): cells of one
    :func:`step_key`, in the given order, cut into packs of at most ``size`` (``None``: no bound); a cell whose
    key no other cell shares (or the last of a cut that leaves it alone) trains alone.

    Raises:
        ValueError: ``size`` below 2.
    """
    if size is not None and size < 2:
        raise ValueError(f"a pack holds at least 2 cells, got a pack size of {size}")
    by_key: dict[str, list[Cell]] = {}
    alone: list[tuple[Cell, str]] = []
    for cell, cfg in cells:
        key, why = step_key(cfg)
        if key:
            by_key.setdefault(key, []).append(cell)
        else:
            alone.append((cell, why))
    packs: list[list[Cell]] = []
    for members in by_key.values():
        cut = size or len(members)
        for part in (members[i:i + cut] for i in range(0, len(members), cut)):
            if len(part) > 1:
                packs.append(part)
            else:
                alone.append((part[0], "no other cell left to train with it" if len(members) > 1 else
                              "no other cell of the grid has its step's shape (model, method, precision, threads)"))
    return PackPlan(packs, alone)


def training_config(cell: Cell) -> RunConfig | None:
    """The config ``cell`` would train with (its run's stored one where it has begun), or ``None`` where it needs
    no training (its run is finished, or a finished run is copied in) or its config cannot be read (then
    :func:`~fedaug.report.runner.run_cell` reports it)."""
    run = find_run(cell.dir)
    if run is not None and (run / SUMMARY).is_file() or run is None and cell.reuse is not None:
        return None
    try:
        return stored_config(run) if run is not None else parse_config(cell.raw)
    except (FedaugError, OSError, ValueError):
        return None


def pack_units(cells: Sequence[Cell], size: int | None = None) -> tuple[list[Unit], PackPlan]:
    """The units of work of a packed grid: each pack (:func:`plan_packs` of the cells that train) where its first
    cell stands, and every other cell alone, in the grid's order; with the plan."""
    trains = [(cell, cfg) for cell in cells if (cfg := training_config(cell)) is not None]
    plan = plan_packs(trains, size)
    first = {id(p[0]): tuple(p) for p in plan.packs}
    packed = {id(c) for p in plan.packs for c in p}
    units: list[Unit] = [first.get(id(c), c) for c in cells if id(c) not in packed or id(c) in first]
    return units, plan


class OnePerRound:
    """A pack's one time-limit decision per round (:class:`~fedaug.report.deadline.RoundWatch`, asked by the first
    cell to finish the round; the others get its answer), so that the cells of a pack stop at one round and
    resume as the same pack."""

    def __init__(self, watch: RoundWatch) -> None:
        self.watch, self.said = watch, dict[int, bool]()

    def __call__(self, round: int) -> bool:
        if round not in self.said:
            self.said[round] = self.watch(round)
        return self.said[round]


def run_pack(cells: Sequence[Cell], report: Report | None = None, deadline: Deadline | None = None,
             max_group: int | None = None) -> list[CellOutcome]:
    """Run, resume or skip the cells of a pack (in this process), as :func:`~fedaug.report.runner.run_cell` does
    each: every cell's lock claimed and its finished or reused run settled first, then the others trained as one
    program (:class:`~fedaug.engine.fleet.packed.Pack`) at their thread count, each with its own records and run
    directory; a cell that fails (any error in its run) fails alone, with its message.

    Args:
        report: as :func:`~fedaug.report.runner.run_cell`'s, for each cell.
        deadline: a time limit: the pack stops at one round boundary where its next round would not fit.
        max_group: the most clients a batched group holds (:class:`~fedaug.engine.fleet.packed.Pack`).

    Returns:
        Each cell's outcome, in ``cells``' order.
    """
    outcomes: dict[int, CellOutcome] = {}
    claimed, todo = [], []
    try:
        for k, cell in enumerate(cells):
            if not claim(cell.dir / ".lock"):
                outcomes[k] = CellOutcome(cell, "busy", None, 0.0)
                continue
            claimed.append(cell.dir / ".lock")
            try:
                settled = settle(cell)
            except FedaugError as exc:
                settled = CellOutcome(cell, "failed", None, 0.0, str(exc))
            if settled is not None:
                outcomes[k] = settled
            else:
                todo.append(k)
        if todo:
            trained = _train([cells[k] for k in todo], report, deadline, max_group)
            outcomes.update(zip(todo, trained))
    finally:
        for lock in claimed:
            lock.unlink(missing_ok=True)
    return [outcomes[k] for k in range(len(cells))]


def _train(cells: list[Cell], report: Report | None, deadline: Deadline | None,
           max_group: int | None) -> list[CellOutcome]:
    """The pack's training: each cell's :func:`~fedaug.report.runner.compute` in a run of one pack."""
    watch = deadline.watch() if deadline is not None else None
    stop = OnePerRound(watch) if watch is not None else None
    t0 = time.perf_counter()

    def body(slot: PackSlot, cell: Cell) -> CellOutcome:
        def note(kind: str, update: RoundUpdate | None = None) -> None:
            if report is not None:
                report(cell.label, kind, update)

        try:
            return compute(cell, cell.dir, note, partial(note, "round"), stop, slot.train)
        finally:
            note("end")

    threads = training_config(cells[0])
    with torch_threads(threads.threads if threads is not None else cells[0].raw["threads"]):
        results: list[Any] = Pack(max_group).run([partial(body, cell=c) for c in cells])
    out = []
    for cell, result in zip(cells, results):
        if isinstance(result, BaseException):
            message = str(result) if isinstance(result, FedaugError) else f"{type(result).__name__}: {result}"
            result = CellOutcome(cell, "failed", None, time.perf_counter() - t0, message)
        out.append(replace(result, first_round_s=watch.first) if watch is not None else result)
    return out
