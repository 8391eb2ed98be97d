"""Grouped clients: up to ``train.group_clients`` sampled clients of a training phase trained at once,
as one batched model (issue 39), so that many small clients keep a GPU busy; and the clients of several
runs trained as one group (a pack, :mod:`fedaug.engine.pack`, issue 62).

The group's weights and buffers are stacked along a new leading dimension ``G`` (the clients'
snapshots of their worker model, one after another: no model object per client, DESIGN.md
invariant 4), each step's per-client batches too, and the one client step of
:mod:`~fedaug.engine.client.step` is batched by :func:`torch.func.vmap` over
:func:`torch.func.functional_call`; autograd then gives each
client's gradients in the stacked ``.grad`` (the clients are independent, so the gradient of the sum
of their losses is theirs), and ``torch.optim``'s own SGD or Adam steps the stacked parameters (their
updates are elementwise, so each client's is exactly its own; clients of one group with different learning
rates or weight decays, which only a pack holds, step by :class:`StackedSGD`). BatchNorm running statistics
update in place per client (their stacked buffers are batched inputs). Each client shuffles with its own
generator exactly as :func:`~fedaug.engine.client.training.batch_indices` does, and each client's step
input (its batch through the components' ``transform_batch``, their draws from the client's own streams) is
made outside the batched function, as one client's is (:meth:`~fedaug.engine.client.step.StepPlan.prepare`).

A group is trained in three parts: every client's :func:`start_client` (its components' ``receive`` on its
worker model, its weights snapshotted), the group's steps (:func:`train_stacked`) and every client's
:func:`finish_client` (its trained weights loaded, its components' ``reply``). The steps run the loss of the
group's first client's recipe on its worker model; the clients of one group therefore share one
:func:`signature` (batch schedule, sample shapes, weights' shapes, optimiser).

Clients group only when their batch schedules match (:func:`~fedaug.engine.client.training.batch_sizes`);
a client left alone trains by :func:`~fedaug.engine.client.training.train_client`. The results equal
one-at-a-time training up to float rounding (batched kernels round differently; docs/engine.md,
"Grouped clients", states the tolerance the tests hold). A recipe runs grouped only when every
component has step forms of the client hooks it overrides (:func:`~fedaug.engine.client.step.step_blockers`);
otherwise its clients train one at a time, with one notice per run (:func:`group_size`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from fedaug.config.schema import TrainConfig
from fedaug.core.eager_optim import EagerOptimizer
from fedaug.core.payload import Message, host_values
from fedaug.core.rng import scoped_global_seed
from fedaug.engine.protocol import Reply
from fedaug.engine.client.step import StepPlan, mini_batch, plan_for, stack_states, state_slice, step_blockers
from fedaug.engine.client.training import batch_indices, batch_sizes, component_views, make_optimizer
from fedaug.methods._common import load_entries
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import Recipe


def group_size(group_clients: int, recipe: Recipe, model: nn.Module) -> int:
    """How many clients train together: ``group_clients``, or 1 where
    :func:`~fedaug.engine.client.step.step_blockers` finds a reason, with one notice (a :class:`UserWarning`)
    naming it."""
    if group_clients == 1:
        return 1
    blockers = step_blockers(recipe, model)
    if blockers:
        warnings.warn(f"train.group_clients={group_clients}: clients train one at a time, since "
                      f"{'; '.join(blockers)} cannot train grouped", UserWarning, stacklevel=2)
        return 1
    return group_clients


def plan_groups(schedules: Mapping[Any, tuple[Any, ...]], size: int) -> list[list[Any]]:
    """The groups of a phase: clients in ascending id order, bucketed by batch schedule (the sizes of
    their batches, :func:`~fedaug.engine.client.training.batch_sizes`, or any :func:`signature`), each bucket
    cut into runs of at most ``size``; the same clients always give the same groups, whatever order they
    were asked in.

    >>> plan_groups({3: (2, 2), 1: (2, 2), 2: (2, 1), 0: (2, 2)}, 2)
    [[0, 1], [3], [2]]
    """
    buckets: dict[tuple[Any, ...], list[Any]] = {}
    for cid in sorted(schedules):
        buckets.setdefault(schedules[cid], []).append(cid)
    return [ids[i:i + size] for ids in buckets.values() for i in range(0, len(ids), size)]


@dataclass
class Started:
    """One client of a group between its components' ``receive`` and their ``reply`` (:func:`start_client`).

    Args:
        recipe: its method.
        ctx: the engine's context of its training phase (``num_steps`` and ``train`` set).
        views: each component's view of ``ctx`` (:func:`~fedaug.engine.client.training.component_views`).
        plan: its recipe's step on its worker model.
        steps: the index tensor of each of its mini-batches, in order.
        start: its weights and buffers after ``receive`` ``{state_dict key: tensor}`` (detached copies).
        captured: its components' per-client tensors (``group_capture``).
        cfg: its run's local training options.
    """

    recipe: Recipe
    ctx: ClientCtx
    views: dict[str, ClientCtx]
    plan: StepPlan
    steps: list[Tensor]
    start: dict[str, Tensor]
    captured: State
    cfg: TrainConfig

    @property
    def in_step(self) -> State:
        """The captured tensors of the components that take part in the step (the batched step's; a server rule's
        are not, and stay the client's own)."""
        return {k: v for k, v in self.captured.items() if k in self.plan.in_step}

    def after(self, in_step: State) -> State:
        """Its captured tensors as the steps left them: ``in_step``'s, and the others' as they were."""
        return {**{k: v for k, v in self.captured.items() if k not in self.plan.in_step}, **in_step}


def start_client(recipe: Recipe, ctx: ClientCtx, downlink: Message, state: Mapping[str, State],
                 cfg: TrainConfig) -> Started:
    """A client's start of a grouped training phase, on its worker model ``ctx.model``: its shuffle, every
    component's ``receive`` (the model then holds its starting weights, which are copied) and
    ``group_capture``, in its scope of the global random stream as :func:`~fedaug.engine.client.training.train_client`
    has it."""
    model = ctx.model
    steps = batch_indices(len(ctx.data), cfg, ctx.view("engine").rng("shuffle"))
    ctx = ctx.with_fields(num_steps=len(steps), train=cfg)
    views = component_views(recipe, ctx)
    plan = plan_for(recipe, model, ctx.task.loss)
    with scoped_global_seed(ctx.seed, "client", ctx.round, ctx.client_id):
        for c in recipe.participants("train"):
            c.receive(views[c.name], downlink.get(c.name, {}), state.get(c.name, {}))
    start = {k: t.detach().clone() for k, t in (*model.named_parameters(), *model.named_buffers())}
    return Started(recipe, ctx, views, plan, steps, start, plan.capture(views), cfg)


def signature(s: Started) -> tuple[Any, ...]:
    """What the clients of one group share: the sizes of their batches, the shapes and dtypes of their
    samples and targets, the names and shapes of their weights and buffers and of their components' captured
    tensors in the step (:attr:`Started.in_step`), their optimiser and momentum, and for Adam (whose step takes one
    learning rate) their learning rate and weight decay."""
    data = s.ctx.data
    rates = (s.ctx.lr, s.cfg.weight_decay) if s.cfg.optimizer != "sgd" else ()
    return (tuple(len(i) for i in s.steps), tuple(data.x.shape[1:]), data.x.dtype, tuple(data.y.shape[1:]),
            data.y.dtype, _layout(s.start), _layout(s.in_step), s.cfg.optimizer, s.cfg.momentum, *rates)


def _layout(state: State) -> tuple[Any, ...]:
    """The names, shapes and dtypes of a nested dict of tensors (numbers: their type), in its order."""
    return tuple((k, _layout(v) if isinstance(v, dict) else
                  (tuple(v.shape), v.dtype) if isinstance(v, Tensor) else type(v)) for k, v in state.items())


class StackedSGD(EagerOptimizer):
    """SGD (``torch.optim.SGD``'s rule: weight decay added to the gradient, momentum without dampening) over
    parameters stacked along dim 0, each client ``g`` of the stack with its own learning rate ``lr[g]`` and
    weight decay ``weight_decay[g]``: for clients of several runs trained as one group (a pack).

    Args:
        params: the stacked parameters ``(G, *shape)``.
        lr: ``(G,)`` learning rates, on the parameters' device.
        weight_decay: ``(G,)`` weight decays, on the parameters' device.
        momentum: the clients' one momentum.

    An :class:`~fedaug.core.eager_optim.EagerOptimizer`: built and stepped without importing ``torch._dynamo``.
    """

    def __init__(self, params: list[Tensor], lr: Tensor, weight_decay: Tensor, momentum: float) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "decays": bool((weight_decay != 0).any())})

    @torch.no_grad()
    def _step(self, closure: Any = None) -> None:
        """One step of every client: ``d = grad + wd * p``, ``b = momentum * b + d`` (``b = d`` first),
        ``p -= lr * b`` (``d`` without momentum), each client's rate and decay broadcast over its slice."""
        for group in self.param_groups:
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                shape = (-1,) + (1,) * (p.dim() - 1)
                d = p.grad.addcmul(p, wd.view(shape)) if group["decays"] else p.grad
                if momentum:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = d.detach().clone()
                    else:
                        state["momentum_buffer"].mul_(momentum).add_(d)
                    d = state["momentum_buffer"]
                p.addcmul_(d, lr.view(shape), value=-1.0)


