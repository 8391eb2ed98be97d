"""SCAFFOLD: corrected local steps, the option-II control-variate update and the server step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.methods.base.scaffold import SCAFFOLD
from fedaug.methods.component import Uplink
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import B0, LR, W0, Linear2, ce_grads, run_client

C_W, C_B = np.array([[0.2, -0.1], [0.0, 0.3]]), np.array([0.05, -0.05])  # server variate c
CI_W, CI_B = np.array([[-0.1, 0.1], [0.2, 0.0]]), np.array([0.0, 0.1])  # client variate c_i


def t(a):
    return torch.tensor(a, dtype=torch.float32)


def client_round(scaffold: SCAFFOLD, **cfg):
    """One client round on the tiny model with server variate ``c`` and client variate ``c_i``."""
    model = Linear2()
    server = scaffold.init_server(model, 1)
    server["control"] = {"head.weight": t(C_W), "head.bias": t(C_B)}
    state = {"scaffold": {"control": {"head.weight": t(CI_W), "head.bias": t(CI_B)}}}
    return run_client(Recipe(scaffold), model, {"scaffold": scaffold.downlink(server, 0)}, state, **cfg)


def heavy_ball(steps: int, rho: float):
    """The weights after ``steps`` of PyTorch's heavy ball on the corrected gradient (rho = 0: Alg. 1
    line 10, y <- y - eta_l (g(y) - c_i + c)): v <- rho v + g, y <- y - eta v."""
    w, b = W0.copy(), B0.copy()
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for _ in range(steps):
        gw, gb = ce_grads(w, b)
        vw, vb = rho * vw + (gw - CI_W + C_W), rho * vb + (gb - CI_B + C_B)
        w, b = w - LR * vw, b - LR * vb
    return w, b


def test_client_steps_with_corrected_gradients_and_updates_its_variate():
    result = client_round(SCAFFOLD(), steps=2)
    w, b = heavy_ball(2, 0.0)
    part = result.message["scaffold"]
    np.testing.assert_allclose(part["head.weight"].numpy(), w, rtol=1e-5)
    np.testing.assert_allclose(part["head.bias"].numpy(), b, rtol=1e-5)
    ci_new_w = CI_W - C_W + (W0 - w) / (2 * LR)  # line 12, option II, K = 2
    np.testing.assert_allclose(result.state["scaffold"]["control"]["head.weight"].numpy(), ci_new_w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(part["dc/head.weight"].numpy(), ci_new_w - CI_W, rtol=1e-4, atol=1e-6)


def test_with_momentum_the_variate_divides_by_the_heavy_ball_step_count():
    result = client_round(SCAFFOLD(), steps=3, momentum=0.5)
    w, b = heavy_ball(3, 0.5)
    np.testing.assert_allclose(result.message["scaffold"]["head.weight"].numpy(), w, rtol=1e-5)
    a = 1 + 1.5 + 1.75  # sum_k (1 - rho^k) / (1 - rho) for K = 3, rho = 0.5
    ci_new_b = CI_B - C_B + (B0 - b) / (a * LR)
    np.testing.assert_allclose(result.state["scaffold"]["control"]["head.bias"].numpy(), ci_new_b, rtol=1e-4, atol=1e-6)


def test_momentum_aware_off_divides_by_the_step_count_as_written():
    result = client_round(SCAFFOLD(momentum_aware=False), steps=3, momentum=0.5)
    _, b = heavy_ball(3, 0.5)
    ci_new_b = CI_B - C_B + (B0 - b) / (3 * LR)  # line 12 as written, K = 3
    np.testing.assert_allclose(result.state["scaffold"]["control"]["head.bias"].numpy(), ci_new_b, rtol=1e-4, atol=1e-6)


def test_momentum_aware_must_be_a_bool():
    with pytest.raises(ConfigError, match="scaffold.momentum_aware must be true or false, got 3"):
        SCAFFOLD(momentum_aware=3)


def test_option_two_needs_sgd():
    scaffold = SCAFFOLD()
    model = Linear2()
    down = {"scaffold": scaffold.downlink(scaffold.init_server(model, 1), 0)}
    with pytest.raises(ConfigError, match="train.optimizer='adam', set train.optimizer='sgd'"):
        run_client(Recipe(scaffold), model, down, steps=1, optimizer="adam")


def test_server_step_and_variate_average_over_all_clients():
    scaffold = SCAFFOLD(server_lr=0.5, weighting="uniform")
    server = scaffold.init_server(Linear2(), 4)  # N = 4 clients, 2 sampled
    server["control"]["head.bias"] = t([1.0, -1.0])
    ups = [Uplink(0, 5, {"head.weight": t(W0 + 1.0), "head.bias": t([0.0, 0.0]),
                         "dc/head.weight": t(np.ones((2, 2))), "dc/head.bias": t([2.0, 0.0])}),
           Uplink(3, 15, {"head.weight": t(W0 - 3.0), "head.bias": t([1.0, 1.0]),
                          "dc/head.weight": t(np.zeros((2, 2))), "dc/head.bias": t([2.0, 4.0])})]
    new = scaffold.aggregate(server, ups)
    # x <- x + eta_g * mean(y_i - x); c <- c + (1/N) sum dc_i
    np.testing.assert_allclose(new["weights"]["head.weight"].numpy(), W0 + 0.5 * np.mean([1.0, -3.0]), rtol=1e-6)
    np.testing.assert_allclose(new["weights"]["head.bias"].numpy(), B0 + 0.5 * (np.array([0.5, 0.5]) - B0), rtol=1e-6)
    np.testing.assert_allclose(new["control"]["head.bias"].numpy(), [1.0 + 4.0 / 4, -1.0 + 4.0 / 4])
    np.testing.assert_allclose(new["control"]["head.weight"].numpy(), np.full((2, 2), 0.25))


def test_the_uplink_declares_the_control_variate_changes_as_their_own_kind():
    """``dc/*`` have no counterpart in the downlink (the screen measures them by their own norm,
    engine/screen.py): they are ``control``, the weights parameters."""
    scaffold = SCAFFOLD()
    spec = scaffold.uplink_spec(scaffold.init_server(Linear2(), 4))
    assert {k: s.kind for k, s in spec.items()} == {"head.weight": "parameters", "head.bias": "parameters",
                                                    "dc/head.weight": "control", "dc/head.bias": "control"}
