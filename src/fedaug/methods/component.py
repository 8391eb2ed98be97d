"""The component interface: one federated method part, its client hooks and its server hooks.

A run's method is one server rule, any local objectives and any augmentations (DESIGN.md, "A method
is a composition"). Every hook is optional and a documented no-op by default (Lightning's
``Callback``); a component only talks to its own counterpart on the other side, through its named
message part, and keeps its per-client and server state as plain dicts of tensors and scalars
(invariant 2).

Every phase of a round is the same exchange (:data:`PHASES`): ``"train"`` (local training),
``"query"`` (after aggregation, the round's clients answer with the new global state; it runs only
when a component replies in it, e.g. FLea's features, KDD 2024 Alg. 1 lines 14-17) and
``"evaluate"`` (the global model on every client). A component takes part in the phases it lists
in :attr:`Component.phases`; per phase and per client::

    server: downlink(server, client_id, phase)  -> part, checked on the client against downlink_spec(model, phase)
    client: receive(ctx, part, state)             ctx.phase says which phase
            train: per batch transform_batch -> step (replaceable; calls the closure: forward
                   (replaceable) -> task_loss (replaceable) + loss_terms -> backward -> before_step;
                   then optimizer.step)
            evaluate: transform_batch (ctx.training False) and the task's meters
            reply(ctx) -> (part, new per-client state)   train and query; the state is kept after train only
    server: aggregate(server, uplinks, phase)    over the accepted parts (checked against
                                                 uplink_spec(server, phase)), sorted by client id

``setup(model, input_shape)`` prepares each worker model once (attach layers) and
``init_server(model, num_clients)`` makes the initial server state. The engine validates and counts
every part of every phase in one place (:func:`fedaug.engine.server.exchange.exchange`). Grouped training
(``train.group_clients > 1``, :mod:`fedaug.engine.client.grouped`) calls the ``group_*`` forms of the client
hooks instead, for the components that offer them (:meth:`Component.group_blocker`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch
from torch import Tensor, nn

from fedaug.config.schema import TrainConfig
from fedaug.core.payload import Part, Spec
from fedaug.core.rng import generator
from fedaug.data.base import Split
from fedaug.privacy.release import GaussianRelease
from fedaug.metrics.tasks import Task

State = dict[str, Any]
#: the phases of a round, in order: local training, the post-aggregation query, evaluation.
Phase = Literal["train", "query", "evaluate"]
PHASES: tuple[Phase, ...] = get_args(Phase)
#: a component's place in a recipe: the one server rule, local objectives, augmentations.
Role = Literal["server", "objective", "augmentation"]


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
        phase: the phase this context runs (:data:`PHASES`); :attr:`training` is ``phase == "train"``.
        task: the task's loss and metric (set by the engine).
        num_steps: the number of local optimiser steps of this round, known from
            ``receive`` on (set by the engine; 0 during evaluation).
        component: the name of the component this view belongs to (set by the recipe).
        eval_inputs: during local training (set by the engine; ``None`` elsewhere), the input
            pipeline evaluation applies, up to this component: the ``transform_batch`` of every
            component before it in the recipe, in the evaluate phase (e.g. FedRDN's normalisation
            with the client's own statistics, Eq. 7). Valid from this component's ``receive`` on.
        device: where the worker model, the client's data and the received parts are (set by the
            engine); a component creates its tensors here (``device=ctx.device``, or like the
            tensors it combines them with) and its random streams live here (:meth:`rng`).
        train: the run's local training options (optimiser, momentum, steps; set by the engine), so
            that a component knows at ``receive`` what the steps will be (SCAFFOLD's and FedNova's
            normalisers) instead of reading it off the optimiser during a step.
    """

    model: nn.Module
    client_id: int
    round: int
    seed: int
    data: Split
    lr: float = 0.0
    phase: Phase = "train"
    task: Task | None = None
    num_steps: int = 0
    component: str = ""
    eval_inputs: Callable[[Batch], Batch] | None = None
    device: torch.device = torch.device("cpu")
    train: TrainConfig | None = None
    _streams: dict[tuple[str, str], torch.Generator] = field(default_factory=dict, repr=False)

    @property
    def training(self) -> bool:
        """Whether this is local training (``phase == "train"``); ``False`` in the query and evaluation."""
        return self.phase == "train"

    def rng(self, purpose: str) -> torch.Generator:
        """This component's random stream for ``purpose``, seeded from
        (seed, round, client id, component, purpose), on :attr:`device` (draw with
        ``device=g.device``); repeated calls continue the same stream."""
        key = (self.component, purpose)
        if key not in self._streams:
            self._streams[key] = generator(
                self.seed, "client", self.round, self.client_id, self.component, purpose, device=self.device
            )
        return self._streams[key]

    def stream_states(self) -> dict[tuple[str, str], Tensor]:
        """The states of the random streams made so far (this context's and its views'), for
        :meth:`rewind_streams`."""
        return {key: g.get_state() for key, g in self._streams.items()}

    def rewind_streams(self, states: Mapping[tuple[str, str], Tensor]) -> None:
        """The random streams as :meth:`stream_states` found them: each set back to its state, the streams
        made since dropped (they start anew when drawn from)."""
        for key in [k for k in self._streams if k not in states]:
            del self._streams[key]
        for key, state in states.items():
            self._streams[key].set_state(state)

    def view(self, component: str) -> "ClientCtx":
        """A view of this context for ``component``; views share their random streams' table."""
        return self.with_fields(component=component)

    def with_fields(self, **changes: Any) -> "ClientCtx":
        """A copy with ``changes`` (``dataclasses.replace`` without re-running ``__init__``: it is paid
        several times per client; the random streams' table stays shared)."""
        copy = object.__new__(ClientCtx)
        copy.__dict__.update(self.__dict__, **changes)
        return copy


