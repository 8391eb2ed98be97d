"""Grouped steps captured: a group's batched step (:mod:`~fedaug.engine.client.grouped`) replayed from one
CUDA graph (``train.group_clients > 1`` with ``train.cuda_graph = true``, and a pack's groups; issue 62).

A group's step is the grouped execution's (:func:`~fedaug.engine.client.grouped.train_stacked`: the first
client's loss under :func:`torch.func.vmap` over the stacked weights, then the optimiser's step on the stack),
captured once per group layout and step input, as :mod:`~fedaug.engine.client.graphed` captures one client's:
the static tensors a replay reads and writes at fixed addresses are the stacked weights and buffers (each
group's starting weights copied in), the stacked captured tensors of the components, the optimiser's state
(zeroed in place per group), the learning rates and weight decays where the group's clients differ in them
(:class:`~fedaug.engine.client.grouped.StackedSGD`), each step's stacked input and draws, and the sums of the
losses. A layout (:func:`layout_key`: the clients' :func:`~fedaug.engine.client.grouped.signature`, their
number, and the rate that a uniform group's optimiser bakes in) gets its own static tensors; a step input of
another shape (a last partial batch) its own graph. On a CPU, :class:`~fedaug.engine.client.capture.TracedCapture`
gives the captures CUDA graphs' semantics (tests/engine/test_grouped_graphs.py: bit for bit the grouped steps).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.func import vmap

from fedaug.engine.client.capture import Capture
from fedaug.engine.client.graphed import MAX_GRAPHS, capture_step, reset_optimizer_state_, state_leaves
from fedaug.engine.client.grouped import Started, Trained, group_optimizer, group_rates, metrics_of, signature
from fedaug.engine.client.step import mini_batch, stack_states, state_slice

#: a group layout's key (:func:`layout_key`)
LayoutKey = tuple[Any, ...]


def layout_key(group: Sequence[Started]) -> LayoutKey:
    """What a group's static tensors depend on: its first client's signature (every client's), its size, and the
    learning rate and weight decay of a group whose clients share them (its optimiser bakes them in)."""
    rates = group_rates(group)
    return (signature(group[0]), len(group), rates[0] if len(rates) == 1 else "stacked")


@dataclass
class _Layout:
    """The static tensors of one group layout and its graphs by step input."""

    params: dict[str, Tensor]
    consts: dict[str, Tensor]
    captured: Any
    optimizer: torch.optim.Optimizer
    rates: tuple[Tensor, Tensor] | None
    loss: Callable[..., Any]
    total: Tensor
    sums: dict[str, Tensor] = field(default_factory=dict)
    graphs: OrderedDict[tuple[Any, ...], tuple[list[Tensor], Callable[[], None]]] = field(default_factory=OrderedDict)

    def static(self) -> list[Tensor]:
        """Every tensor a step reads across steps or writes."""
        opt = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
        return [*self.params.values(), *self.consts.values(), *state_leaves(self.captured), *opt, self.total,
                *self.sums.values(), *(self.rates or ())]


class GroupGraphs:
    """A worker's (or a pack's) grouped steps by captured graphs (module docstring).

    Args:
        capture: how steps are warmed up and captured (:class:`~fedaug.engine.client.capture.CudaGraphs`;
            :class:`~fedaug.engine.client.capture.TracedCapture` on a CPU).
        max_graphs: graphs kept (least recently used dropped first, with their layout when it has none left).
    """

    def __init__(self, capture: Capture, max_graphs: int = MAX_GRAPHS) -> None:
        self.capture, self.max_graphs = capture, max_graphs
        self.layouts: dict[LayoutKey, _Layout] = {}
        self.order: OrderedDict[tuple[LayoutKey, tuple[Any, ...]], None] = OrderedDict()
        self.num_captures = 0

    def train(self, group: Sequence[Started]) -> list[Trained]:
        """:func:`~fedaug.engine.client.grouped.train_stacked` by replays: the group's tensors into its layout's
        static ones, then per step the stacked input into its graph's static one and a replay.

        Returns:
            Per client, its :class:`~fedaug.engine.client.grouped.Trained` (copies: the static tensors are the
            next group's)."""
        key = layout_key(group)
        layout = self.layouts.get(key) or self._layout(key, group)
        self._load(layout, group)
        lead = group[0]
        lead.ctx.model.train()  # as the grouped steps have it (a capture records the training mode's kernels)
        for s in range(len(lead.steps)):
            inputs = [c.plan.prepare(c.views, mini_batch(c.ctx.data.x, c.ctx.data.y, c.steps[s])) for c in group]
            x, y = torch.stack([i.x for i in inputs]), torch.stack([i.y for i in inputs])
            drawn = stack_states([i.drawn for i in inputs], lead.ctx.device)
            step_in = [x, y, *state_leaves(drawn)]
            shape = tuple((tuple(t.shape), t.dtype) for t in step_in)
            graph = layout.graphs.get(shape) or self._capture(key, layout, group, (x, y, drawn), shape)
            self.order.move_to_end((key, shape))
            with torch.no_grad():
                torch._foreach_copy_(graph[0], step_in)
            graph[1]()
        n = len(lead.steps)
        metrics = metrics_of(layout.total, layout.sums, n)
        entries = {**layout.params, **layout.consts}
        return [Trained({k: t[i].detach().clone() for k, t in entries.items()},
                        s.after(_cloned(state_slice(layout.captured, i))), metrics[i]) for i, s in enumerate(group)]

    def _layout(self, key: LayoutKey, group: Sequence[Started]) -> _Layout:
        """New static tensors for ``key``'s groups, from ``group`` (the first of them)."""
        lead = group[0]
        model = lead.ctx.model
        stacked = stack_states([s.start for s in group])
        params = {k: stacked.pop(k).requires_grad_() for k, p in model.named_parameters() if p.requires_grad}
        optimizer = group_optimizer(list(params.values()), group)
        rates = (optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["weight_decay"]) \
            if isinstance(optimizer.param_groups[0]["lr"], Tensor) else None
        layout = _Layout(params, stacked, stack_states([s.in_step for s in group]), optimizer, rates,
                         vmap(lead.plan.loss(), randomness="error"), torch.zeros(len(group), device=lead.ctx.device))
        self.layouts[key] = layout
        return layout

    def _load(self, layout: _Layout, group: Sequence[Started]) -> None:
        """The group's starting weights, captured tensors and rates into the static ones; a fresh optimiser and
        zero sums."""
        starts = stack_states([s.start for s in group])
        captured = stack_states([s.in_step for s in group])
        with torch.no_grad():
            torch._foreach_copy_([*layout.params.values(), *layout.consts.values()],
                                 [starts[k] for k in (*layout.params, *layout.consts)])
            leaves = state_leaves(layout.captured)
            if leaves:
                torch._foreach_copy_(leaves, state_leaves(captured))
            if layout.rates is not None:
                layout.rates[0].copy_(torch.tensor([s.ctx.lr for s in group]))
                layout.rates[1].copy_(torch.tensor([s.cfg.weight_decay for s in group]))
        reset_optimizer_state_(layout.optimizer)
        torch._foreach_zero_([layout.total, *layout.sums.values()])

    def _capture(self, key: LayoutKey, layout: _Layout, group: Sequence[Started], step_in: tuple[Tensor, Tensor, Any],
                 shape: tuple[Any, ...]) -> tuple[list[Tensor], Callable[[], None]]:
        """Capture the step of ``layout`` on inputs of ``shape`` (``step_in``: the stacked batch, targets and draws):
        warm-up steps on them (undone after: the static tensors as they were), then the capture
        (:meth:`GraphedSteps._capture <fedaug.engine.client.graphed.GraphedSteps._capture>`'s protocol)."""
        plan = group[0].plan
        x, y, drawn = step_in[0].detach().clone(), step_in[1].detach().clone(), _cloned(step_in[2])

        def step() -> tuple[Tensor, dict[str, Tensor]]:
            return plan.update(layout.loss, layout.optimizer, layout.params, layout.captured,
                               (layout.params, layout.consts, layout.captured, drawn, x, y))

        replay, layout.sums = capture_step(self.capture, step, layout.static(), layout.optimizer, layout.total,
                                           layout.sums)
        graph = ([x, y, *state_leaves(drawn)], replay)
        self.num_captures += 1
        layout.graphs[shape] = graph
        self.order[(key, shape)] = None
        while len(self.order) > self.max_graphs:
            (old_key, old_shape), _ = self.order.popitem(last=False)
            self.layouts[old_key].graphs.pop(old_shape, None)
            if not self.layouts[old_key].graphs and old_key != key:
                del self.layouts[old_key]
        return graph


def _cloned(state: Any) -> Any:
    """Detached copies of a nested dict of tensors."""
    return {k: _cloned(v) if isinstance(v, dict) else v.detach().clone() for k, v in state.items()}
