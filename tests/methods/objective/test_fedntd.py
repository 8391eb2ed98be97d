"""FedNTD: not-true distillation against numpy, and its value over two local steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.objective.fedntd import FedNTD, not_true_distillation
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import LR, X, ce_grads, run_client, softmax, split


def np_ntd(local, teacher, y, tau):
    total = 0.0
    for i in range(len(y)):
        keep = np.arange(local.shape[1]) != y[i]
        p = softmax(teacher[i : i + 1, keep] / tau)[0]
        q = softmax(local[i : i + 1, keep] / tau)[0]
        total += (p * np.log(p / q)).sum()
    return tau**2 * total / len(y)


def test_loss_golden():
    g = np.random.default_rng(1)
    local, teacher, y = g.normal(size=(4, 5)), g.normal(size=(4, 5)), np.array([0, 3, 4, 1])
    got = not_true_distillation(torch.tensor(local), torch.tensor(teacher), torch.tensor(y), tau=2.0)
    assert got.item() == pytest.approx(np_ntd(local, teacher, y, 2.0), rel=1e-9)


W3 = np.array([[0.5, -0.25], [-0.5, 0.75], [0.3, 0.2]])  # 3 classes: two not-true classes per sample
B3 = np.array([0.1, -0.2, 0.0])
Y3 = np.array([0, 1, 2, 0])


def test_term_over_two_steps_against_the_received_model():
    beta, tau = 1.5, 2.0
    ntd = FedNTD(beta=beta, tau=tau)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor(W3))
        model[0].bias.copy_(torch.tensor(B3))
    fedavg = FedAvg()
    down = {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0), "fedntd": {}}
    result = run_client(Recipe(fedavg, [ntd]), model, down, steps=2, data=split(X, Y3), num_classes=3)
    # step 1: local == global, the term and its gradient are 0; step 2 starts from the CE step
    gw, gb = ce_grads(W3, B3, X, Y3)
    w1, b1 = W3 - LR * gw, B3 - LR * gb
    expected = np_ntd(X @ w1.T + b1, X @ W3.T + B3, Y3, tau)
    assert expected > 0
    assert result.metrics["fedntd/ntd"] == pytest.approx(beta * expected / 2, rel=1e-3)  # float32 KL of close laws
