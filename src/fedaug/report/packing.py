"""Which cells of a grid train as one pack (``fedaug compare --pack``, issue 62), and why the others do not.

Cells pack when their clients' steps have one shape: the same model and options, the same components taking part
in the step's loss and update (:func:`~fedaug.engine.client.step.in_step`: FedProx's proximal term, FFA's layers,
FLea's split forward, SCAFFOLD's correction; with equal options, apart from a component's
:attr:`~fedaug.methods.component.Component.pack_free` ones), the same device, precision, determinism, thread count,
plug-in imports and CUDA-graph switch, each on one worker in the grid's process. Everything else may differ
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
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from fedaug.config.schema import RunConfig
from fedaug.core.errors import FedaugError
from fedaug.engine.client.step import in_step, step_blocker
from fedaug.methods.recipe import build_recipe
from fedaug.methods.recorded import pin
from fedaug.models.registry import build_model
from fedaug.report.runner import Cell

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
        recipe = build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
        model = build_model(cfg.model.name, 3, 10, **cfg.model.options)
    except FedaugError as exc:
        return "", f"its method or model cannot be built ({exc})"
    why = [f"'{c.name}' ({reason})" for c in recipe.components if (reason := step_blocker(c))]
    if any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()):
        why.append(f"the model '{cfg.model.name}' (its dropout draws from the global random stream)")
    if why:
        return "", "its clients cannot train grouped: " + "; ".join(why)
    step = [[type(c).__module__, type(c).__qualname__, {k: v for k, v in cfg.method.options.get(c.name, {}).items()
                                                         if k not in c.pack_free}]
            for c in recipe.components if in_step(c)]
    key = {"model": [cfg.model.name, cfg.model.options], "step": step, "cuda_graph": cfg.train.cuda_graph,
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
