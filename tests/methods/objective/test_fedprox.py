"""FedProx: two local SGD steps with the squared proximal term, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fedaug.core.errors import ConfigError
from fedaug.methods.objective.fedprox import FedProx
from tests.methods.base.tiny import B0, LR, W0, Linear2, ce_grads, server_round


def test_two_steps_follow_the_proximal_gradient():
    mu = 0.5
    _, _, result = server_round(FedProx(mu=mu), Linear2(), steps=2)
    w, b = W0.copy(), B0.copy()
    for _ in range(2):  # grad of mu/2 ||w - w0||^2 is mu (w - w0): zero at step 1, not at step 2
        gw, gb = ce_grads(w, b)
        w, b = w - LR * (gw + mu * (w - W0)), b - LR * (gb + mu * (b - B0))
    got_w, got_b = weights_of_uplink(result)
    np.testing.assert_allclose(got_w, w, rtol=1e-5)
    np.testing.assert_allclose(got_b, b, rtol=1e-5)
    assert result.metrics["fedprox/prox"] > 0


def weights_of_uplink(result):
    part = result.message["fedavg"]  # the server rule carries the weights
    return part["head.weight"].double().numpy(), part["head.bias"].double().numpy()


def test_mu_zero_warns_and_negative_mu_fails():
    with pytest.warns(UserWarning, match=r"fedprox.mu=0 makes FedProx identical to FedAvg"):
        FedProx(mu=0)
    with pytest.raises(ConfigError, match=r"fedprox.mu must be >= 0, got -1"):
        FedProx(mu=-1)
