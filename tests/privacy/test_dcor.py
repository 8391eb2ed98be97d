"""Distance correlation (FLea Eq. 5 / 8): against the independent ``dcor`` package, properties."""

from __future__ import annotations

import dcor
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.privacy.dcor import centred_distances, distance_correlation


@pytest.mark.parametrize("n, dx, df, seed", [
    (8, 3, 2, 0),      # tiny batch
    (32, 10, 4, 1),    # x (32, 10), f (32, 4)
    (64, 784, 16, 2),  # flattened 28x28 images -> 16 features
])
@pytest.mark.parametrize("squared", [True, False])
def test_matches_the_dcor_package_on_random_dependent_data(n, dx, df, seed, squared):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dx, generator=g, dtype=torch.float64)
    f = torch.tanh(x @ torch.randn(dx, df, generator=g, dtype=torch.float64)) + 0.5 * torch.randn(n, df, generator=g, dtype=torch.float64)
    ref = (dcor.distance_correlation_sqr if squared else dcor.distance_correlation)(x.numpy(), f.numpy())
    assert float(distance_correlation(x, f, squared=squared)) == pytest.approx(ref, abs=1e-6)


def test_flattens_per_sample_like_the_reference():
    g = torch.Generator().manual_seed(3)
    x, f = torch.randn(16, 1, 4, 4, generator=g, dtype=torch.float64), torch.randn(16, 2, 3, generator=g, dtype=torch.float64)
    ref = dcor.distance_correlation_sqr(x.flatten(1).numpy(), f.flatten(1).numpy())
    assert float(distance_correlation(x, f)) == pytest.approx(ref, abs=1e-6)


def test_equals_one_for_a_linear_map():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50, 6, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    assert float(distance_correlation(x, 2.5 * x @ q + 1.0)) == pytest.approx(1.0, abs=1e-9)


def test_near_zero_for_independent_data():
    g = torch.Generator().manual_seed(5)
    x, f = torch.randn(1000, 4, generator=g), torch.randn(1000, 4, generator=g)
    assert float(distance_correlation(x, f)) < 0.03  # the V-statistic's small positive bias at n = 1000


def test_in_unit_interval_and_differentiable():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(12, 5, generator=g)
    w = torch.randn(5, 3, generator=g, requires_grad=True)
    c = distance_correlation(x, torch.relu(x @ w))
    assert 0.0 <= float(c.detach()) <= 1.0
    c.backward()
    assert w.grad is not None and bool(torch.isfinite(w.grad).all()) and float(w.grad.abs().sum()) > 0


def test_constant_features_give_zero_not_nan():
    x = torch.randn(6, 3)
    assert float(distance_correlation(x, torch.ones(6, 2))) == 0.0


def test_centred_distance_rows_and_columns_sum_to_zero():
    e = centred_distances(torch.randn(7, 3, dtype=torch.float64))
    assert torch.allclose(e.sum(0), torch.zeros(7, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(e.sum(1), torch.zeros(7, dtype=torch.float64), atol=1e-12)


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match=r"n >= 2.*got 1 and 1"):
        distance_correlation(torch.randn(1, 3), torch.randn(1, 2))
    with pytest.raises(ConfigError, match=r"got 4 and 3"):
        distance_correlation(torch.randn(4, 3), torch.randn(3, 2))
