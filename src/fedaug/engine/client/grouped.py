"""Grouped clients: up to ``train.group_clients`` sampled clients of a training phase trained at once,
as one batched model (issue 39), so that many small clients keep a GPU busy.

The group's weights and buffers are stacked along a new leading dimension ``G`` (the clients'
snapshots of the one worker model, one after another: no model object per client, DESIGN.md
invariant 4), each step's per-client batches too, and one client's loss is written once and
batched by :func:`torch.func.vmap` over :func:`torch.func.functional_call`; autograd then gives each
client's gradients in the stacked ``.grad`` (the clients are independent, so the gradient of the sum
of their losses is theirs), and ``torch.optim``'s own SGD or Adam steps the stacked parameters (their
updates are elementwise, so each client's is exactly its own). BatchNorm running statistics update
in place per client (their stacked buffers are batched inputs). Each client shuffles with its own
generator exactly as :func:`~fedaug.engine.client.training.batch_indices` does, and a component draws its
per-step random numbers from the client's own streams outside the batched function
(:meth:`~fedaug.methods.component.Component.group_inputs`), in the one-at-a-time order.

Clients group only when their batch schedules match (:func:`~fedaug.engine.client.training.batch_sizes`);
a client left alone trains by :func:`~fedaug.engine.client.training.train_client`. The results equal
one-at-a-time training up to float rounding (batched kernels round differently; docs/engine.md,
"Grouped clients", states the tolerance the tests hold). A recipe runs grouped only when every
component has grouped forms of the client hooks it overrides (:func:`group_blockers`); otherwise
its clients train one at a time, with one notice per run (:func:`group_size`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedaug.config.schema import TrainConfig
from fedaug.core.payload import Message
from fedaug.core.rng import scoped_global_seed
from fedaug.engine.protocol import Reply
from fedaug.engine.client.training import batch_indices, batch_sizes, component_views, make_optimizer, train_metrics
from fedaug.methods._common import load_entries
from fedaug.methods.component import ClientCtx, Component, State
from fedaug.methods.recipe import Recipe, overrides

#: each client hook a component may override, and the grouped form it then needs (``None``: none exists)
GROUPED_FORMS: dict[str, str | None] = {
    "receive": "group_capture", "reply": "group_restore", "loss_terms": "group_loss_terms",
    "before_step": "group_before_step", "transform_batch": None, "forward": None, "task_loss": None, "step": None,
}


def _owner(cls: type, attr: str) -> type:
    """The class of ``cls``'s MRO that defines ``attr``."""
    return next(k for k in cls.__mro__ if attr in vars(k))


def component_blocker(c: Component) -> str:
    """Why ``c`` cannot train grouped (``""``: it can): its own :meth:`~Component.group_blocker`, or a
    client hook it overrides at a class below the one that gives its grouped form (a subclass of a
    groupable component that changes what its clients compute, e.g. FedDyn's loss term on FedAvg)."""
    why = c.group_blocker()
    if why:
        return why
    cls = type(c)
    missing = [hook for hook, form in GROUPED_FORMS.items() if overrides(c, hook)
               and (form is None or not issubclass(_owner(cls, form), _owner(cls, hook)))]
    return f"it overrides {', '.join(missing)} without a grouped form" if missing else ""


def group_blockers(recipe: Recipe, model: nn.Module,
                   blocker: Callable[[Component], str] = component_blocker) -> list[str]:
    """What keeps ``recipe`` on ``model`` from training grouped, one entry per component that ``blocker``
    gives a reason for (:func:`component_blocker`; CUDA graphs: :func:`~fedaug.engine.client.graphed.graph_blocker`)
    and one for a model with dropout (empty: nothing)."""
    out = [f"'{c.name}' ({why})" for c in recipe.components if (why := blocker(c))]
    if any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()):
        out.append(f"the model ({type(model).__name__}: its dropout draws from the global random stream)")
    return out


