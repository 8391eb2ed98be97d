"""The component interface: one federated method part, its client hooks and its server hooks.

A run's method is a base algorithm plus augmentations (DESIGN.md, "A method is a composition").
Every hook is optional and a documented no-op by default (Lightning's ``Callback``); a component
only talks to its own counterpart on the other side, through its named message part, and keeps
its per-client and server state as plain dicts of tensors and scalars (invariant 2).

Client side of one round, in call order::

    setup(model)                       once per worker model
    round_start(ctx, part, state)      receive the downlink part, restore per-client state
    per batch: transform_batch -> step (replaceable; calls the closure: forward (replaceable)
               -> task_loss (replaceable) + loss_terms -> backward -> before_step; then
               optimizer.step)
    round_end(ctx) -> (uplink part, new per-client state)
    after_aggregate(ctx, state) -> part  only if overridden: after aggregation, with the new global model

Server side: ``setup_server`` and ``init_server`` once, then per round ``downlink`` for each sampled client and
``aggregate`` over the accepted uplinks (sorted by client id), then, if some component overrides
``after_aggregate``, ``after_aggregate_update`` over those clients' post-aggregation parts. Evaluation of the global model on
client ``k`` calls ``eval_start`` and then ``transform_batch`` with ``ctx.training == False``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from fedaug.core.payload import Part, Spec
from fedaug.core.rng import generator
from fedaug.data.base import Split
from fedaug.metrics.tasks import Task

State = dict[str, Any]


@dataclass(frozen=True)
class Batch:
    """One mini-batch.

    Args:
        x: inputs ``(B, C, *spatial)``.
        y: targets: class indices ``(B,)`` int64, soft labels ``(B, K)`` float, or masks
            ``(B, *spatial)`` int64.
    """

    x: Tensor
    y: Tensor


@dataclass(frozen=True)
class Uplink:
    """What the server received from one client for one component.

    Args:
        client_id: logical client id.
        num_samples: the client's number of training samples (aggregation weight).
        part: the component's uplink part.
    """

    client_id: int
    num_samples: int
    part: Part


@dataclass
class ClientCtx:
    """What a component sees of the client it runs on, for one round (or one evaluation).

    Args:
        model: the worker model (shared by all clients; its weights are the base's business).
        client_id: logical client id.
        round: 1-based round number (0 for evaluation of the initial model).
        seed: the run's seed.
        data: the client's training split.
        lr: this round's learning rate.
        training: ``True`` during local training, ``False`` during evaluation.
        task: the task's loss and metric (set by the engine).
        num_steps: the number of local optimiser steps of this round, known from
            ``round_start`` on (set by the engine; 0 during evaluation).
        component: the name of the component this view belongs to (set by the recipe).
        eval_inputs: during local training (set by the engine; ``None`` elsewhere), the input
            pipeline evaluation applies, up to this component: the ``transform_batch`` of every
            component before it in the recipe, with ``training=False`` (e.g. FedRDN's normalisation
            with the client's own statistics, Eq. 7). Valid from this component's ``round_start`` on.
    """

    model: nn.Module
    client_id: int
    round: int
    seed: int
    data: Split
    lr: float = 0.0
    training: bool = True
    task: Task | None = None
    num_steps: int = 0
    component: str = ""
    eval_inputs: Callable[[Batch], Batch] | None = None
    _streams: dict[tuple[str, str], torch.Generator] = field(default_factory=dict, repr=False)

    def rng(self, purpose: str) -> torch.Generator:
        """This component's random stream for ``purpose``, seeded from
        (seed, round, client id, component, purpose); repeated calls continue the same stream."""
        key = (self.component, purpose)
        if key not in self._streams:
            self._streams[key] = generator(
                self.seed, "client", self.round, self.client_id, self.component, purpose
            )
        return self._streams[key]

    def view(self, component: str) -> "ClientCtx":
        """A view of this context for ``component``; views share their random streams' table."""
        return ClientCtx(
            self.model, self.client_id, self.round, self.seed, self.data,
            self.lr, self.training, self.task, self.num_steps, component, self.eval_inputs, self._streams,
        )


Closure = Callable[[], Tensor]


def transform_inputs(components: Sequence["Component"], views: Mapping[str, ClientCtx], batch: Batch) -> Batch:
    """``batch`` through each component's ``transform_batch`` in order, each with its own view."""
    for c in components:
        batch = c.transform_batch(views[c.name], batch)
    return batch


class Component:
    """Base class of base algorithms and augmentations; every hook is a no-op by default.

    Subclasses set :attr:`name` (the registry key, which namespaces state, message parts and
    loss terms) and :attr:`role`. Constructor arguments are the component's options; they are
    keyword-only and validated in ``__init__`` with :class:`~fedaug.core.errors.ConfigError`.
    """

    name: ClassVar[str]
    role: ClassVar[Literal["base", "augmentation"]] = "augmentation"

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module) -> None:
        """Prepare a worker model once (e.g. attach layers). Called once per worker."""

    def round_start(self, ctx: ClientCtx, part: Part, state: State) -> None:
        """Receive this component's downlink ``part`` and restore its per-client ``state``."""

    def transform_batch(self, ctx: ClientCtx, batch: Batch) -> Batch:
        """Transform an input batch (training and, with ``ctx.training`` False, evaluation)."""
        return batch

    def forward(self, ctx: ClientCtx, batch: Batch) -> tuple[Tensor, Batch]:
        """Replaceable (at most one component per recipe): the training forward pass.

        Returns:
            The output ``(B, K)`` logits (or ``(B, K, *spatial)``) and the batch whose targets
            the task loss uses (a component may mix targets, e.g. soft labels ``(B, K)``).
        """
        return ctx.model(batch.x), batch

    def task_loss(self, ctx: ClientCtx, out: Tensor, batch: Batch) -> Tensor:
        """Replaceable (at most one component per recipe): the task loss of ``out`` against
        ``batch.y`` (default: the task's cross-entropy, + soft Dice for segmentation)."""
        return ctx.task.loss(out, batch.y)

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        """Extra loss terms (scalars), added to the task loss and logged as ``name/key``."""
        return {}

    def before_step(self, ctx: ClientCtx, optimizer: torch.optim.Optimizer) -> None:
        """Adjust gradients after ``backward`` and before ``optimizer.step()``."""

    def step(self, ctx: ClientCtx, optimizer: torch.optim.Optimizer, closure: Closure) -> Tensor:
        """Replaceable (at most one component per recipe): one optimisation step.

        ``closure()`` zeroes the gradients, runs the forward pass, back-propagates the total loss,
        runs every component's :meth:`before_step`, and returns the detached total loss. The
        default calls it once and steps; a replacement (e.g. SAM) may call it several times.
        """
        loss = closure()
        optimizer.step()
        return loss

    def round_end(self, ctx: ClientCtx) -> tuple[Part, State]:
        """Produce the uplink part and the new per-client state."""
        return {}, {}

    def eval_start(self, ctx: ClientCtx, server: State, state: State) -> None:
        """Prepare ``ctx.model`` to evaluate the global model on client ``ctx.client_id``."""

    def after_aggregate(self, ctx: ClientCtx, state: State) -> Part:
        """Post-aggregation query (FLea, KDD 2024, Alg. 1 lines 14-17): an extra uplink part.

        Runs on every client whose uplink was accepted this round, after aggregation, with
        ``ctx.model`` holding the NEW global model as that client receives it (the base's downlink,
        loaded by the base's ``round_start``), in eval mode, without gradients; ``ctx.training``
        is False. The engine runs this phase only if a component overrides this hook, validates
        the part against :meth:`after_aggregate_spec` and counts its bytes as uplink (and the
        re-sent model as downlink).
        """
        return {}

    # --- server side -----------------------------------------------------------------------
    def setup_server(self, num_clients: int) -> None:
        """Learn the number of clients in the federation (once, before :meth:`init_server`)."""

    def init_server(self, model: nn.Module) -> State:
        """The initial server state, from a freshly initialised model."""
        return {}

    def downlink(self, server: State, client_id: int) -> Part:
        """The part sent to ``client_id`` this round (a fresh dict per client)."""
        return {}

    def downlink_spec(self, model: nn.Module) -> Spec:
        """What the client accepts as this component's downlink part."""
        return {}

    def uplink_spec(self, server: State) -> Spec:
        """What the server accepts as this component's uplink part."""
        return {}

    def aggregate(self, server: State, uplinks: Sequence[Uplink]) -> State:
        """The new server state from the accepted uplinks (sorted by client id)."""
        return server

    def after_aggregate_spec(self, server: State) -> Spec:
        """What the server accepts as this component's :meth:`after_aggregate` part."""
        return {}

    def after_aggregate_update(self, server: State, uplinks: Sequence[Uplink]) -> State:
        """The server state from the accepted :meth:`after_aggregate` parts (sorted by client id)."""
        return server
