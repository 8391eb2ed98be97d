"""MOON: the model-contrastive loss against numpy, and its value in a client's step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.objective.moon import MOON, model_contrastive_loss
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import C0, V0, X, Deep2, run_client


def cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def np_moon(z, zg, zp, tau):
    pos, neg = np.exp(cos(z, zg) / tau), np.exp(cos(z, zp) / tau)
    return float(np.mean(-np.log(pos / (pos + neg))))


def test_loss_golden():
    g = np.random.default_rng(0)
    z, zg, zp = (g.normal(size=(5, 3)) for _ in range(3))
    got = model_contrastive_loss(*(torch.tensor(a) for a in (z, zg, zp)), tau=0.5)
    assert got.item() == pytest.approx(np_moon(z, zg, zp, 0.5), rel=1e-9)


def test_term_in_a_local_step_uses_global_and_previous_models():
    mu, tau = 2.0, 0.5
    moon = MOON(mu=mu, tau=tau)
    model = Deep2()
    fedavg = FedAvg()
    moon.setup(model, (2,))
    server = fedavg.init_server(model, 1)
    previous = {k: v.clone() for k, v in model.state_dict().items()}
    v_prev = np.array([[0.0, 1.0], [1.0, 0.0]])
    previous["body.weight"] = torch.tensor(v_prev, dtype=torch.float32)
    result = run_client(Recipe(fedavg, [moon]), model, {"fedavg": fedavg.downlink(server, 0), "moon": {}},
                        {"moon": {"previous": previous}}, steps=1)
    z = X @ V0.T + C0  # local == global at the first step
    zp = X @ v_prev.T + C0
    assert result.metrics["moon/con"] == pytest.approx(mu * np_moon(z, z, zp, tau), rel=1e-5)
    new_prev = result.state["moon"]["previous"]
    assert torch.equal(new_prev["head.weight"], result.message["fedavg"]["head.weight"])


def test_first_round_has_no_term():
    moon = MOON()
    model = Deep2()
    fedavg = FedAvg()
    moon.setup(model, (2,))
    result = run_client(Recipe(fedavg, [moon]), model,
                        {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0), "moon": {}})
    assert "moon/con" not in result.metrics and "previous" in result.state["moon"]