Closure = Callable[[], Tensor]
#: how a replaced forward pass runs (part of) a model with the step's parameters
#: (:meth:`Component.group_replace_forward`)
Runner = Callable[..., Any]


def transform_inputs(components: Sequence["Component"], views: Mapping[str, ClientCtx], batch: Batch) -> Batch:
    """``batch`` through each component's ``transform_batch`` in order, each with its own view."""
    for c in components:
        batch = c.transform_batch(views[c.name], batch)
    return batch


class Component:
    """Base class of server rules, local objectives and augmentations; every hook is a no-op by default.

    Subclasses set :attr:`name` (the registry key, which namespaces state, message parts and
    loss terms), :attr:`role` and, if they exchange anything outside training, :attr:`phases`.
    Constructor arguments are the component's options; they are keyword-only and validated in
    ``__init__`` with :class:`~fedaug.core.errors.ConfigError`.
    """

    name: ClassVar[str]
    #: ``"server"``: the one server rule of a recipe (owns the model weights and their aggregation);
    #: ``"objective"``: a local objective (loss terms, the task loss or the step), any number;
    #: ``"augmentation"``: an input or feature augmentation, any number.
    role: ClassVar[Role] = "augmentation"
    #: the phases this component takes part in (receives, replies): ``"train"`` always.
    phases: ClassVar[tuple[Phase, ...]] = ("train",)
    #: whether the component needs a global model on the client (FedProx's anchor, MOON's global
    #: representation, FLea's teacher); a server rule that keeps no global model refuses them.
    needs_global_model: ClassVar[bool] = False
    #: (server rules) whether clients train from a global model (``False``: FedProto's local models).
    keeps_global_model: ClassVar[bool] = True
    #: whether the component's loss differentiates a gradient again (FedMix's input-gradient term),
    #: so every layer of the model must support double backward.
    needs_double_backward: bool = False
    #: whether the layers the component attaches support double backward (``False``: the FFA layers
    #: on the compiled kernel); a recipe refuses this with a component that needs it.
    double_backward: bool = True
    #: the artefacts this component releases under a Gaussian mechanism (set by its DP options;
    #: read by the privacy accountant, :mod:`fedaug.privacy.release`); none by default.
    releases: tuple[GaussianRelease, ...] = ()
    #: the options (constructor arguments) whose values may differ between the runs of a pack (``fedaug compare
    #: --pack``, :mod:`fedaug.engine.fleet.packed`): those read only on the server, in the client's own hooks
    #: around the batched step (``receive``, ``reply``, ``transform_batch``, ``group_inputs``) or through its
    #: captured tensors. The batched step reads the others from the first run's component for every run of a
    #: pack, so the runs of a pack agree on them (:mod:`fedaug.report.packing`). None by default.
    pack_free: ClassVar[frozenset[str]] = frozenset()

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        """Prepare a worker model once (e.g. attach layers); ``input_shape`` is ``(C, *spatial)``
        of one sample. Called once per worker, in recipe order (layers at one module chain in it)."""

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        """Receive this component's part of phase ``ctx.phase`` and its per-client ``state``."""

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

    # --- grouped training (train.group_clients > 1, fedaug.engine.client.grouped) ----------------------
    def group_blocker(self) -> str:
        """Why this component cannot train a group of clients as one batched model, or ``""`` when it
        can (it then gives a grouped form of every client hook it overrides: ``receive`` ->
        :meth:`group_capture`, ``reply`` -> :meth:`group_restore`, ``loss_terms`` ->
        :meth:`group_loss_terms`, ``before_step`` -> :meth:`group_before_step`; ``forward``,
        ``task_loss``, ``step`` and ``transform_batch`` have none). Default: it cannot."""
        return "it has no grouped form of its client hooks"

    def group_capture(self, ctx: ClientCtx) -> State:
        """Right after :meth:`receive` for ``ctx``'s client: the per-client tensors that the grouped
        step reads and :meth:`reply` needs (what ``receive`` kept on ``self``, which the next client's
        ``receive`` overwrites), as a nested dict of tensors; the engine stacks them over the group
        (shapes must agree across clients)."""
        return {}

    def group_inputs(self, ctx: ClientCtx, batch_size: int) -> State:
        """Before each grouped step, outside the batched function: this client's random draws of the
        step from its own streams (``ctx.rng``), in the order the one-at-a-time step draws them; the
        engine stacks them over the group and hands each client's to :meth:`group_forward`."""
        return {}

    def group_forward(self, captured: State, inputs: State) -> AbstractContextManager[None]:
        """Inside the batched function (``torch.func.vmap``; ``captured`` and ``inputs`` are one client's
        slices): a context in which this client's forward pass runs, e.g. attached layers that use
        the drawn noise instead of drawing. Tensors of ``captured`` updated in place there (running
        statistics) are what :meth:`group_restore` receives."""
        return nullcontext()

    def group_replace_forward(self, run: Runner, captured: State, inputs: State, batch: Batch
                              ) -> tuple[Tensor, Batch, dict[str, Tensor]]:
        """The step form of a replaced :meth:`forward` (every execution calls it, also eagerly; at most one
        component per recipe replaces the forward pass): the output, the batch the task loss sees, and this
        component's own loss terms of the step, from the client's ``captured`` tensors and its step
        ``inputs`` (:meth:`group_inputs`). ``run(fn, *args)`` runs ``fn(model, *args)`` with the step's
        parameters (the worker model's own, or one client's of a group); ``run(fn, *args, module=m,
        state=s)`` runs ``fn(m, *args)`` with ``m``'s parameters and buffers ``s`` where the step is batched
        (``m`` as it is otherwise, e.g. FLea's frozen global model). Default: the model on the batch, no terms."""
        return run(lambda model, x: model(x), batch.x), batch, {}

    def group_loss_terms(self, params: Mapping[str, Tensor], captured: State, batch: Batch,
                         out: Tensor) -> dict[str, Tensor]:
        """The step form of :meth:`loss_terms` (every execution calls it; inside the batched function of
        grouped training): one client's extra loss terms from its trainable parameters ``params``
        (``{name: tensor}``, differentiable), its ``captured`` tensors, the step's ``batch`` (as the task
        loss sees it) and the model's output ``out``."""
        return {}

    def group_before_step(self, grads: Mapping[str, Tensor], captured: State,
                          optimizer: torch.optim.Optimizer) -> None:
        """:meth:`before_step` of the whole group: adjust ``grads`` (``{name: (G, *shape)}``, the stacked
        trainable parameters' gradients) in place; ``captured`` is stacked the same way; ``optimizer``
        steps the stacked parameters (torch.optim's own rule)."""

    def group_restore(self, ctx: ClientCtx, captured: State) -> None:
        """Before :meth:`reply` for ``ctx``'s client (the model holds its trained weights): put back
        what :meth:`group_capture` took, as it stands after training."""

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        """This component's uplink part of phase ``ctx.phase`` and its new per-client state.

        Called after training (``"train"``) and in the query (``"query"``: ``ctx.model`` holds the
        new global model as this client receives it, in eval mode, without gradients); the state
        is kept after training only.
        """
        return {}, {}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        """The initial server state, from a freshly set-up model and the federation's size."""
        return {}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        """The part sent to ``client_id`` in ``phase`` (a fresh dict per client)."""
        return {}

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        """What the client accepts as this component's part of ``phase``."""
        return {}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        """What the server accepts as this component's reply in ``phase``; a non-empty spec in
        ``"query"`` makes the engine run the query phase."""
        return {}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train",
                  rng: torch.Generator | None = None) -> State:
        """The new server state from the accepted replies of ``phase`` (sorted by client id).

        ``rng`` is the server's random stream for this component, round and phase, seeded from
        (seed, "server", round, component, phase) (e.g. DP-FedAvg's server-side noise); the engine
        passes it to every ``aggregate`` that takes an ``rng`` parameter (one written without it
        still works), ``None`` where a caller has none."""
        return server