def group_rates(group: Sequence[Started]) -> list[tuple[float, float]]:
    """The distinct ``(learning rate, weight decay)`` of a group's clients, in a fixed order."""
    return sorted({(s.ctx.lr, s.cfg.weight_decay) for s in group})


def group_optimizer(params: list[Tensor], group: Sequence[Started]) -> torch.optim.Optimizer:
    """The group's local optimiser: the run's own (:func:`~fedaug.engine.client.training.make_optimizer`) where
    every client has one learning rate and weight decay (a group of one run always), else :class:`StackedSGD`."""
    lead = group[0]
    if len(group_rates(group)) == 1:
        return make_optimizer(params, lead.cfg, lead.ctx.lr)
    device = params[0].device
    return StackedSGD(params, torch.tensor([s.ctx.lr for s in group], device=device),
                      torch.tensor([s.cfg.weight_decay for s in group], device=device), lead.cfg.momentum)


@dataclass
class Trained:
    """What the steps of a group leave for each client (:func:`train_stacked`): its trained weights and
    buffers ``{state_dict key: tensor}``, its components' tensors and its training metrics."""

    entries: dict[str, Tensor]
    captured: State
    metrics: dict[str, float]


def train_stacked(group: Sequence[Started]) -> list[Trained]:
    """The steps of a group of started clients of one :func:`signature`, as one batched model (module
    docstring): the loss of the first client's recipe on its worker model, under :func:`torch.func.vmap`
    over the clients' stacked weights; each client's inputs made by its own recipe. The model is left in
    training mode holding the first client's starting weights; the loss sums are read once for the group.

    Returns:
        Per client, in ``group``'s order, its :class:`Trained`.
    """
    lead = group[0]
    model, plan = lead.ctx.model, lead.plan
    stacked = stack_states([s.start for s in group])
    params = {k: stacked.pop(k).requires_grad_() for k, p in model.named_parameters() if p.requires_grad}
    captured = stack_states([s.in_step for s in group])
    model.train()
    optimizer = group_optimizer(list(params.values()), group)
    batched = vmap(plan.loss(), randomness="error")
    totals, logged = [], []
    for s in range(len(lead.steps)):
        inputs = [c.plan.prepare(c.views, mini_batch(c.ctx.data.x, c.ctx.data.y, c.steps[s])) for c in group]
        x, y = torch.stack([i.x for i in inputs]), torch.stack([i.y for i in inputs])
        drawn = stack_states([i.drawn for i in inputs], lead.ctx.device)
        total, terms = plan.update(batched, optimizer, params, captured, (params, stacked, captured, drawn, x, y))
        totals.append(total)
        logged.append(terms)
    metrics = _metrics(totals, logged, len(group), lead.ctx.device)
    entries = {**params, **stacked}
    return [Trained({k: t[i].detach() for k, t in entries.items()}, s.after(state_slice(captured, i)), metrics[i])
            for i, s in enumerate(group)]


