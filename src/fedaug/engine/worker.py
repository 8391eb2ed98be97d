"""The client side of every phase of a round, on one worker model that serves any client.

A :class:`Worker` is what runs where the data is: in the in-process engine one worker trains every
client in turn (memory stays flat in the number of clients, DESIGN.md invariant 4); on Flower each
SuperNode's ClientApp holds one. It checks what it receives (a bad server message fails loudly on
the client, invariant 3) and then runs the hooks; it keeps no per-client state of its own: the
caller passes the client's state in and stores what comes back (invariant 2).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fedaug.config.schema import RunConfig
from fedaug.core.payload import Message, Part, validate_part
from fedaug.core.rng import scoped_global_seed
from fedaug.data.base import ClientData, Split
from fedaug.engine.after_aggregate import answer_query
from fedaug.engine.evaluate import evaluate_client
from fedaug.engine.local import ClientResult, train_client
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import Meter, Task
from fedaug.models.registry import build_model


def build_worker_model(cfg: RunConfig, recipe: Recipe, in_channels: int, num_classes: int) -> nn.Module:
    """The run's model, initialised from (seed, "init") and set up by every component.

    The server and every worker build it the same way, so the server's initial state and the
    clients' specs agree wherever they run.
    """
    with scoped_global_seed(cfg.seed, "init"):
        model = build_model(cfg.model.name, in_channels, num_classes, **cfg.model.options)
    for c in recipe.components:
        c.setup(model)
    return model


class Worker:
    """One worker model and the client-side hooks of a method.

    Args:
        cfg: the run configuration (seed, local training and evaluation options).
        recipe: the method, as the clients run it.
        model: a model from :func:`build_worker_model`; its weights are overwritten by every call.
        task: the task's loss and metric.
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, model: nn.Module, task: Task) -> None:
        self.cfg, self.recipe, self.model, self.task = cfg, recipe, model, task
        self.down_specs = {c.name: c.downlink_spec(model) for c in recipe.components}

    def train(self, client_id: int, r: int, lr: float, data: Split, message: Message,
              state: Mapping[str, State]) -> ClientResult:
        """Check the round's downlink, then train ``client_id`` (see :func:`train_client`).

        Raises:
            PayloadError: a part of ``message`` is missing or fails its spec.
        """
        for c in self.recipe.components:
            validate_part(message.get(c.name), self.down_specs[c.name],
                          f"round {r}: downlink to client {client_id}, part '{c.name}'")
        ctx = ClientCtx(self.model, client_id, r, self.cfg.seed, data, lr=lr, task=self.task)
        return train_client(self.recipe, ctx, message, dict(state), self.cfg.train)

    def query(self, client_id: int, r: int, data: Split, part: Part,
              state: Mapping[str, State]) -> dict[str, object]:
        """Answer the post-aggregation query with the new global model (see :func:`answer_query`)."""
        return answer_query(self.recipe, self.model, self.down_specs[self.recipe.base.name], client_id, r,
                            self.cfg.seed, data, self.task, part, state)

    @torch.no_grad()
    def evaluate(self, client_id: int, r: int, client: ClientData, server: Mapping[str, State],
                 state: Mapping[str, State]) -> dict[str, Meter]:
        """Evaluate the global model on ``client``'s splits (see :func:`evaluate_client`)."""
        return evaluate_client(self.model, self.recipe, server, state, client_id, client, self.task,
                               self.cfg.seed, r, self.cfg.eval.batch_size)
