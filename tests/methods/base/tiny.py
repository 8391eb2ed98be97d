"""A hand-computable setting for the baselines' golden tests: a 2-feature, 2-class linear model
(optionally behind a 2x2 linear feature layer), four samples, full-batch plain SGD, and the numpy
gradient of the mean cross-entropy used to compute expected values independently."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedaug.config.schema import TrainConfig
from fedaug.data.base import Split
from fedaug.engine.client.training import train_client
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.component import ClientCtx, Component
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import make_task
from fedaug.models.split import StagedModel

X = np.array([[1.0, 2.0], [-1.0, 0.5], [0.5, -1.5], [2.0, 1.0]])  # (4, 2)
Y = np.array([0, 1, 1, 0])
W0 = np.array([[0.5, -0.25], [-0.5, 0.75]])  # (K=2, D=2)
B0 = np.array([0.1, -0.2])
LR = 0.1


class Linear2(StagedModel):
    """``head(x) = W x + b`` with the fixed W0, b0 (the head is the whole model)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor(W0, dtype=torch.float32))
            self.head.bias.copy_(torch.tensor(B0, dtype=torch.float32))


def split(x: np.ndarray = X, y: np.ndarray = Y) -> Split:
    return Split(torch.tensor(x, dtype=torch.float32), torch.tensor(y))


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def ce_grads(w: np.ndarray, b: np.ndarray, x: np.ndarray = X, y: np.ndarray = Y,
             logit_map=lambda z: z, dlogit=lambda z, g: g) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of ``mean_i CE(logit_map(W x_i + b), y_i)`` w.r.t. W ``(2, 2)`` and b ``(2,)``.

    ``dlogit(z, g)`` back-propagates g = dL/d(logit_map(z)) to dL/dz (elementwise maps only).
    """
    z = x @ w.T + b
    p = softmax(logit_map(z))
    g = dlogit(z, (p - np.eye(w.shape[0])[y]) / len(y))
    return g.T @ x, g.sum(0)


def train_cfg(steps: int, **kw) -> TrainConfig:
    """Full-batch plain SGD for ``steps`` steps (no momentum, no weight decay)."""
    return TrainConfig(local_steps=steps, batch_size=len(X), momentum=kw.pop("momentum", 0.0),
                       weight_decay=0.0, lr=LR, **kw)


def run_client(recipe: Recipe, model: nn.Module, downlink: dict, state: dict | None = None, steps: int = 1,
               data: Split | None = None, client_id: int = 0, round: int = 1, num_classes: int = 2, **cfg):
    """One client round through the engine's own loop; returns its :class:`~fedaug.engine.protocol.Reply`."""
    data = data if data is not None else split()
    ctx = ClientCtx(model, client_id, round, 0, data, lr=LR, task=make_task("classification", num_classes))
    return train_client(recipe, ctx, downlink, state or {}, train_cfg(steps, **cfg))


def weights_of(model: nn.Module) -> tuple[np.ndarray, np.ndarray]:
    return model.head.weight.detach().double().numpy(), model.head.bias.detach().double().numpy()


def recipe_of(component: Component) -> Recipe:
    """``component``'s recipe: a server rule alone, anything else after plain FedAvg."""
    return Recipe(component) if component.role == "server" else Recipe(FedAvg(), [component])


def server_round(component: Component, model: nn.Module, state: dict | None = None, num_clients: int = 1, **kw):
    """setup + init_server + downlink of every component of :func:`recipe_of` + one client round;
    returns (server, downlink, reply), with ``server`` ``{component name: server state}``."""
    recipe = recipe_of(component)
    for c in recipe.components:
        c.setup(model, (X.shape[1],))
    server = {c.name: c.init_server(model, num_clients) for c in recipe.components}
    down = {c.name: c.downlink(server[c.name], 0) for c in recipe.components}
    return server, down, run_client(recipe, model, down, state, **kw)


V0 = np.array([[1.0, 0.5], [-0.5, 1.0]])  # feature layer of Deep2, (D=2, 2)
C0 = np.array([0.2, -0.1])


class Deep2(StagedModel):
    """``head(body(x))``: a fixed linear feature layer z = V0 x + c0, then :class:`Linear2`'s head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 2)
        self.head = Linear2().head
        with torch.no_grad():
            self.body.weight.copy_(torch.tensor(V0, dtype=torch.float32))
            self.body.bias.copy_(torch.tensor(C0, dtype=torch.float32))
