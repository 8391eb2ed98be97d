"""FedAvgM, FedAdam, FedYogi: two server steps against the papers' update rules in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.methods.base.server_opt import FedAdam, FedAvgM, FedYogi
from fedaug.methods.component import Uplink


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1, bias=False)
        self.bn = nn.BatchNorm1d(1)


def start(component):
    model = Tiny()
    with torch.no_grad():
        model.fc.weight.copy_(torch.tensor([[1.0, -1.0]]))
    return component.init_server(model, 2)


def uplinks(w_a, w_b, mean_a, mean_b):
    def up(cid, n, w, m):
        return Uplink(cid, n, {"fc.weight": torch.tensor([w]), "bn.weight": torch.ones(1), "bn.bias": torch.zeros(1),
                               "bn.running_mean": torch.tensor([m]), "bn.running_var": torch.ones(1),
                               "bn.num_batches_tracked": torch.tensor(1)})
    return [up(0, 10, w_a, mean_a), up(1, 30, w_b, mean_b)]


ROUNDS = [uplinks([2.0, 0.0], [0.0, -2.0], 1.0, 3.0), uplinks([1.0, 1.0], [3.0, -1.0], 0.0, 2.0)]
P = np.array([0.25, 0.75])  # n = 10, 30


def run(component):
    server = start(component)
    out = []
    for ups in ROUNDS:
        server = component.aggregate(server, ups)
        out.append(server)
    return out




def test_fedavgm_momentum_update():
    beta, lr = 0.9, 0.5
    got = run(FedAvgM(momentum=beta, server_lr=lr))
    w, v = np.array([1.0, -1.0]), np.zeros(2)
    for r, avg in enumerate([P @ [[2, 0], [0, -2]], P @ [[1, 1], [3, -1]]]):
        v = beta * v + (avg - w)
        w = w + lr * v
        np.testing.assert_allclose(got[r]["weights"]["fc.weight"].numpy()[0], w, rtol=1e-6)
        np.testing.assert_allclose(got[r]["momentum"]["fc.weight"].numpy()[0], v, rtol=1e-6)
    # buffers are plainly averaged: running mean of round 2 = 0.25 * 0 + 0.75 * 2
    assert got[1]["weights"]["bn.running_mean"].item() == pytest.approx(1.5)


@pytest.mark.parametrize("cls", [FedAdam, FedYogi])
def test_adaptive_server_updates(cls):
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    got = run(cls(server_lr=lr))
    w, m, v = np.array([1.0, -1.0]), np.zeros(2), np.full(2, tau**2)
    for r, avg in enumerate([P @ [[2, 0], [0, -2]], P @ [[1, 1], [3, -1]]]):
        d = avg - w
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d**2 if cls is FedAdam else v - (1 - b2) * d**2 * np.sign(v - d**2)
        w = w + lr * m / (np.sqrt(v) + tau)
        np.testing.assert_allclose(got[r]["weights"]["fc.weight"].numpy()[0], w, rtol=1e-5)
        np.testing.assert_allclose(got[r]["v"]["fc.weight"].numpy()[0], v, rtol=1e-5)
    assert set(got[1]["m"]) == {"fc.weight", "bn.weight", "bn.bias"}  # parameters only


def test_options_are_checked():
    with pytest.warns(UserWarning, match=r"fedavgm.momentum=0 with server_lr=1 makes FedAvgM identical to FedAvg"):
        FedAvgM(momentum=0.0)
    with pytest.raises(ConfigError, match=r"fedavgm.momentum must be >= 0 and < 1, got 1.0"):
        FedAvgM(momentum=1.0)
    with pytest.raises(ConfigError, match=r"fedyogi.tau must be > 0, got 0"):
        FedYogi(tau=0)