def _metrics(totals: list[Tensor], logged: list[dict[str, Tensor]], size: int,
             device: torch.device) -> list[dict[str, float]]:
    """Each client's training metrics from the steps' ``(G,)`` totals and loss terms, summed in step order
    (:func:`metrics_of`)."""
    total_sum = torch.zeros(size, device=device)
    sums: dict[str, Any] = {}
    for total, terms in zip(totals, logged):
        total_sum += total
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + v
    return metrics_of(total_sum, sums, len(totals))


def metrics_of(total_sum: Tensor, sums: Mapping[str, Tensor], num_steps: int) -> list[dict[str, float]]:
    """Each client's training metrics (those of :func:`~fedaug.engine.client.training.train_metrics`) from the sums
    of its steps' total losses ``(G,)`` and loss terms ``{term: (G,)}``, read with one synchronisation."""
    values = host_values({"loss": total_sum, **{f"term/{k}": v for k, v in sums.items()}})
    n = max(num_steps, 1)
    return [{"loss": values["loss"][i] / n, "steps": num_steps, **{k: values[f"term/{k}"][i] / n for k in sums}}
            for i in range(total_sum.shape[0])]


def finish_client(s: Started, trained: Trained) -> Reply:
    """A client's end of a grouped training phase, on its worker model: its trained weights loaded, its
    components' tensors handed back (``group_restore``) and every component's ``reply``."""
    load_entries(s.ctx.model, trained.entries)
    uplink, new_state = {}, {}
    with scoped_global_seed(s.ctx.seed, "client", s.ctx.round, s.ctx.client_id):
        s.plan.restore(s.views, trained.captured)
        for c in s.recipe.participants("train"):
            part, st = c.reply(s.views[c.name])
            uplink[c.name] = part
            if st:
                new_state[c.name] = st
    return Reply(uplink, trained.metrics, new_state)


def train_group(recipe: Recipe, ctxs: Sequence[ClientCtx], downlinks: Sequence[Message],
                states: Sequence[Mapping[str, State]], cfg: TrainConfig) -> list[Reply]:
    """Train a group of clients of one round at once on the worker model (``ctxs[0].model``): every client's
    :func:`start_client`, the group's :func:`train_stacked`, every client's :func:`finish_client`.

    Args:
        recipe: the method; every component has step forms (:func:`~fedaug.engine.client.step.step_blockers`
            finds nothing).
        ctxs: the clients' contexts (phase ``"train"``, one round, one learning rate, one worker
            model and device), with training splits of one batch schedule (:func:`plan_groups`).
        downlinks: each client's message, validated, on the device.
        states: each client's per-client state, on the device.
        cfg: local training options (SGD or Adam; float32).

    Returns:
        One :class:`~fedaug.engine.protocol.Reply` per client, in ``ctxs``' order: what
        :func:`~fedaug.engine.client.training.train_client` returns, up to float rounding.
    """
    started = [start_client(recipe, ctx, down, state, cfg) for ctx, down, state in zip(ctxs, downlinks, states)]
    return [finish_client(s, t) for s, t in zip(started, train_stacked(started))]