def group_size(group_clients: int, recipe: Recipe, model: nn.Module) -> int:
    """How many clients train together: ``group_clients``, or 1 where :func:`group_blockers` finds a
    reason, with one notice (a :class:`UserWarning`) naming it."""
    if group_clients == 1:
        return 1
    blockers = group_blockers(recipe, model)
    if blockers:
        warnings.warn(f"train.group_clients={group_clients}: clients train one at a time, since "
                      f"{'; '.join(blockers)} cannot train grouped", UserWarning, stacklevel=2)
        return 1
    return group_clients


def plan_groups(schedules: Mapping[int, tuple[int, ...]], size: int) -> list[list[int]]:
    """The groups of a phase: clients in ascending id order, bucketed by batch schedule (the sizes of
    their batches, :func:`~fedaug.engine.client.training.batch_sizes`), each bucket cut into runs of at most
    ``size``; the same clients always give the same groups, whatever order they were asked in.

    >>> plan_groups({3: (2, 2), 1: (2, 2), 2: (2, 1), 0: (2, 2)}, 2)
    [[0, 1], [3], [2]]
    """
    buckets: dict[tuple[int, ...], list[int]] = {}
    for cid in sorted(schedules):
        buckets.setdefault(schedules[cid], []).append(cid)
    return [ids[i:i + size] for ids in buckets.values() for i in range(0, len(ids), size)]


def stack_states(states: Sequence[State]) -> State:
    """Nested dicts of tensors with one structure, stacked leaf by leaf along a new dim 0 (``(G, *shape)``)."""
    return {k: stack_states([s[k] for s in states]) if isinstance(v, dict) else torch.stack([s[k] for s in states])
            for k, v in states[0].items()}


def state_slice(state: State, i: int) -> State:
    """Client ``i``'s entries of :func:`stack_states`' output (views)."""
    return {k: state_slice(v, i) if isinstance(v, dict) else v[i] for k, v in state.items()}


