"""FedDecorr: the decorrelation loss equals numpy's correlation matrix norm (paper) and the authors'
normalisation (official), golden values computed by hand and with numpy; it is a local objective."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.methods.objective.feddecorr import FedDecorr, decorrelation_loss
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import Recipe
from tests.methods.base.tiny import C0, V0, X, Deep2, run_client


@pytest.mark.parametrize("shape", [(8, 3), (5, 2), (16, 6)])  # (B, D)
def test_loss_is_the_squared_frobenius_norm_of_the_correlation_over_d2(shape):
    z = np.random.default_rng(sum(shape)).normal(size=shape)
    expected = (np.corrcoef(z, rowvar=False) ** 2).sum() / shape[1] ** 2
    assert decorrelation_loss(torch.tensor(z)).item() == pytest.approx(expected, rel=1e-6)


def test_term_in_a_local_step_on_the_head_input():
    beta = 0.3
    model = Deep2()
    decorr = FedDecorr(beta=beta)
    fedavg = FedAvg()
    decorr.setup(model, (2,))
    down = {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0)}
    result = run_client(Recipe(fedavg, [decorr]), model, down)
    z = X @ V0.T + C0
    expected = beta * (np.corrcoef(z, rowvar=False) ** 2).sum() / 4
    assert result.metrics["feddecorr/decorr"] == pytest.approx(expected, rel=1e-4)
    assert FedDecorr.role == "objective"


# z = [[1, 0], [0, 1], [2, 2]] (B=3, D=2): deviations (0, -1, 1) and (-1, 0, 1), correlation r = 1/2;
# unbiased variances 1, so M = z_s^T z_s has off-diagonal 1 / (1 + eps).
HAND = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])


@pytest.mark.parametrize("normalization, expected", [
    ("paper", (1 + 1 + 0.25 + 0.25) / 4),       # ||K||_F^2 / D^2 with K = [[1, r], [r, 1]]
    ("official", (1 / (1 + 1e-8)) ** 2 / 3),    # mean of the two squared off-diagonal entries, / B
])
def test_hand_computed_batch(normalization, expected):
    got = decorrelation_loss(torch.tensor(HAND), normalization=normalization).item()
    assert got == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize("shape", [(8, 3), (5, 2), (32, 6)])  # (B, D)
def test_official_is_the_offdiagonal_mean_of_the_unnormalised_correlation_over_b(shape):
    b, d = shape
    z = np.random.default_rng(sum(shape) + 1).normal(size=shape)
    cov = np.cov(z, rowvar=False, ddof=1)
    v = np.diag(cov) + 1e-8
    m = (b - 1) * cov / np.sqrt(np.outer(v, v))  # z_s^T z_s with z_s standardised by the unbiased std
    expected = (m[~np.eye(d, dtype=bool)] ** 2).mean() / b
    assert decorrelation_loss(torch.tensor(z), normalization="official").item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("shape", [(8, 3), (32, 6), (64, 16)])  # (B, D)
def test_official_is_about_b_times_the_paper_loss_less_its_diagonal(shape):
    """official = (B - 1)^2 / B * D / (D - 1) * (paper - 1 / D), up to eps: the factor of docs/baselines.md."""
    b, d = shape
    z = torch.tensor(np.random.default_rng(b).normal(size=shape))
    paper, official = (decorrelation_loss(z, normalization=n).item() for n in ("paper", "official"))
    assert official == pytest.approx((b - 1) ** 2 / b * d / (d - 1) * (paper - 1 / d), rel=1e-6)


def test_official_gradient_is_the_paper_gradient_times_the_factor():
    b, d = 16, 4
    z0 = torch.tensor(np.random.default_rng(3).normal(size=(b, d)))
    grads = []
    for normalization in ("paper", "official"):
        z = z0.clone().requires_grad_(True)
        decorrelation_loss(z, eps=0.0, normalization=normalization).backward()
        grads.append(z.grad)
    assert torch.allclose(grads[1], (b - 1) ** 2 / b * d / (d - 1) * grads[0], rtol=1e-9, atol=1e-12)


def test_official_option_in_a_local_step():
    beta = 0.3
    model = Deep2()
    decorr = FedDecorr(beta=beta, normalization="official")
    fedavg = FedAvg()
    decorr.setup(model, (2,))
    down = {"fedavg": fedavg.downlink(fedavg.init_server(model, 1), 0)}
    result = run_client(Recipe(fedavg, [decorr]), model, down)
    r = np.corrcoef(X @ V0.T + C0, rowvar=False)[0, 1]
    b = len(X)
    assert result.metrics["feddecorr/decorr"] == pytest.approx(beta * ((b - 1) * r) ** 2 / b, rel=1e-4)


def test_unknown_normalization_is_a_config_error():
    with pytest.raises(ConfigError, match=r"feddecorr\.normalization must be one of paper, official, got 'flower'"):
        FedDecorr(normalization="flower")


def test_official_needs_two_features():
    with pytest.raises(ConfigError, match=r"feddecorr\.normalization='official' .* D >= 2 features, got D=1; "
                                          r"use normalization='paper'"):
        decorrelation_loss(torch.randn(8, 1), normalization="official")
    assert float(decorrelation_loss(torch.randn(8, 1))) == pytest.approx(1.0, abs=1e-6)  # paper: (1 / 1)^2
