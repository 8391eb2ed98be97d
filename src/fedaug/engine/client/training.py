"""The one local training loop: every component's client hooks around plain mini-batch SGD/Adam.

It runs on ``ctx.device``; with a mixed ``precision`` the forward pass and the loss run under
:func:`torch.autocast` (:func:`fedaug.core.device.autocast`) and backward outside it; with
``"16-mixed"`` the loss is scaled (:class:`torch.amp.GradScaler`), the gradients are unscaled before
any component's ``before_step`` (SCAFFOLD's correction sees true gradients) and the scaler steps
(skipping a step whose gradients overflowed).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn
from torch.autograd import graph as _autograd_graph

from fedaug.config.schema import TrainConfig
from fedaug.core.device import autocast, grad_scaler
from fedaug.core.errors import ConfigError
from fedaug.core.eager_optim import LocalAdam
from fedaug.core.local_sgd import LocalSGD
from fedaug.core.payload import Message, host_values
from fedaug.core.rng import scoped_global_seed
from fedaug.engine.protocol import Reply
from fedaug.engine.client.step import mini_batch, plan_for
from fedaug.methods.component import ClientCtx, State, transform_inputs
from fedaug.methods.recipe import Recipe
from fedaug.models.walk import train_mode, trainable


#: the call into torch's autograd engine that ``Tensor.backward`` ends in (torch 2.11-2.15), or None
_RUN_BACKWARD = getattr(_autograd_graph, "_engine_run_backward", None)

#: what takes a client's local steps instead of the eager loop (:class:`~fedaug.engine.client.graphed.GraphedSteps`):
#: called with the engine's context, the components' views and the batches' index tensors, after every
#: component's ``receive``; returns the sum of the steps' total losses and the sums of each loss term
LocalSteps = Callable[[ClientCtx, dict[str, ClientCtx], list[Tensor]], tuple[Tensor, dict[str, Tensor]]]


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """A fresh local optimiser over ``params``. SGD on the CPU is :class:`~fedaug.core.local_sgd.LocalSGD`
    (torch's SGD, stepped in one compiled pass where that library is built: the same bits). On CUDA, Adam
    is capturable in every execution (its step count and bias corrections on the device, in float32), so
    that eager, grouped and captured steps compute the same arithmetic (SGD's step is capturable as it
    is); elsewhere torch's default (the step count on the host, the bias corrections in float64), as
    :class:`~fedaug.core.eager_optim.LocalAdam` (torch's Adam without its import of ``torch._dynamo``)."""
    if cfg.optimizer == "sgd":
        sgd = LocalSGD if not params or params[0].is_cpu else torch.optim.SGD
        return sgd(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        capturable = bool(params) and params[0].device.type == "cuda"
        adam = torch.optim.Adam if capturable else LocalAdam
        return adam(params, lr=lr, weight_decay=cfg.weight_decay, capturable=capturable)
    raise ConfigError(f"unknown train.optimizer '{cfg.optimizer}'; choose sgd or adam")


class LocalOptimizer:
    """A worker's local optimiser, as good as new for every client: its state (momentum buffers,
    Adam's moments and step) is never carried between rounds or clients. One optimiser is reset per
    client (state cleared, hyperparameters restored, this round's learning rate) instead of built: a
    tenth of a small client's fixed cost. A new one is built whenever the trainable parameters change.

    Args:
        cfg: local training options (``optimizer``, ``momentum``, ``weight_decay``).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self._optimizer: torch.optim.Optimizer | None = None
        self._params: list[nn.Parameter] = []
        self._group: dict[str, object] = {}

    def fresh(self, model: nn.Module, lr: float, params: list[nn.Parameter] | None = None) -> torch.optim.Optimizer:
        """The optimiser over ``model``'s trainable parameters (``params`` where the caller has listed them, in
        ``model.parameters()`` order), at learning rate ``lr``, with no state."""
        params = [p for p in model.parameters() if p.requires_grad] if params is None else params
        opt = self._optimizer
        if (opt is None or len(opt.param_groups) != 1 or len(params) != len(self._params)
                or any(a is not b for a, b in zip(params, self._params))):
            opt = self._optimizer = make_optimizer(params, self.cfg, lr)
            self._params = params
            self._group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
            return opt
        opt.state.clear()
        opt.param_groups[0].update(self._group, lr=lr)
        return opt


def component_views(recipe: Recipe, ctx: ClientCtx) -> dict[str, ClientCtx]:
    """Each component's view of ``ctx``, with :attr:`ClientCtx.eval_inputs` the evaluation-mode
    ``transform_batch`` chain of the components before it (what evaluation feeds the model, up to
    that component)."""
    eval_ctx = ctx.with_fields(phase="evaluate")
    eval_views = {c.name: eval_ctx.view(c.name) for c in recipe.components}
    return {name: ctx.with_fields(component=name, eval_inputs=partial(transform_inputs, before, eval_views))
            for name, before in recipe.transforms_before.items()}


def _batches_per_epoch(n: int, cfg: TrainConfig) -> tuple[int, int]:
    """``(batch size, batches per epoch)`` of a client with ``n`` training samples (:func:`batch_indices`)."""
    bs = min(cfg.batch_size, n)
    full = n // bs
    return bs, full + (0 if cfg.drop_last or n - full * bs < 2 else 1)


def batch_sizes(n: int, cfg: TrainConfig) -> tuple[int, ...]:
    """The sizes of the round's mini-batches of a client with ``n`` training samples, in order: those of
    :func:`batch_indices`, known without drawing (clients with equal sizes can train as a group,
    :mod:`fedaug.engine.client.grouped`)."""
    bs, per_epoch = _batches_per_epoch(n, cfg)
    epoch = [min(bs, n - i * bs) for i in range(per_epoch)]
    want = num_local_steps(n, cfg)
    return tuple(epoch[i % per_epoch] for i in range(want))


def num_local_steps(n: int, cfg: TrainConfig) -> int:
    """How many optimiser steps a client with ``n`` training samples takes in a round (:func:`batch_indices`)."""
    return cfg.local_steps if cfg.local_steps is not None else cfg.local_epochs * _batches_per_epoch(n, cfg)[1]


def batch_indices(n: int, cfg: TrainConfig, g: torch.Generator) -> list[Tensor]:
    """Index tensors of the round's mini-batches, reshuffling every epoch.

    ``local_steps`` takes exactly that many batches (epochs continue as needed); otherwise
    ``local_epochs`` full passes. With ``drop_last`` the incomplete batch of an epoch is dropped,
    unless the client has fewer than ``batch_size`` samples (then each epoch is one batch of all
    of them); without it, a last batch of a single sample is dropped too (BatchNorm needs two).
    """
    bs, per_epoch = _batches_per_epoch(n, cfg)
    want = num_local_steps(n, cfg)
    out: list[Tensor] = []
    while len(out) < want:
        perm = torch.randperm(n, generator=g, device=g.device)
        out.extend(perm[i * bs : (i + 1) * bs] for i in range(per_epoch))
    return out[:want]


def train_client(
    recipe: Recipe, ctx: ClientCtx, downlink: Message, state: dict[str, State], cfg: TrainConfig,
    precision: str = "32", optimizers: LocalOptimizer | None = None, local_steps: LocalSteps | None = None,
) -> Reply:
    """Run one client's training phase on the worker model ``ctx.model``, on ``ctx.device``.

    Args:
        recipe: the method.
        ctx: the client's context (the engine's own view, phase ``"train"``); each component gets its own view.
        downlink: ``{component name: part}``, already validated, on ``ctx.device``.
        state: the client's per-client state ``{component name: state}``, on ``ctx.device``.
        cfg: local training options.
        precision: ``"32"``, ``"bf16-mixed"`` or ``"16-mixed"`` (:mod:`fedaug.core.device`); with
            ``"16-mixed"`` no component may replace the step (:class:`~fedaug.engine.client.worker.Worker`
            refuses it).
        optimizers: the worker's :class:`LocalOptimizer` (default: a new one, for this client alone).
        local_steps: what takes the steps (:data:`LocalSteps`; ``train.cuda_graph``,
            :mod:`fedaug.engine.client.graphed`); default: :func:`eager_steps`.

    Returns:
        The uplink message, the training metrics and the client's new per-client state.
    """
    steps = batch_indices(len(ctx.data), cfg, ctx.view("engine").rng("shuffle"))
    ctx = ctx.with_fields(num_steps=len(steps), train=cfg)
    views = component_views(recipe, ctx)
    with scoped_global_seed(ctx.seed, "client", ctx.round, ctx.client_id):
        for c in recipe.participants("train"):
            c.receive(views[c.name], downlink.get(c.name, {}), state.get(c.name, {}))
        train_mode(ctx.model)
        run = local_steps or partial(eager_steps, recipe, cfg=cfg, precision=precision, optimizers=optimizers)
        total_sum, sums = run(ctx, views, steps)
        uplink, new_state = {}, {}
        for c in recipe.participants("train"):
            part, st = c.reply(views[c.name])
            uplink[c.name] = part
            if st:
                new_state[c.name] = st
    return Reply(uplink, train_metrics(total_sum, sums, len(steps)), new_state)


def eager_steps(recipe: Recipe, ctx: ClientCtx, views: dict[str, ClientCtx], steps: list[Tensor], *,
                cfg: TrainConfig, precision: str = "32",
                optimizers: LocalOptimizer | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """The client's local steps, one batch of ``ctx.data`` per index tensor of ``steps``: the one step of
    :mod:`~fedaug.engine.client.step` on the model's own parameters, with mixed precision where
    ``precision`` asks (the forward pass and loss under autocast; ``"16-mixed"``'s scaler) and a component's
    replaced optimiser step (SAM) where the recipe has one (:data:`LocalSteps`; the arguments as
    :func:`train_client`'s). A step's input and draws are made once per step, also when a replaced step
    evaluates the loss twice."""
    model, data = ctx.model, ctx.data
    plan = plan_for(recipe, model, ctx.task.loss)
    params = trainable(model)
    optimizer = (optimizers or LocalOptimizer(cfg)).fresh(model, ctx.lr, list(params.values()))
    stepper = recipe.replacer["step"]
    scaler = grad_scaler(ctx.device, precision)
    loss = plan.loss(views)
    captured = plan.capture(views)
    logged: list[dict[str, Tensor]] = []  # each step's loss terms, detached
    first_call = [True]  # log loss terms once per step, even if a step evaluates the closure twice (SAM)
    alone = plan.task_only  # (then the task term's sum is the total's: not added up twice)

    def closure() -> Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast(ctx.device, precision):
            total, terms = loss(None, None, captured, inputs.drawn, inputs.x, inputs.y)
        if scaler is None:
            backward(total)
        else:
            scaler.scale(total).backward()
            scaler.unscale_(optimizer)
        plan.adjust(optimizer, params, captured, views)
        if first_call[0] and not alone:
            logged.append({k: v.detach() for k, v in terms.items()})
            first_call[0] = False
        return total.detach()

    def step() -> Tensor:
        if scaler is None:
            return stepper.step(views[stepper.name], optimizer, closure)
        total = closure()  # the default step, with the scaler's (no component replaces it)
        scaler.step(optimizer)
        scaler.update()
        return total

    totals = []
    for idx in steps:
        inputs = plan.prepare(views, mini_batch(data.x, data.y, idx))
        first_call[0] = True
        totals.append(step())
    plan.restore(views, captured)
    # the sums, added in step order once the steps are done: the same additions, none of them between a step's
    # operations (where each costs a small client's step several microseconds more than it does here)
    total_sum = torch.zeros((), device=ctx.device)
    for total in totals:
        total_sum += total
    if alone:
        return total_sum, ({"task": total_sum} if steps else {})
    sums: dict[str, Tensor] = {}
    for terms in logged:
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + v
    return total_sum, sums


def backward(total: Tensor) -> None:
    """``total.backward()`` of a step's scalar loss: the autograd engine run as ``Tensor.backward`` runs it (the
    seed gradient ``ones_like(total)``, the graph freed), without the Python around it that handles tensor
    subclasses, several outputs and given gradients first (~35 us a step of W2's MLP on a 2-core AMD EPYC);
    those cases, and a torch without the engine's entry point, take ``total.backward()``."""
    if _RUN_BACKWARD is None or type(total) is not Tensor or total.dim() != 0:
        total.backward()
        return
    _RUN_BACKWARD((total,), (torch.ones_like(total, memory_format=torch.preserve_format),), False, False, (),
                  allow_unreachable=True, accumulate_grad=True)


def train_metrics(total: Tensor, sums: dict[str, Tensor], num_steps: int) -> dict[str, float]:
    """A client's training metrics: the mean total loss and the mean of each loss term over its
    ``num_steps`` steps, from their sums (scalars, read at once: one synchronisation on a GPU), and the
    number of steps."""
    n = max(num_steps, 1)
    values = host_values({"loss": total, **{k: v for k, v in sums.items() if v is not total}})
    metrics = {"loss": values.pop("loss") / n, "steps": num_steps}
    metrics.update({k: metrics["loss"] if v is total else values[k] / n for k, v in sums.items()})
    return metrics
