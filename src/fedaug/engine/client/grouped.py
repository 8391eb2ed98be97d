"""Grouped clients: up to ``train.group_clients`` sampled clients of a training phase trained at once,
as one batched model (issue 39), so that many small clients keep a GPU busy.

The group's weights and buffers are stacked along a new leading dimension ``G`` (the clients'
snapshots of the one worker model, one after another: no model object per client, DESIGN.md
invariant 4), each step's per-client batches too, and the one client step of
:mod:`~fedaug.engine.client.step` is batched by :func:`torch.func.vmap` over
:func:`torch.func.functional_call`; autograd then gives each
client's gradients in the stacked ``.grad`` (the clients are independent, so the gradient of the sum
of their losses is theirs), and ``torch.optim``'s own SGD or Adam steps the stacked parameters (their
updates are elementwise, so each client's is exactly its own). BatchNorm running statistics update
in place per client (their stacked buffers are batched inputs). Each client shuffles with its own
generator exactly as :func:`~fedaug.engine.client.training.batch_indices` does, and each client's step
input (its batch through the components' ``transform_batch``, their draws from the client's own streams) is
made outside the batched function, as one client's is (:meth:`~fedaug.engine.client.step.StepPlan.prepare`).

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
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from fedaug.config.schema import TrainConfig
from fedaug.core.payload import Message
from fedaug.core.rng import scoped_global_seed
from fedaug.engine.protocol import Reply
from fedaug.engine.client.step import mini_batch, plan_for, stack_states, state_slice, step_blockers
from fedaug.engine.client.training import batch_indices, batch_sizes, component_views, make_optimizer, train_metrics
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


def train_group(recipe: Recipe, ctxs: Sequence[ClientCtx], downlinks: Sequence[Message],
                states: Sequence[Mapping[str, State]], cfg: TrainConfig) -> list[Reply]:
    """Train a group of clients of one round at once on the worker model (``ctxs[0].model``).

    Per client, in turn: every component's ``receive`` (the model then holds the client's starting
    weights, which are snapshotted) and :meth:`~fedaug.methods.component.Component.group_capture`.
    Then the steps of the stacked group (module docstring), and per client, in turn: its trained
    weights loaded into the model, ``group_restore`` and ``reply``, as
    :func:`~fedaug.engine.client.training.train_client` ends.

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
    model = ctxs[0].model
    plan = plan_for(recipe, model, ctxs[0].task.loss)
    sizes = batch_sizes(len(ctxs[0].data), cfg)
    steps = [batch_indices(len(ctx.data), cfg, ctx.view("engine").rng("shuffle")) for ctx in ctxs]
    views = [component_views(recipe, ctx.with_fields(num_steps=len(sizes), train=cfg)) for ctx in ctxs]
    train = recipe.participants("train")
    starts: list[dict[str, Tensor]] = []
    captures: list[State] = []
    for ctx, view, down, state in zip(ctxs, views, downlinks, states):
        with scoped_global_seed(ctx.seed, "client", ctx.round, ctx.client_id):
            for c in train:
                c.receive(view[c.name], down.get(c.name, {}), state.get(c.name, {}))
        starts.append({k: t.detach().clone() for k, t in (*model.named_parameters(), *model.named_buffers())})
        captures.append(plan.capture(view))
    trainable = [k for k, p in model.named_parameters() if p.requires_grad]
    stacked = stack_states(starts)
    params = {k: stacked.pop(k).requires_grad_() for k in trainable}
    captured = stack_states(captures)
    model.train()
    optimizer = make_optimizer(list(params.values()), cfg, ctxs[0].lr)
    batched = vmap(plan.loss(), randomness="error")
    device = ctxs[0].device
    total_sum = torch.zeros(len(ctxs), device=device)
    sums: dict[str, Any] = {}
    for s in range(len(sizes)):
        inputs = [plan.prepare(view, mini_batch(ctx.data.x, ctx.data.y, idx[s]))
                  for ctx, idx, view in zip(ctxs, steps, views)]
        x, y = torch.stack([i.x for i in inputs]), torch.stack([i.y for i in inputs])
        drawn = stack_states([i.drawn for i in inputs], device)
        totals, terms = plan.update(batched, optimizer, params, captured, (params, stacked, captured, drawn, x, y))
        total_sum += totals
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + v
    replies = []
    for i, (ctx, view) in enumerate(zip(ctxs, views)):
        load_entries(model, {k: t[i].detach() for k, t in (*params.items(), *stacked.items())})
        uplink, new_state = {}, {}
        with scoped_global_seed(ctx.seed, "client", ctx.round, ctx.client_id):
            plan.restore(view, state_slice(captured, i))
            for c in train:
                part, st = c.reply(view[c.name])
                uplink[c.name] = part
                if st:
                    new_state[c.name] = st
        replies.append(Reply(uplink, train_metrics(total_sum[i], {k: v[i] for k, v in sums.items()}, len(sizes)),
                             new_state))
    return replies
