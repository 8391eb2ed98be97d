"""Distance correlation (FLea Eq. 5 / 8): against Szekely, Rizzo and Bakirov's definition (2007) written
here in numpy from pairwise differences, and against figures of the independent ``dcor`` package (0.7,
recorded: importing it compiles numba code for 45 s, and two pytest processes compiling it at once
corrupted its cache and aborted both); properties (scale invariance over 1e-6 ... 1e6, degenerate inputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedaug.core.errors import ConfigError
from fedaug.privacy.dcor import centred_distances, distance_correlation


def _definition(x: np.ndarray, f: np.ndarray, squared: bool) -> float:
    """dCor^2 = dCov^2(x, f) / sqrt(dVar^2(x) dVar^2(f)), each dCov^2 the mean product of double-centred
    Euclidean distance matrices (the V-statistic); x (n, dx), f (n, df)."""
    def centred(z: np.ndarray) -> np.ndarray:
        a = np.sqrt(((z[:, None, :] - z[None, :, :]) ** 2).sum(-1))
        return a - a.mean(0, keepdims=True) - a.mean(1, keepdims=True) + a.mean()

    a, b = centred(x), centred(f)
    r2 = (a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean())
    return float(r2 if squared else np.sqrt(r2))


def _dependent(n: int, dx: int, df: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dx, generator=g, dtype=torch.float64)
    f = torch.tanh(x @ torch.randn(dx, df, generator=g, dtype=torch.float64)) + 0.5 * torch.randn(n, df, generator=g, dtype=torch.float64)
    return x, f


#: (n, dx, df, seed) -> dcor 0.7's (distance_correlation_sqr, distance_correlation) of :func:`_dependent`
DCOR_PACKAGE = {
    (8, 3, 2, 0): (0.7084521050565412, 0.8416959694904932),      # tiny batch
    (32, 10, 4, 1): (0.5310644387135548, 0.7287416817457025),    # x (32, 10), f (32, 4)
    (64, 784, 16, 2): (0.7072943303053967, 0.8410079252334051),  # flattened 28x28 images -> 16 features
}


@pytest.mark.parametrize("case", list(DCOR_PACKAGE))
@pytest.mark.parametrize("squared", [True, False])
def test_matches_the_definition_and_the_dcor_package_on_random_dependent_data(case, squared):
    x, f = _dependent(*case)
    got = float(distance_correlation(x, f, squared=squared))
    assert got == pytest.approx(_definition(x.numpy(), f.numpy(), squared), abs=1e-9)
    assert got == pytest.approx(DCOR_PACKAGE[case][0 if squared else 1], abs=1e-6)


def test_flattens_per_sample_like_the_reference():
    g = torch.Generator().manual_seed(3)
    x, f = torch.randn(16, 1, 4, 4, generator=g, dtype=torch.float64), torch.randn(16, 2, 3, generator=g, dtype=torch.float64)
    assert float(distance_correlation(x, f)) == pytest.approx(0.6865542246373324, abs=1e-6)  # dcor 0.7's figure
    assert float(distance_correlation(x, f)) == pytest.approx(_definition(x.flatten(1).numpy(), f.flatten(1).numpy(), True), abs=1e-9)


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


scale_st = st.floats(-6.0, 6.0).map(lambda e: 10.0**e)  # 1e-6 ... 1e6, log-uniform


@settings(max_examples=40, deadline=None, derandomize=True)
@given(a=scale_st, b=scale_st, seed=st.integers(0, 2**16), squared=st.booleans())
def test_scale_invariant_from_1e_minus_6_to_1e6(a: float, b: float, seed: int, squared: bool) -> None:
    """dCor(a x, b f) = dCor(x, f) within 1e-9 (float64) and 1e-5 (float32); gradients w.r.t. x agree
    within 1e-6 (float64) of their norm: only rounding separates the two sides."""
    g = torch.Generator().manual_seed(seed)
    x64 = torch.randn(12, 784, generator=g, dtype=torch.float64)  # flattened 28x28 inputs: the case
    f64 = torch.tanh(x64[:, :8] * 3) + 0.3 * torch.randn(12, 8, generator=g, dtype=torch.float64)
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
        x, f = x64.to(dtype), f64.to(dtype)
        assert float(distance_correlation(a * x, b * f, squared=squared)) == pytest.approx(
            float(distance_correlation(x, f, squared=squared)), abs=tol)
    x = x64.clone().requires_grad_(True)
    distance_correlation(x, f64, squared=squared).backward()
    xs = x64.clone().requires_grad_(True)
    distance_correlation(a * xs, b * f64, squared=squared).backward()
    assert float((xs.grad - x.grad).norm()) <= 1e-6 * float(x.grad.norm())


@pytest.mark.parametrize("scale", [1e-6, 1e-4, 1.0, 1e6])
def test_constant_side_gives_zero_and_finite_zero_gradients(scale: float) -> None:
    g = torch.Generator().manual_seed(7)
    x = (scale * torch.randn(6, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
    f = torch.full((6, 2), scale, dtype=torch.float64, requires_grad=True)
    for first, second in ((x, f), (f, x), (f, f * 2)):
        c = distance_correlation(first, second)
        assert float(c.detach()) == 0.0
        (gx, gf) = torch.autograd.grad(c, (x, f), allow_unused=True, materialize_grads=True)
        assert bool(torch.isfinite(gx).all()) and bool(torch.isfinite(gf).all())
        assert float(gx.abs().sum()) == 0.0 and float(gf.abs().sum()) == 0.0


def test_duplicate_rows_at_a_tiny_scale_keep_finite_gradients() -> None:
    g = torch.Generator().manual_seed(8)
    base = torch.randn(5, 4, generator=g, dtype=torch.float64)
    x = (1e-6 * torch.cat([base, base[:2]])).requires_grad_(True)  # rows 5, 6 duplicate rows 0, 1
    f = torch.relu(base @ torch.randn(4, 3, generator=g, dtype=torch.float64))
    c = distance_correlation(x, torch.cat([f, f[:2]]))
    c.backward()
    assert 0.0 < float(c.detach()) <= 1.0 and bool(torch.isfinite(x.grad).all())


def _direct(z: torch.Tensor) -> torch.Tensor:
    return (z.unsqueeze(1) - z.unsqueeze(0)).pow(2).sum(-1)


@pytest.mark.parametrize("n, d, offset", [(2, 3, 0.0), (32, 12544, 0.0), (16, 784, 1e3)])
def test_gram_distances_match_the_differences(n: int, d: int, offset: float) -> None:
    """The Gram form (centred first) equals the sum of squared differences: to float64 rounding,
    and to about 1e-6 of the largest distance in float32 even with a large common offset; it is
    symmetric, non-negative and exactly zero on the diagonal."""
    from fedaug.privacy.dcor import _squared_distances

    z = torch.randn(n, d, generator=torch.Generator().manual_seed(n), dtype=torch.float64) + offset
    direct = _direct(z)
    torch.testing.assert_close(_squared_distances(z), direct, rtol=1e-12, atol=1e-12 * float(direct.max()))
    sq = _squared_distances(z.float())
    assert torch.equal(sq, sq.T) and bool((sq >= 0).all()) and bool((sq.diagonal() == 0).all())
    exact = _direct(z.float().double())  # the float32 input's own distances
    assert float((sq.double() - exact).abs().max()) < 1e-6 * float(exact.max())
