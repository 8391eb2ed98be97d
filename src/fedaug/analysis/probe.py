"""Probing a simulated federation for the privacy analyses: the global model as a client holds it,
pooled samples of the clients' data, and the distance correlation of the shared features."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError
from fedaug.core.rng import generator
from fedaug.data.base import FederatedData
from fedaug.methods.component import ClientCtx
from fedaug.core.device import to_device
from fedaug.models.split import extract_features
from fedaug.privacy.dcor import distance_correlation


def global_model(sim: Any, client_id: int = 0) -> nn.Module:
    """``sim.model`` loaded with the current global model as ``client_id`` evaluates it (every
    component that takes part in evaluation receives its evaluation part), in eval mode.

    Args:
        sim: a :class:`fedaug.engine.run.Simulation` (after some rounds, or restored).
        client_id: whose per-client state (e.g. local BatchNorm statistics) to use.
    """
    ctx = ClientCtx(sim.model, client_id, sim.round, sim.cfg.seed, sim.data.clients[client_id].train.to(sim.device),
                    phase="evaluate", task=sim.task, device=sim.device)
    states = to_device(sim.client_states.get(client_id, {}), sim.device)
    for c in sim.recipe.participants("evaluate"):
        c.receive(ctx.view(c.name), c.downlink(sim.server[c.name], client_id, "evaluate"), states.get(c.name, {}))
    return sim.model.eval()


def pooled(data: FederatedData, split: str, num: int, seed: int) -> tuple[Tensor, Tensor]:
    """``num`` samples drawn without replacement from the union of every client's ``split``
    (``"train"``, ``"val"`` or ``"test"``): ``x (num, *in_shape)``, ``y (num,)``."""
    if split not in ("train", "val", "test"):
        raise ConfigError(f"split must be one of train, val, test, got {split!r}")
    if num < 1:
        raise ConfigError(f"the number of pooled samples must be >= 1, got {num}")
    x = torch.cat([getattr(c, split).x for c in data.clients])
    y = torch.cat([getattr(c, split).y for c in data.clients])
    if num > x.shape[0]:
        raise ConfigError(f"asked for {num} {split} samples, the federation holds {x.shape[0]}; lower the number")
    pick = torch.randperm(x.shape[0], generator=generator(seed, "privacy", "pool", split))[:num]
    return x[pick], y[pick]


def feature_dcor(model: nn.Module, x: Tensor, stage: str, *, batch: int = 64, squared: bool = True) -> float:
    """Mean over batches of ``batch`` samples of dCor(x, theta[:l](x)) (Eq. 8), as in training
    (a last batch of one sample is left out: dCor needs two).

    Raises:
        ConfigError: fewer than 2 samples, or ``batch`` below 2.
    """
    if x.shape[0] < 2 or batch < 2:
        raise ConfigError(f"dCor needs at least 2 samples and batches of at least 2, got {x.shape[0]} samples "
                          f"in batches of {batch}")
    with torch.no_grad():
        f = extract_features(model.eval(), x, stage)
        vals = [float(distance_correlation(x[i : i + batch], f[i : i + batch], squared=squared))
                for i in range(0, x.shape[0] - 1, batch) if x[i : i + batch].shape[0] >= 2]
    return sum(vals) / len(vals)