def client_loss(recipe: Recipe, model: nn.Module, task_loss: Callable[[Tensor, Tensor], Tensor]
                ) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """One client's total loss and its terms, as the one-at-a-time closure computes them, for ``vmap``
    (and, for one client, for a CUDA graph: :mod:`fedaug.engine.client.graphed`)."""
    extras = recipe.per_batch["loss_terms"]
    forwarders = [c for c in recipe.participants("train") if overrides(c, "group_forward")]

    def loss(params: dict[str, Tensor], consts: dict[str, Tensor], captured: State, inputs: State, x: Tensor,
             y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        with ExitStack() as stack:
            for c in forwarders:
                stack.enter_context(c.group_forward(captured[c.name], inputs.get(c.name, {})))
            out = functional_call(model, (params, consts), (x,))
        terms = {"task": task_loss(out, y)}
        for c in extras:
            for k, v in c.group_loss_terms(params, captured[c.name]).items():
                terms[f"{c.name}/{k}"] = v
        total = sum(terms.values()) if len(terms) > 1 else terms["task"]
        return total, terms

    return loss


def optimizer_step(loss: Callable[..., tuple[Tensor, dict[str, Tensor]]], optimizer: torch.optim.Optimizer,
                   adjusters: Sequence[Component], params: dict[str, Tensor], captured: State,
                   args: tuple[Any, ...]) -> tuple[Tensor, dict[str, Tensor]]:
    """One step of :func:`client_loss`'s ``loss(params, *args)`` (batched or not): backward from the sum
    of its totals, every adjuster's :meth:`~fedaug.methods.component.Component.group_before_step` on
    the gradients, the optimiser's step.

    Returns:
        The totals and the loss terms, detached.
    """
    optimizer.zero_grad(set_to_none=True)
    totals, terms = loss(params, *args)
    totals.sum().backward()
    grads = {k: p.grad for k, p in params.items() if p.grad is not None}
    for c in adjusters:
        c.group_before_step(grads, captured[c.name], optimizer)
    optimizer.step()
    return totals.detach(), {k: v.detach() for k, v in terms.items()}


def train_group(recipe: Recipe, ctxs: Sequence[ClientCtx], downlinks: Sequence[Message],
                states: Sequence[Mapping[str, State]], cfg: TrainConfig) -> list[Reply]:
    """Train a group of clients of one round at once on the worker model (``ctxs[0].model``).

    Per client, in turn: every component's ``receive`` (the model then holds the client's starting
    weights, which are snapshotted) and :meth:`~fedaug.methods.component.Component.group_capture`.
    Then the steps of the stacked group (module docstring), and per client, in turn: its trained
    weights loaded into the model, ``group_restore`` and ``reply``, as
    :func:`~fedaug.engine.client.training.train_client` ends.

    Args:
        recipe: the method; every component trains grouped (:func:`group_blockers` finds nothing).
        ctxs: the clients' contexts (phase ``"train"``, one round, one learning rate, one worker
            model and device), with training splits of one batch schedule (:func:`plan_groups`).
        downlinks: each client's message, validated, on the device.
        states: each client's per-client state, on the device.
        cfg: local training options (SGD or Adam; float32).

    Returns:
        One :class:`~fedaug.engine.protocol.Reply` per client, in ``ctxs``' order: what
        :func:`~fedaug.engine.client.training.train_client` returns, up to float rounding.
    """
    model = ctxs[0].model
    sizes = batch_sizes(len(ctxs[0].data), cfg)
    steps = [batch_indices(len(ctx.data), cfg, ctx.view("engine").rng("shuffle")) for ctx in ctxs]
    views = [component_views(recipe, ctx.with_fields(num_steps=len(sizes))) for ctx in ctxs]
    train = recipe.participants("train")
    starts: list[dict[str, Tensor]] = []
    captures: list[State] = []
    for ctx, view, down, state in zip(ctxs, views, downlinks, states):
        with scoped_global_seed(ctx.seed, "client", ctx.round, ctx.client_id):
            for c in train:
                c.receive(view[c.name], down.get(c.name, {}), state.get(c.name, {}))
        starts.append({k: t.detach().clone() for k, t in (*model.named_parameters(), *model.named_buffers())})
        captures.append({c.name: c.group_capture(view[c.name]) for c in train})
    trainable = [k for k, p in model.named_parameters() if p.requires_grad]
    stacked = stack_states(starts)
    params = {k: stacked.pop(k).requires_grad_() for k in trainable}
    captured = stack_states(captures)
    model.train()
    optimizer = make_optimizer(list(params.values()), cfg, ctxs[0].lr)
    batched = vmap(client_loss(recipe, model, ctxs[0].task.loss), randomness="error")
    drawers = [c for c in train if overrides(c, "group_inputs")]
    adjusters = recipe.per_batch["before_step"]
    total_sum = torch.zeros(len(ctxs), device=ctxs[0].device)
    sums: dict[str, Any] = {}
    for s, size in enumerate(sizes):
        x = torch.stack([ctx.data.x[idx[s]] for ctx, idx in zip(ctxs, steps)])
        y = torch.stack([ctx.data.y[idx[s]] for ctx, idx in zip(ctxs, steps)])
        inputs = stack_states([{c.name: c.group_inputs(view[c.name], size) for c in drawers} for view in views])
        totals, terms = optimizer_step(batched, optimizer, adjusters, params, captured,
                                       (stacked, captured, inputs, x, y))
        total_sum += totals
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + v
    replies = []
    for i, (ctx, view) in enumerate(zip(ctxs, views)):
        load_entries(model, {k: t[i].detach() for k, t in (*params.items(), *stacked.items())})
        uplink, new_state = {}, {}
        with scoped_global_seed(ctx.seed, "client", ctx.round, ctx.client_id):
            for c in train:
                c.group_restore(view[c.name], state_slice(captured[c.name], i))
            for c in train:
                part, st = c.reply(view[c.name])
                uplink[c.name] = part
                if st:
                    new_state[c.name] = st
        replies.append(Reply(uplink, train_metrics(total_sum[i], {k: v[i] for k, v in sums.items()}, len(sizes)),
                             new_state))
    return replies
