"""Statistics of the comparison tables and feature analyses: golden values, computed independently."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import davies_bouldin_score

from fedaug.core.errors import ConfigError
from fedaug.report.stats import davies_bouldin, interval_text, mean_std, paired_ttest, pca_2d


def test_mean_std_is_the_sample_std():
    assert mean_std([0.5]) == (0.5, 0.0)
    m, s = mean_std([0.1, 0.2, 0.6])
    assert m == pytest.approx(0.3) and s == pytest.approx(np.std([0.1, 0.2, 0.6], ddof=1))
    with pytest.raises(ValueError):
        mean_std([])


@pytest.mark.parametrize("a, b", [
    ([0.70, 0.72, 0.69], [0.65, 0.66, 0.67]),          # method better on every seed
    ([0.50, 0.61, 0.40, 0.55], [0.52, 0.58, 0.45, 0.50]),
])
def test_paired_ttest_matches_scipy(a, b):
    res = paired_ttest(a, b)
    ref = stats.ttest_rel(a, b)
    assert res.n == len(a) and res.diff == pytest.approx(np.mean(np.subtract(a, b)))
    assert res.t == pytest.approx(ref.statistic) and res.p == pytest.approx(ref.pvalue)
    assert res.text() == f"{ref.pvalue:.3g} (n={len(a)})"


def test_paired_ttest_by_hand():
    # d = (0.1, 0.3): mean 0.2, sd sqrt(0.02), t = 0.2 / (sqrt(0.02) / sqrt(2)) = 2; p = 2 * (1 - F_t1(2))
    res = paired_ttest([0.6, 0.8], [0.5, 0.5])
    assert res.t == pytest.approx(2.0)
    assert res.p == pytest.approx(1 - 2 * math.atan(2) / math.pi)  # Student t with 1 dof is Cauchy


# paired differences d = method - baseline, and their 95 % interval mean(d) -/+ t * sd(d) / sqrt(n) by hand, with
# Student t's 0.975 quantiles from a printed table (t_1 = 12.706, t_2 = 4.303, t_4 = 2.776):
CI_BY_HAND = [
    ([0.1, 0.3], 0.2 - 12.706 * 0.1, 0.2 + 12.706 * 0.1),                           # sd sqrt(0.02), se 0.1
    ([1.0, 2.0, 3.0], 2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)),          # sd 1
    ([-2.0, 0.0, 2.0, 4.0, 6.0], 2 - 2.776 * math.sqrt(2), 2 + 2.776 * math.sqrt(2)),  # sd sqrt(10), se sqrt(2)
]


@pytest.mark.parametrize("d, low, high", CI_BY_HAND)
def test_the_confidence_interval_of_the_mean_difference_by_hand(d, low, high):
    res = paired_ttest(d, [0.0] * len(d))
    assert res.ci_low == pytest.approx(low, abs=1e-3) and res.ci_high == pytest.approx(high, abs=1e-3)


@pytest.mark.parametrize("a, b", [
    ([0.70, 0.72, 0.69], [0.65, 0.66, 0.67]),
    ([0.50, 0.61, 0.40, 0.55], [0.52, 0.58, 0.45, 0.50]),
    ([0.81, 0.64, 0.77, 0.70, 0.73, 0.69], [0.80, 0.70, 0.71, 0.66, 0.74, 0.61]),
])
def test_the_confidence_interval_matches_scipy_and_the_p_value(a, b):
    res = paired_ttest(a, b)
    d = np.subtract(a, b)
    half = stats.t.ppf(0.975, len(d) - 1) * np.std(d, ddof=1) / math.sqrt(len(d))
    assert (res.ci_low, res.ci_high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
    ref = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (res.ci_low, res.ci_high) == pytest.approx((ref.low, ref.high), rel=1e-9)
    # the interval excludes 0 exactly when the two-sided p-value is below 0.05
    assert (res.ci_low > 0 or res.ci_high < 0) == (res.p < 0.05)


def test_the_interval_is_undefined_where_the_p_value_is():
    for res in (paired_ttest([], []), paired_ttest([0.7], [0.6]), paired_ttest([0.7, 0.8], [0.6, 0.7])):
        assert res.p is None and res.ci_low is None and res.ci_high is None


@pytest.mark.parametrize("low, high, kwargs, text", [
    (-0.031, 0.0872, {"scale": 100}, "[-3.10, +8.72]"),
    (0.012, 0.05, {"scale": 100, "decimals": 1}, "[+1.2, +5.0]"),
    (-2.5, -0.25, {}, "[-2.50, -0.25]"),
    (None, None, {"scale": 100}, "n/a"),
])
def test_interval_text(low, high, kwargs, text):
    assert interval_text(low, high, **kwargs) == text


def test_paired_ttest_undefined_cases_say_why():
    assert paired_ttest([], []).text() == "n/a (n=0)"
    one = paired_ttest([0.7], [0.6])
    assert one.p is None and one.diff == pytest.approx(0.1) and one.text() == "n/a (n=1)"
    same = paired_ttest([0.7, 0.8], [0.6, 0.7])
    assert same.p is None and same.text() == "n/a (n=2; all differences equal)"
    with pytest.raises(ValueError, match="differ in length"):
        paired_ttest([0.1], [0.1, 0.2])


def test_davies_bouldin_by_hand():
    # clusters {(0,0), (2,0)} and {(10,0), (10,2)}: centroids (1,0), (10,1); spreads 1 and 1;
    # centroid distance sqrt(82); DB = mean of (1 + 1) / sqrt(82) for both clusters
    x = np.array([[0, 0], [2, 0], [10, 0], [10, 2]], dtype=float)
    assert davies_bouldin(x, np.array(["a", "a", "b", "b"])) == pytest.approx(2 / math.sqrt(82))


def test_davies_bouldin_matches_scikit_learn():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, s, (30, 5)) for c, s in ((0, 1), (3, 0.5), (-2, 2))])
    labels = np.repeat([0, 1, 2], 30)
    assert davies_bouldin(x, labels) == pytest.approx(davies_bouldin_score(x, labels))
    assert davies_bouldin(np.zeros((4, 2)), np.array([0, 0, 1, 1])) == 0.0  # coinciding clusters
    with pytest.raises(ConfigError, match="at least 2 clusters"):
        davies_bouldin(x, np.zeros(90))


def test_pca_2d_equals_the_top_eigenvectors_projection():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=g) * torch.tensor([10.0, 3.0, 0.1])
    y = pca_2d(x)
    assert y.shape == (200, 2) and y.dtype == torch.float32
    centred = (x - x.mean(0)).double().numpy()
    _, vecs = np.linalg.eigh(centred.T @ centred)          # ascending eigenvalues
    ref = centred @ vecs[:, ::-1][:, :2]
    assert np.allclose(np.abs(y.numpy()), np.abs(ref), atol=1e-3)
    loadings = np.linalg.lstsq(centred, y.double().numpy(), rcond=None)[0]   # (3, 2): the components
    assert (loadings[np.abs(loadings).argmax(0), [0, 1]] > 0).all()          # sign convention
    assert torch.equal(pca_2d(x), y)                                          # deterministic
    assert pca_2d(torch.randn(5, 1, generator=g)).shape == (5, 2)             # one feature: a zero column
