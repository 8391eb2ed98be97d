"""FedNova: the normalising vector's norm and the normalised server average."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.methods._common import normalizing_norm
from fedaug.methods.base.fednova import FedNova
from fedaug.methods.component import Uplink
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import W0, Linear2, run_client


@pytest.mark.parametrize("tau, rho", [(1, 0.0), (5, 0.0), (3, 0.9), (10, 0.5)])
def test_normalizing_norm_equals_the_sum_of_momentum_coefficients(tau, rho):
    # heavy ball: the gradient of step s reaches the weights with sum_{t=s}^{tau} rho^(t-s)
    expected = sum(sum(rho ** (t - s) for t in range(s, tau + 1)) for s in range(1, tau + 1))
    assert normalizing_norm(tau, rho) == pytest.approx(expected)


def test_client_uploads_its_norm_from_steps_and_momentum():
    nova = FedNova()
    model = Linear2()
    server = nova.init_server(model, 1)
    result = run_client(Recipe(nova), model, {"fednova": nova.downlink(server, 0)}, steps=3, momentum=0.5)
    assert result.message["fednova"]["a_norm"].item() == pytest.approx(1 + 1.5 + 1.75)


def test_server_normalises_updates():
    nova = FedNova()
    server = nova.init_server(Linear2(), 2)
    x = W0
    updates = [np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[-2.0, 4.0], [2.0, 0.0]])]
    a, n = [2.0, 8.0], [30, 10]
    ups = [Uplink(k, n[k], {"head.weight": torch.tensor(x + updates[k], dtype=torch.float32),
                            "head.bias": server["weights"]["head.bias"], "a_norm": torch.tensor(a[k])})
           for k in range(2)]
    new = nova.aggregate(server, ups)["weights"]["head.weight"].numpy()
    p = np.array(n) / sum(n)
    tau_eff = p @ a
    expected = x + tau_eff * sum(p[k] * updates[k] / a[k] for k in range(2))
    np.testing.assert_allclose(new, expected, rtol=1e-6)
    fedavg = x + sum(p[k] * updates[k] for k in range(2))
    assert not np.allclose(new, fedavg)  # unequal work is re-weighted


def test_adam_is_rejected():
    nova = FedNova()
    model = Linear2()
    server = nova.init_server(model, 1)
    with pytest.raises(ConfigError, match=r"fednova normalises SGD updates; got train.optimizer='adam'"):
        run_client(Recipe(nova), model, {"fednova": nova.downlink(server, 0)}, optimizer="adam")
