"""Robust aggregation functions: golden values against Flower's own functions on the same inputs,
hand-computed cases, properties (Hypothesis, derandomised), and the robust spread's consistency."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedaug.methods.robust import (
    MAD_TO_STD, clamp_to_robust_range, coordinate_median, krum_scores, krum_select, num_trimmed, robust_centre,
    robust_variance, trimmed_mean,
)


def clients(seed: int, num: int, shape: tuple[int, ...] = (3, 4)) -> list[np.ndarray]:
    return [np.random.default_rng(seed + k).normal(size=shape) for k in range(num)]


def as_tensors(arrays: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.tensor(a) for a in arrays]


# --- golden values: Flower's functions on the same numpy lists ---------------------------------
@pytest.mark.parametrize("num", [1, 2, 5, 6])  # odd and even M (numpy's median averages the middle two)
def test_median_equals_flowers(num):
    xs = clients(0, num)
    expected = aggregate_median([([x], 1) for x in xs])[0]
    np.testing.assert_allclose(coordinate_median(as_tensors(xs)).numpy(), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("num, beta", [(10, 0.1), (10, 0.2), (7, 0.3), (4, 0.1), (5, 0.0)])
def test_trimmed_mean_equals_flowers(num, beta):
    # both drop floor(beta M) at each end (scipy.stats.trim_mean's convention)
    xs = clients(1, num)
    expected = aggregate_trimmed_avg([([x], 1) for x in xs], proportiontocut=beta)[0]
    np.testing.assert_allclose(trimmed_mean(as_tensors(xs), beta).numpy(), expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("num, f", [(5, 1), (7, 2), (9, 1)])
def test_krum_equals_flowers(num, f):
    # M > 2f + 2, where Flower's neighbour count max(1, M - f - 2) is the paper's M - f - 2
    xs = clients(2, num, (6,))
    expected = aggregate_krum([([x], 1) for x in xs], num_malicious=f, to_keep=0)[0]
    (best,) = krum_select(as_tensors(xs), f, 1)
    np.testing.assert_array_equal(xs[best], expected)


@pytest.mark.parametrize("num, f, m", [(7, 1, 3), (9, 2, 5)])
def test_multi_krum_selection_equals_flowers_with_equal_examples(num, f, m):
    # Flower averages the m selected weighted by examples: with equal counts that is the paper's mean
    xs = clients(3, num, (6,))
    expected = aggregate_krum([([x], 10) for x in xs], num_malicious=f, to_keep=m)[0]
    chosen = krum_select(as_tensors(xs), f, m)
    np.testing.assert_allclose(np.mean([xs[i] for i in chosen], axis=0), expected, rtol=1e-13)


# --- hand-computed ------------------------------------------------------------------------------
def test_hand_computed_values():
    x = torch.tensor([[1.0, 10.0], [5.0, -2.0], [2.0, 0.0], [100.0, 3.0]])  # (M=4, 2)
    assert coordinate_median(x).tolist() == [3.5, 1.5]
    assert trimmed_mean(x, 0.25).tolist() == [3.5, 1.5]  # drops 1 at each end: mean of the middle two
    assert trimmed_mean(x, 0.0).tolist() == [27.0, 2.75]
    # Krum, f = 0: neighbours M - 2 = 2; client 2's two nearest are 1 (d^2 = 9 + 4) and 0 (1 + 100)
    pts = torch.tensor([[0.0], [1.0], [2.0], [10.0]])  # (4, 1)
    assert krum_scores(pts, 0).tolist() == [1.0 + 4.0, 1.0 + 1.0, 1.0 + 4.0, 64.0 + 81.0]
    assert krum_select(pts, 0, 1) == [1]
    assert krum_select(pts, 0, 3) == [1, 0, 2]  # equal scores: the lower index first


def test_refusals():
    with pytest.raises(ValueError, match=r"\[0, 0\.5\)"):
        num_trimmed(10, 0.5)
    with pytest.raises(ValueError, match=r"M > 2f \+ 2 = 4 updates .*got M=4"):
        krum_scores(torch.zeros(4, 3), 1)
    with pytest.raises(ValueError, match=r"1 <= m <= M - f = 4"):
        krum_select(torch.zeros(5, 3), 1, 5)
    with pytest.raises(ValueError, match="at least one"):
        coordinate_median([])


# --- properties ---------------------------------------------------------------------------------
finite = st.floats(-1e6, 1e6, allow_nan=False)
client_rows = st.integers(1, 9).flatmap(lambda m: arrays(np.float64, (m, 3), elements=finite))


@settings(derandomize=True, max_examples=150, deadline=None)
@given(x=client_rows, beta=st.sampled_from([0.0, 0.1, 0.25, 0.4]), seed=st.integers(0, 2**16))
def test_median_and_trimmed_mean_lie_in_the_range_and_ignore_order(x, beta, seed):
    t = torch.tensor(x)
    perm = torch.randperm(t.shape[0], generator=torch.Generator().manual_seed(seed))
    lo, hi = t.min(0).values, t.max(0).values
    ulps = 1e-12 * t.abs().max(0).values  # a mean of equal values may be off by rounding
    for fn in (coordinate_median, lambda v: trimmed_mean(v, beta)):
        out = fn(t)
        assert bool(((out >= lo - ulps) & (out <= hi + ulps)).all())
        assert torch.equal(fn(t[perm]), out)  # order-free (DESIGN invariant 1): a sort, not a sum order


@settings(derandomize=True, max_examples=150, deadline=None)
@given(x=st.integers(2, 9).flatmap(lambda m: arrays(np.float64, (m, 3), elements=st.floats(-10, 10))),
       outlier=st.floats(-1e300, 1e300, allow_nan=False), where=st.integers(0, 100))
def test_one_outlier_of_any_magnitude_stays_within_the_honest_range(x, outlier, where):
    # M >= 3 with one outlier: the median, and a trimmed mean that trims >= 1, stay within the honest clients' range
    honest = torch.tensor(x)
    row = torch.full((1, 3), outlier, dtype=torch.float64)
    k = where % (honest.shape[0] + 1)
    t = torch.cat([honest[:k], row, honest[k:]])
    lo, hi = honest.min(0).values, honest.max(0).values
    beta = 1 / t.shape[0]  # floor(beta M) = 1
    for out in (coordinate_median(t), trimmed_mean(t, beta)):
        assert bool(((out >= lo - 1e-12) & (out <= hi + 1e-12)).all())


# --- robust centre and spread -------------------------------------------------------------------
@pytest.mark.parametrize("rule, tol", [("mean", 0.02), ("median", 0.05), ("trimmed_mean", 0.03)])
def test_robust_variance_is_the_variance_for_normal_data(rule, tol):
    # (M=20000, C=4) draws of N(3, 2^2): each rule's spread estimates 4 (consistency scaling) within tol
    x = 3.0 + 2.0 * torch.randn(20000, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    np.testing.assert_allclose(robust_variance(x, rule, 0.1).numpy(), 4.0, rtol=tol)
    np.testing.assert_allclose(robust_centre(x, rule, 0.1).numpy(), 3.0, atol=0.05)


def test_robust_variance_hand_computed():
    x = torch.tensor([[1.0], [2.0], [4.0], [100.0]])  # median 3, |x - 3| = 2, 1, 1, 97: MAD 1.5
    assert robust_variance(x, "median").item() == pytest.approx((MAD_TO_STD * 1.5) ** 2)
    assert robust_variance(x, "mean").item() == pytest.approx(np.var([1.0, 2.0, 4.0, 100.0]))
    assert robust_variance(x, "trimmed_mean", 0.1).item() == pytest.approx(np.var([1.0, 2.0, 4.0, 100.0]))  # b=0


def test_clamp_to_robust_range():
    x = torch.tensor([[1.0], [2.0], [3.0], [2.5], [1e4]])  # (5, 1): one outlier
    out = clamp_to_robust_range(x, "median")
    half = 3 * MAD_TO_STD * 0.5  # median 2.5, MAD 0.5
    assert out[:4].tolist() == x[:4].tolist()  # the honest values are inside
    assert out[4].item() == pytest.approx(2.5 + half)
    assert clamp_to_robust_range(x, "mean") is x
