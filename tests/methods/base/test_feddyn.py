"""FedDyn: the dynamic regulariser's local steps, the state update and the server's h correction."""

from __future__ import annotations

import numpy as np
import torch

from fedaug.methods.base.feddyn import FedDyn
from fedaug.methods.component import Uplink
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import B0, LR, W0, Linear2, ce_grads, run_client

G_W, G_B = np.array([[0.3, -0.2], [0.1, 0.4]]), np.array([-0.1, 0.2])  # g_k from the last round


def t(a):
    return torch.tensor(a, dtype=torch.float32)


def test_two_local_steps_and_the_gradient_state():
    alpha = 0.5
    dyn = FedDyn(alpha=alpha)
    model = Linear2()
    server = dyn.init_server(model, 1)
    state = {"feddyn": {"grad": {"head.weight": t(G_W), "head.bias": t(G_B)}}}
    result = run_client(Recipe(dyn), model, {"feddyn": dyn.downlink(server, 0)}, state, steps=2)
    w, b = W0.copy(), B0.copy()
    for _ in range(2):  # grad of L - <g, theta> + alpha/2 ||theta - theta_g||^2
        gw, gb = ce_grads(w, b)
        w, b = w - LR * (gw - G_W + alpha * (w - W0)), b - LR * (gb - G_B + alpha * (b - B0))
    np.testing.assert_allclose(result.message["feddyn"]["head.weight"].numpy(), w, rtol=1e-5)
    g_new = result.state["feddyn"]["grad"]
    np.testing.assert_allclose(g_new["head.weight"].numpy(), G_W - alpha * (w - W0), rtol=1e-5)
    np.testing.assert_allclose(g_new["head.bias"].numpy(), G_B - alpha * (b - B0), rtol=1e-5)


def test_server_h_and_weights():
    alpha = 0.1
    dyn = FedDyn(alpha=alpha, weighting="uniform")
    server = dyn.init_server(Linear2(), 3)
    server["h"]["head.bias"] = t([0.02, -0.01])
    ups = [Uplink(0, 4, {"head.weight": t(W0 + 1.0), "head.bias": t(B0 + [1.0, 0.0])}),
           Uplink(2, 8, {"head.weight": t(W0 + 3.0), "head.bias": t(B0 + [0.0, 2.0])})]
    new = dyn.aggregate(server, ups)
    h_b = np.array([0.02, -0.01]) - alpha / 3 * np.array([1.0, 2.0])
    h_w = -alpha / 3 * np.full((2, 2), 4.0)
    np.testing.assert_allclose(new["h"]["head.bias"].numpy(), h_b, rtol=1e-5)
    np.testing.assert_allclose(new["weights"]["head.bias"].numpy(), B0 + [0.5, 1.0] - h_b / alpha, rtol=1e-5)
    np.testing.assert_allclose(new["weights"]["head.weight"].numpy(), W0 + 2.0 - h_w / alpha, rtol=1e-5)
