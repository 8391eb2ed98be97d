"""The client side of every phase of a round, on one worker model that serves any client.

A :class:`Worker` is what runs where the data is: in the in-process engine one worker trains every
client in turn (memory stays flat in the number of clients, DESIGN.md invariant 4); on Flower each
SuperNode's ClientApp holds one. It checks what it receives (a bad server message fails loudly on
the client, invariant 3) and then runs the hooks; it keeps no per-client state of its own: the
caller passes the client's state in and stores what comes back (invariant 2).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from fedaug.config.schema import RunConfig
from fedaug.core.device import CPU, check_precision, float32_math, module_device, to_device
from fedaug.core.errors import ConfigError
from fedaug.core.payload import Message, PassedParts
from fedaug.core.rng import scoped_global_seed
from fedaug.data.base import ClientData
from fedaug.engine.client.attack import Attack
from fedaug.engine.client.evaluate import evaluate_client
from fedaug.engine.client.finetune import finetune_meters, with_finetuned
from fedaug.engine.protocol import Reply
from fedaug.engine.client.graphed import graphed_steps
from fedaug.engine.client.grouped_graphs import GroupGraphs
from fedaug.engine.client.grouped import Started, Trained, finish_client, start_client, train_stacked
from fedaug.engine.client.training import LocalOptimizer, train_client
from fedaug.engine.client.query import answer_query
from fedaug.layers.attach import check_chains
from fedaug.methods.component import PHASES, ClientCtx, Phase, State
from fedaug.methods.recipe import Recipe, overrides
from fedaug.metrics.tasks import Task
from fedaug.models.registry import build_model


def build_worker_model(cfg: RunConfig, recipe: Recipe, input_shape: tuple[int, ...], num_classes: int,
                       device: torch.device = CPU) -> nn.Module:
    """The run's model, initialised from (seed, "init") on the CPU, moved to ``device`` and set up
    there by every component, in recipe order.

    The server and every worker build it the same way, so the server's initial state and the
    clients' specs agree wherever they run (the initial weights are the CPU's on every device).

    Args:
        input_shape: ``(C, *spatial)`` of one sample.
        device: where the model lives (a resolved device, :func:`~fedaug.core.device.resolve_device`).

    Raises:
        ConfigError: attached layers that cannot compose (:func:`~fedaug.layers.attach.check_chains`).
    """
    with scoped_global_seed(cfg.seed, "init"):
        model = build_model(cfg.model.name, input_shape[0], num_classes, **cfg.model.options)
    model.to(device)
    for c in recipe.components:
        c.setup(model, tuple(input_shape))
    check_chains(model)
    return model


class Worker:
    """One worker model and the client side of every phase of a method, on the model's device.

    What a call receives (the message, the client's state and data) is moved to that device first
    (a no-op for what is there already: in-process, everything); the client's data with
    non-blocking copies, from pinned memory where the caller pinned it (CUDA).

    Args:
        cfg: the run configuration (seed, precision, local training and evaluation options).
        recipe: the method, as the clients run it.
        model: a model from :func:`build_worker_model`; its weights are overwritten by every call.
        task: the task's loss and metric.
        num_clients: the federation's size (which clients ``[attack]`` names depends on it).

    Raises:
        ConfigError: ``cfg.precision`` that the model's device cannot autocast, ``"16-mixed"``
            with a component that replaces the optimiser step (its own steps, e.g. SAM's two
            closure calls, cannot take the gradient scaler's), or ``train.cuda_graph = true`` on a
            model that is not on a CUDA device.
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, model: nn.Module, task: Task, num_clients: int) -> None:
        self.cfg, self.recipe, self.model, self.task = cfg, recipe, model, task
        self.attack = Attack(cfg, recipe, task, num_clients, frozenset(n for n, _ in model.named_buffers()))
        self.device = module_device(model)
        check_precision(self.device, cfg.precision)
        stepper = recipe.replacer["step"]
        if cfg.precision == "16-mixed" and overrides(stepper, "step"):
            raise ConfigError(f"precision='16-mixed' cannot scale the gradients of '{stepper.name}', which replaces "
                              "the optimiser step; use precision='bf16-mixed' (no gradient scaler) or '32'")
        self.down_specs = {phase: {c.name: c.downlink_spec(model, phase) for c in recipe.participants(phase)}
                           for phase in PHASES}
        self.checked = PassedParts()  # the server's tensors are read once, not once per client
        #: the float32 math of ``cfg.precision`` around each call: TF32 switches are CUDA's (cuBLAS, cuDNN),
        #: so a worker on another device leaves them alone (setting and restoring them costs a small
        #: client's call 20 us)
        self.math: Callable[[], contextlib.AbstractContextManager] = (
            functools.partial(float32_math, cfg.precision) if self.device.type == "cuda" else contextlib.nullcontext)
        self.optimizers = LocalOptimizer(cfg.train)
        #: the captured local steps (train.cuda_graph), or None: eager steps
        self.graphs = graphed_steps(cfg.train, recipe, model, cfg.precision)
        #: a group's captured steps (train.cuda_graph with train.group_clients > 1, or in a pack), or None
        self.group_graphs = GroupGraphs(self.graphs.capture) if self.graphs is not None else None

    @property
    def captures(self) -> bool:
        """Whether this worker's steps replay captured graphs (``train.cuda_graph``; :attr:`graphs`)."""
        return self.graphs is not None

    def _receive(self, phase: Phase, client_id: int, r: int, lr: float, client: ClientData, message: Message,
                 state: Mapping[str, State]) -> tuple[ClientCtx, Message, dict[str, State], ClientData]:
        """Check the phase's message and move what the client runs on to the device: its context (the
        training split an attacker's label flip changed), message, state and data."""
        where = {"train": "downlink", "query": "post-aggregation downlink", "evaluate": "evaluation downlink"}[phase]
        for name, spec in self.down_specs[phase].items():
            self.checked.validate(message.get(name), spec, lambda: f"round {r}: {where} to client {client_id}, part "
                                  f"'{name}'", (phase, name))
        dev, non_blocking = self.device, self.device.type == "cuda"
        message, moved = to_device(message, dev), to_device(dict(state), dev)
        if phase == "evaluate":
            client = client.to(dev, non_blocking)
        data = self.attack.training_split(phase, client_id, r, client.train.to(dev, non_blocking))
        ctx = ClientCtx(self.model, client_id, r, self.cfg.seed, data, lr=lr, phase=phase, task=self.task,
                        device=dev)
        return ctx, message, moved, client

    def train_group(self, r: int, lr: float,
                    jobs: Sequence[tuple[int, ClientData, Message, Mapping[str, State]]]) -> list[Reply]:
        """Train a group of round ``r``'s clients at once (:mod:`~fedaug.engine.client.grouped`; one alone:
        :meth:`run`): :meth:`start_group`, the group's steps, :meth:`finish_group`.

        Raises:
            PayloadError: as :meth:`run`.
        """
        if len(jobs) == 1:
            return [self.run("train", jobs[0][0], r, lr, *jobs[0][1:])]
        started = self.start_group(r, lr, jobs)
        return self.finish_group(r, started, self.train_started([s for s, _ in started]))

    def train_started(self, group: Sequence[Started]) -> list[Trained]:
        """The steps of a group of started clients (this worker's, or a pack's with other runs' clients) at this
        worker's float32 precision: replayed from captured graphs where the run captures
        (:class:`~fedaug.engine.client.grouped_graphs.GroupGraphs`), else batched eagerly
        (:func:`~fedaug.engine.client.grouped.train_stacked`)."""
        with self.math():
            return self.group_graphs.train(group) if self.group_graphs is not None else train_stacked(group)

    def start_group(self, r: int, lr: float, jobs: Sequence[tuple[int, ClientData, Message, Mapping[str, State]]]
                    ) -> list[tuple[Started, Message]]:
        """Each job ``(client id, data, message, state)`` of round ``r`` checked and moved as :meth:`run` does,
        then started on this worker's model (:func:`~fedaug.engine.client.grouped.start_client`); with each, the
        message it received (:meth:`finish_group` needs it).

        Raises:
            PayloadError: as :meth:`run`.
        """
        out = []
        for cid, client, message, state in jobs:
            ctx, moved, states, _ = self._receive("train", cid, r, lr, client, message, state)
            with self.math():
                out.append((start_client(self.recipe, ctx, moved, states, self.cfg.train), moved))
        return out

    def finish_group(self, r: int, started: Sequence[tuple[Started, Message]], trained: Sequence[Trained]
                     ) -> list[Reply]:
        """Each started client's reply from what its group's steps left (:func:`~fedaug.engine.client.grouped.finish_client`),
        an attacker's reply rewritten after."""
        with self.math():
            replies = [finish_client(s, t) for (s, _), t in zip(started, trained)]
        return [self.attack.reply("train", s.ctx.client_id, r, m, reply) for (s, m), reply in zip(started, replies)]

    def run(self, phase: Phase, client_id: int, r: int, lr: float, client: ClientData, message: Message,
            state: Mapping[str, State]) -> Reply:
        """Check the phase's message, then run ``phase`` for ``client_id``: train (:func:`train_client`),
        answer the query (:func:`answer_query`) or evaluate (:func:`evaluate_client`; with
        ``eval.finetune_steps``, then the fine-tuned model too: :func:`finetune_meters`); an attacking
        client (``[attack]``, :mod:`fedaug.engine.client.attack`) flips its labels before training or
        rewrites its reply after it.

        Raises:
            PayloadError: a part of ``message`` is missing or fails its spec (a bad server message
                fails loudly on the client, DESIGN.md invariant 3).
        """
        with self.math():  # "32" is true float32 on CUDA too (no TF32)
            return self._run(phase, client_id, r, lr, client, message, state)

    def _run(self, phase: Phase, client_id: int, r: int, lr: float, client: ClientData, message: Message,
             state: Mapping[str, State]) -> Reply:
        ctx, message, state, client = self._receive(phase, client_id, r, lr, client, message, state)
        if phase == "train":
            reply = train_client(self.recipe, ctx, message, state, self.cfg.train, self.cfg.precision, self.optimizers,
                                 self.graphs)
            if self.graphs is not None and self.graphs.refused:  # train.cuda_graph = "auto": eager from here on
                self.graphs = self.group_graphs = None
        elif phase == "query":
            reply = answer_query(self.recipe, ctx, message, state)
        else:
            reply = evaluate_client(self.recipe, ctx, client, message, state, self.cfg.eval.batch_size,
                                    self.cfg.precision)
            if self.cfg.eval.finetune_steps:  # personalised evaluation (eval.finetune_steps)
                reply = with_finetuned(reply, finetune_meters(self.recipe, ctx, client, message, state, self.cfg,
                                                              self.down_specs["train"]))
            return reply
        return self.attack.reply(phase, client_id, r, message, reply)
