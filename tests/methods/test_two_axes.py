"""Server rules x local objectives: golden combined updates against the papers' equations in numpy
(FedAdam + FedProx, FedBN + FedProx, SCAFFOLD + FedProx), short runs of combined recipes, and the
combinations a recipe refuses at build, with their reason."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.methods.base.fedbn import FedBN
from fedaug.methods.base.scaffold import SCAFFOLD
from fedaug.methods.base.server_opt import FedAdam
from fedaug.methods.component import Uplink
from fedaug.methods.objective.fedprox import FedProx
from fedaug.methods.recipe import Recipe, build_recipe
from fedaug.models.split import StagedModel
from tests.conftest import tiny_raw
from tests.methods.base.tiny import B0, LR, W0, X, Y, Linear2, ce_grads, run_client, softmax, split


def t(a) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float32)


def prox_sgd(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, mu: float, steps: int = 2,
             correction: tuple[np.ndarray, np.ndarray] = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` full-batch SGD steps on FedProx's ``h(w) = CE(w) + mu/2 ||w - w_global||^2`` (Li et
    al. 2020, Eq. 2) from the global ``(w, b)``: ``w <- w - lr (grad CE + mu (w - w_global) + corr)``."""
    w_g, b_g = w.copy(), b.copy()
    for _ in range(steps):
        gw, gb = ce_grads(w, b, x, y)
        w, b = w - LR * (gw + mu * (w - w_g) + correction[0]), b - LR * (gb + mu * (b - b_g) + correction[1])
    return w, b


# --- (1) FedAdam + FedProx --------------------------------------------------------------------------

CLIENTS = [(X, Y), (X[:3], np.array([1, 0, 0]))]  # n = 4, 3: p = (4/7, 3/7)


