"""The client side of every phase of a round, on one worker model that serves any client.

A :class:`Worker` is what runs where the data is: in the in-process engine one worker trains every
client in turn (memory stays flat in the number of clients, DESIGN.md invariant 4); on Flower each
SuperNode's ClientApp holds one. It checks what it receives (a bad server message fails loudly on
the client, invariant 3) and then runs the hooks; it keeps no per-client state of its own: the
caller passes the client's state in and stores what comes back (invariant 2).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from fedaug.config.schema import RunConfig
from fedaug.core.payload import Message, validate_part
from fedaug.core.rng import scoped_global_seed
from fedaug.data.base import ClientData
from fedaug.engine.attack import Attack
from fedaug.engine.evaluate import evaluate_client
from fedaug.engine.fleet import Reply
from fedaug.engine.local import train_client
from fedaug.engine.query import answer_query
from fedaug.layers.attach import check_chains
from fedaug.methods.component import PHASES, ClientCtx, Phase, State
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import Task
from fedaug.models.registry import build_model


def build_worker_model(cfg: RunConfig, recipe: Recipe, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The run's model, initialised from (seed, "init") and set up by every component, in recipe order.

    The server and every worker build it the same way, so the server's initial state and the
    clients' specs agree wherever they run.

    Args:
        input_shape: ``(C, *spatial)`` of one sample.

    Raises:
        ConfigError: attached layers that cannot compose (:func:`~fedaug.layers.attach.check_chains`).
    """
    with scoped_global_seed(cfg.seed, "init"):
        model = build_model(cfg.model.name, input_shape[0], num_classes, **cfg.model.options)
    for c in recipe.components:
        c.setup(model, tuple(input_shape))
    check_chains(model)
    return model


class Worker:
    """One worker model and the client side of every phase of a method.

    Args:
        cfg: the run configuration (seed, local training and evaluation options).
        recipe: the method, as the clients run it.
        model: a model from :func:`build_worker_model`; its weights are overwritten by every call.
        task: the task's loss and metric.
        num_clients: the federation's size (which clients ``[attack]`` names depends on it).
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, model: nn.Module, task: Task, num_clients: int) -> None:
        self.cfg, self.recipe, self.model, self.task = cfg, recipe, model, task
        self.attack = Attack(cfg, recipe, task, num_clients)
        self.down_specs = {phase: {c.name: c.downlink_spec(model, phase) for c in recipe.participants(phase)}
                           for phase in PHASES}

    def run(self, phase: Phase, client_id: int, r: int, lr: float, client: ClientData, message: Message,
            state: Mapping[str, State]) -> Reply:
        """Check the phase's message, then run ``phase`` for ``client_id``: train (:func:`train_client`),
        answer the query (:func:`answer_query`) or evaluate (:func:`evaluate_client`); an attacking
        client (``[attack]``, :mod:`fedaug.engine.attack`) flips its labels before training or
        rewrites its reply after it.

        Raises:
            PayloadError: a part of ``message`` is missing or fails its spec (a bad server message
                fails loudly on the client, DESIGN.md invariant 3).
        """
        where = {"train": "downlink", "query": "post-aggregation downlink", "evaluate": "evaluation downlink"}[phase]
        for name, spec in self.down_specs[phase].items():
            validate_part(message.get(name), spec, f"round {r}: {where} to client {client_id}, part '{name}'")
        data = self.attack.training_split(phase, client_id, r, client.train)
        ctx = ClientCtx(self.model, client_id, r, self.cfg.seed, data, lr=lr, phase=phase, task=self.task)
        if phase == "train":
            reply = train_client(self.recipe, ctx, message, dict(state), self.cfg.train)
        elif phase == "query":
            reply = answer_query(self.recipe, ctx, message, state)
        else:
            return evaluate_client(self.recipe, ctx, client, message, state, self.cfg.eval.batch_size)
        return self.attack.reply(phase, client_id, r, message, reply)