def test_fedadam_with_fedprox_clients_two_rounds():
    mu, eta, b1, b2, tau = 0.5, 0.1, 0.9, 0.99, 1e-3
    fedadam, prox = FedAdam(server_lr=eta, beta1=b1, beta2=b2, tau=tau), FedProx(mu=mu)
    recipe, model = Recipe(fedadam, [prox]), Linear2()
    server = fedadam.init_server(model, len(CLIENTS))
    p = np.array([len(y) for _, y in CLIENTS], dtype=float) / sum(len(y) for _, y in CLIENTS)
    w, b = W0.copy(), B0.copy()
    m = {"head.weight": np.zeros_like(w), "head.bias": np.zeros_like(b)}
    v = {"head.weight": np.full_like(w, tau**2), "head.bias": np.full_like(b, tau**2)}
    for r in (1, 2):
        ups, local = [], []
        for cid, (x, y) in enumerate(CLIENTS):  # one worker model: each client starts from what it receives
            down = {"fedadam": fedadam.downlink(server, cid), "fedprox": prox.downlink({}, cid)}
            reply = run_client(recipe, model, down, steps=2, data=split(x, y), client_id=cid, round=r)
            assert set(reply.message["fedprox"]) == set()  # the weights travel in the server rule's part only
            ups.append(Uplink(cid, len(y), reply.message["fedadam"]))
            local.append(prox_sgd(w, b, x, y, mu))
            np.testing.assert_allclose(reply.message["fedadam"]["head.weight"].numpy(), local[-1][0], rtol=1e-5)
        server = fedadam.aggregate(server, ups)
        # Reddi et al. 2021, Alg. 2: Delta = sum_k p_k w_k - w; m = b1 m + (1 - b1) Delta;
        # v = b2 v + (1 - b2) Delta^2 (v_{-1} = tau^2); w <- w + eta m / (sqrt(v) + tau)
        new = {}
        for key, cur, i in (("head.weight", w, 0), ("head.bias", b, 1)):
            delta = sum(pk * loc[i] for pk, loc in zip(p, local)) - cur
            m[key] = b1 * m[key] + (1 - b1) * delta
            v[key] = b2 * v[key] + (1 - b2) * delta**2
            new[key] = cur + eta * m[key] / (np.sqrt(v[key]) + tau)
            np.testing.assert_allclose(server["m"][key].numpy(), m[key], rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(server["v"][key].numpy(), v[key], rtol=1e-4, atol=1e-9)
            np.testing.assert_allclose(server["weights"][key].numpy(), new[key], rtol=1e-5, atol=1e-6)
        w, b = new["head.weight"], new["head.bias"]
    fedavg_w = sum(pk * loc[0] for pk, loc in zip(p, local))
    assert not np.allclose(w, fedavg_w, atol=1e-3)  # the server step is Adam's, not the average


# --- (2) FedBN + FedProx ----------------------------------------------------------------------------

class BNHead(StagedModel):
    """``head(bn(x))``: BatchNorm1d(2) before :class:`~tests.methods.base.tiny.Linear2`'s head (W0, b0)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(2)
        self.head = Linear2().head


BN_KEYS = {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
GAMMA_C, BETA_C = np.array([1.5, 0.8]), np.array([0.2, -0.1])  # the client's own BN affine parameters
MEAN_C, VAR_C, TRACKED_C = np.array([0.3, -0.2]), np.array([2.0, 0.5]), 5  # and running statistics


def bn_prox_sgd(gamma_anchor: np.ndarray, beta_anchor: np.ndarray, mu: float, steps: int = 2):
    """``steps`` full-batch steps of FedProx on ``CE(W (gamma * xhat + beta) + b)`` from the client's
    BN parameters and the global head, with the proximal anchor ``(gamma_anchor, beta_anchor, W0, b0)``.
    BatchNorm in training normalises with the batch's biased variance: xhat = (x - mean) / sqrt(var + eps).
    Returns the parameters and the mean over steps of the proximal term."""
    xhat = (X - X.mean(0)) / np.sqrt(X.var(0) + 1e-5)
    gamma, beta, w, b = GAMMA_C.copy(), BETA_C.copy(), W0.copy(), B0.copy()
    anchor = (gamma_anchor, beta_anchor, W0, B0)
    prox = []
    for _ in range(steps):
        theta = (gamma, beta, w, b)
        prox.append(mu / 2 * sum(((q - a) ** 2).sum() for q, a in zip(theta, anchor)))
        a = gamma * xhat + beta
        g = (softmax(a @ w.T + b) - np.eye(2)[Y]) / len(Y)  # dCE/dlogits
        ga = g @ w  # dCE/da
        grads = ((ga * xhat).sum(0), ga.sum(0), g.T @ a, g.sum(0))
        gamma, beta, w, b = (q - LR * (gq + mu * (q - aq)) for q, gq, aq in zip(theta, grads, anchor))
    return (gamma, beta, w, b), float(np.mean(prox))


def test_fedbn_with_fedprox_keeps_bn_local_and_anchors_it_at_the_clients_own():
    mu = 0.5
    fedbn, prox = FedBN(), FedProx(mu=mu)
    recipe, model = Recipe(fedbn, [prox]), BNHead()
    for c in recipe.components:
        c.setup(model, (2,))
    server = fedbn.init_server(model, 1)
    assert not BN_KEYS & set(server["weights"]) and not BN_KEYS & set(fedbn.downlink_spec(model))
    own = {"bn.weight": t(GAMMA_C), "bn.bias": t(BETA_C), "bn.running_mean": t(MEAN_C),
           "bn.running_var": t(VAR_C), "bn.num_batches_tracked": torch.tensor(TRACKED_C)}
    down = {"fedbn": fedbn.downlink(server, 0), "fedprox": {}}
    reply = run_client(recipe, model, down, {"fedbn": {"bn": own}}, steps=2)

    # the BN layer stays out of the uplink and in the client state
    assert set(reply.message["fedbn"]) == {"head.weight", "head.bias"}
    assert set(fedbn.uplink_spec(server)) == {"head.weight", "head.bias"}
    kept = reply.state["fedbn"]["bn"]
    assert set(kept) == BN_KEYS
    (gamma, beta, w, b), prox_mean = bn_prox_sgd(GAMMA_C, BETA_C, mu)
    np.testing.assert_allclose(kept["bn.weight"].numpy(), gamma, rtol=1e-5)
    np.testing.assert_allclose(kept["bn.bias"].numpy(), beta, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(reply.message["fedbn"]["head.weight"].numpy(), w, rtol=1e-5)
    np.testing.assert_allclose(reply.message["fedbn"]["head.bias"].numpy(), b, rtol=1e-5)
    # step 1 starts at the anchor (term 0); step 2 pulls gamma, beta back to the client's own values
    assert reply.metrics["fedprox/prox"] == pytest.approx(prox_mean, rel=1e-4) and prox_mean > 0
    # anchored at the initial BN (gamma 1, beta 0) instead, the BN parameters would differ
    (gamma_other, beta_other, _, _), _ = bn_prox_sgd(np.ones(2), np.zeros(2), mu)
    assert not np.allclose(gamma, gamma_other, rtol=1e-4) and not np.allclose(beta, beta_other, rtol=1e-4)
    # running statistics: the client's own, updated twice with the batch's mean and unbiased variance
    mean, var = MEAN_C, VAR_C
    for _ in range(2):
        mean, var = 0.9 * mean + 0.1 * X.mean(0), 0.9 * var + 0.1 * X.var(0, ddof=1)
    np.testing.assert_allclose(kept["bn.running_mean"].numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(kept["bn.running_var"].numpy(), var, rtol=1e-5)
    assert int(kept["bn.num_batches_tracked"]) == TRACKED_C + 2

    new = fedbn.aggregate(server, [Uplink(0, 4, reply.message["fedbn"])])
    assert set(new["weights"]) == {"head.weight", "head.bias"}


# --- (3) SCAFFOLD + FedProx -------------------------------------------------------------------------

C_W, C_B = np.array([[0.2, -0.1], [0.0, 0.3]]), np.array([0.05, -0.05])  # server variate c
CI_W, CI_B = np.array([[-0.1, 0.1], [0.2, 0.0]]), np.array([0.0, 0.1])  # client variate c_i


def test_scaffold_with_fedprox_corrects_the_proximal_gradient():
    mu, steps, n_clients, eta_g = 0.5, 2, 2, 0.5
    scaffold, prox = SCAFFOLD(server_lr=eta_g), FedProx(mu=mu)
    model = Linear2()
    server = scaffold.init_server(model, n_clients)
    server["control"] = {"head.weight": t(C_W), "head.bias": t(C_B)}
    state = {"scaffold": {"control": {"head.weight": t(CI_W), "head.bias": t(CI_B)}}}
    down = {"scaffold": scaffold.downlink(server, 0), "fedprox": {}}
    reply = run_client(Recipe(scaffold, [prox]), model, down, state, steps=steps)
    # y <- y - eta_l (grad CE(y) + mu (y - x) - c_i + c): Karimireddy et al. Alg. 1 line 10 on FedProx's h
    w, b = prox_sgd(W0, B0, X, Y, mu, steps, correction=(C_W - CI_W, C_B - CI_B))
    part = reply.message["scaffold"]
    np.testing.assert_allclose(part["head.weight"].numpy(), w, rtol=1e-5)
    np.testing.assert_allclose(part["head.bias"].numpy(), b, rtol=1e-5)
    # both corrections matter: without the prox term, or without c - c_i, the weights differ
    assert not np.allclose(w, prox_sgd(W0, B0, X, Y, 0.0, steps, correction=(C_W - CI_W, C_B - CI_B))[0], atol=1e-4)
    assert not np.allclose(w, prox_sgd(W0, B0, X, Y, mu, steps)[0], atol=1e-4)
    # option II: c_i+ = c_i - c + (x - y) / (K eta_l); uploads Delta c_i = c_i+ - c_i
    ci_w, ci_b = CI_W - C_W + (W0 - w) / (steps * LR), CI_B - C_B + (B0 - b) / (steps * LR)
    np.testing.assert_allclose(reply.state["scaffold"]["control"]["head.weight"].numpy(), ci_w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(part["dc/head.bias"].numpy(), ci_b - CI_B, rtol=1e-4, atol=1e-6)
    # server: x <- x + eta_g (y - x); c <- c + Delta c_i / N
    new = scaffold.aggregate(server, [Uplink(0, 4, part)])
    np.testing.assert_allclose(new["weights"]["head.weight"].numpy(), W0 + eta_g * (w - W0), rtol=1e-5)
    np.testing.assert_allclose(new["control"]["head.weight"].numpy(), C_W + (ci_w - CI_W) / n_clients,
                               rtol=1e-4, atol=1e-6)


# --- combined recipes run; meaningless ones are refused --------------------------------------------

@pytest.fixture
def one_thread():
    """Tiny runs are fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("base, augs", [("fedadam", ["fedprox", "fedfa"]), ("fedbn", ["fedprox"]),
                                        ("scaffold", ["fedfa", "fedrdn"])])
def test_combined_recipes_train(one_thread, base, augs):
    raw = tiny_raw(rounds=2, local_steps=2)
    raw["method"] = {"base": base, "augs": augs}
    sim = build_simulation(validate(raw))
    assert sim.recipe.names == (base, *augs)
    for r in (1, 2):
        rec = sim.run_round(r)
        assert not rec["rejected"] and not rec["dropped"]
        assert math.isfinite(rec["train"]["loss"])
        for metrics in rec["train"]["clients"].values():
            assert all(math.isfinite(v) for v in metrics.values())
            assert ("fedprox/prox" in metrics) == ("fedprox" in augs)
    assert all(torch.isfinite(v).all() for v in sim.server[base]["weights"].values() if v.is_floating_point())
    assert math.isfinite(sim.evaluate()["mean"]["test_acc"])


@pytest.mark.parametrize("base, augs, reason", [
    ("fedproto", ["fedprox"], r"'fedprox' needs a global model, but the server rule 'fedproto' keeps none"),
    ("fedprox", ["fedavg"], r"method.base='fedprox' is a local objective.*with a 'fedavg' table or entry as well"),
    ("fedavg", ["fedlc", "fedrs"], r"both 'fedlc' and 'fedrs' replace 'task_loss'"),
    ("fedavg", ["fedadam"], r"'fedadam' is a server rule; a recipe has exactly one"),
])
def test_meaningless_combinations_are_refused_at_build(base, augs, reason):
    with pytest.raises(ConfigError, match=reason):
        build_recipe(base, augs)


def test_legacy_objective_base_is_fedavg_plus_the_objective():
    recipe = build_recipe("fedprox", ["fedfa"], {"fedprox": {"mu": 0.1, "bn": "local", "weighting": "uniform"}})
    assert recipe.names == ("fedavg", "fedprox", "fedfa")
    assert recipe.base.bn == "local" and recipe.base.weighting == "uniform" and recipe.components[1].mu == 0.1
