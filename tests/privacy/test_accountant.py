"""The accountant: closed forms computed here independently (RDP of the Gaussian and of the
Poisson-subsampled Gaussian, the analytic Gaussian mechanism), composition, monotonicity, the
engine's entry point and its errors."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import gammaln, logsumexp

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError, FedaugError
from fedaug.privacy.accountant import Accountant, dp_accounting, run_accountant
from fedaug.privacy.release import GaussianRelease
from tests.conftest import tiny_raw

DELTA = 1e-5
#: the RDP orders dp_accounting's RdpAccountant evaluates (its DEFAULT_RDP_ORDERS)
ORDERS = [1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


def rdp_to_epsilon(orders, rdp, delta: float) -> float:
    """eps = min_a rdp(a) + log((a - 1) / a) - (log delta + log a) / (a - 1) (Canonne, Kamath and
    Steinke 2020, Prop. 12), written out here."""
    return min(r + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1) for a, r in zip(orders, rdp))


def subsampled_gaussian_rdp(q: float, z: float, alpha: int) -> float:
    """RDP of order ``alpha`` (integer) of the Poisson-subsampled Gaussian (Mironov, Talwar and Zhang
    2019, Thm. 5): log(sum_k C(a, k) (1 - q)^(a - k) q^k exp((k^2 - k) / (2 z^2))) / (a - 1)."""
    k = np.arange(alpha + 1)
    log_binom = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1)
    terms = log_binom + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * z * z)
    return float(logsumexp(terms)) / (alpha - 1)


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact eps of the Gaussian mechanism with sensitivity 1 and std sigma (Balle and Wang 2018,
    Thm. 8): the root of Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) = delta."""
    phi = scipy.stats.norm.cdf
    return scipy.optimize.brentq(
        lambda e: phi(0.5 / sigma - e * sigma) - math.exp(e) * phi(-0.5 / sigma - e * sigma) - delta, 0.0, 200.0)


def release(z: float = 1.0, schedule: str = "every_round", unit: str = "client", what: str = "model update"):
    return GaussianRelease(what, z, 1.0, schedule, unit)


@pytest.mark.parametrize("z, rounds", [(1.0, 1), (1.0, 10), (2.5, 30), (0.7, 4)])
def test_full_participation_matches_the_gaussian_rdp_closed_form(z, rounds):
    # every round, q = 1: RDP(a) = T a / (2 z^2), then the conversion
    expected = rdp_to_epsilon(ORDERS, [rounds * a / (2 * z * z) for a in ORDERS], DELTA)
    total, per = Accountant((release(z),), 10, 10, DELTA).epsilon(rounds)
    assert total == pytest.approx(expected, rel=1e-9) and per == {"model update": total}


def test_one_release_rdp_bounds_and_pld_matches_the_analytic_gaussian():
    exact = analytic_gaussian_epsilon(1.0, DELTA)  # 4.22 for z = 1
    rdp = Accountant((release(1.0),), 5, 5, DELTA, "rdp").epsilon(1)[0]
    pld = Accountant((release(1.0),), 5, 5, DELTA, "pld").epsilon(1)[0]
    assert exact < rdp < 1.2 * exact  # RDP is an upper bound, a loose one at T = 1
    assert pld == pytest.approx(exact, rel=2e-3) and pld >= exact * (1 - 1e-4)  # PLD: tight (discretised)


def test_pld_composition_of_gaussians_is_one_gaussian_with_z_over_sqrt_t():
    z, rounds = 2.0, 16
    exact = analytic_gaussian_epsilon(z / math.sqrt(rounds), DELTA)
    assert Accountant((release(z),), 4, 4, DELTA, "pld").epsilon(rounds)[0] == pytest.approx(exact, rel=5e-3)


def test_client_sampling_uses_the_subsampled_gaussian_rdp():
    q, z, rounds = 0.1, 1.1, 100  # 10 of 100 clients per round (DP-FedAvg's setting, McMahan et al. 2018)
    acc = Accountant((release(z),), 100, 10, DELTA)
    orders, curve = acc._rdp_curve(acc.releases[0])
    integer = [(i, a) for i, a in enumerate(orders) if float(a).is_integer() and a <= 256]
    computed = [subsampled_gaussian_rdp(q, z, int(a)) for _, a in integer]
    np.testing.assert_allclose([curve[i] for i, _ in integer], computed, rtol=1e-8)
    # eps over the integer orders alone (golden, computed here) bounds the accountant's from above,
    # which also uses fractional orders; within 3 %
    golden = rdp_to_epsilon([a for _, a in integer], [rounds * c for c in computed], DELTA)
    eps = acc.epsilon(rounds)[0]
    assert golden * 0.97 < eps <= golden + 1e-9
    assert eps < Accountant((release(z),), 100, 100, DELTA).epsilon(rounds)[0] / 3  # sampling amplifies


@pytest.mark.parametrize("method", ["rdp", "pld"])
def test_cached_composition_equals_a_fresh_library_accountant_on_the_whole_ledger(method):
    dpa = dp_accounting()
    releases = (release(1.3), release(2.0, "once", "sample", "fedrdn statistics"), release(4.0, what="model update"))
    acc = Accountant(releases, 20, 5, DELTA, method)
    rounds = 7
    ledger = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(acc.round_event(r), acc.count(r, rounds)) for r in releases])
    fresh = dpa.rdp.RdpAccountant() if method == "rdp" else dpa.pld.PLDAccountant()
    fresh.compose(ledger)
    total, per = acc.epsilon(rounds)
    assert total == pytest.approx(fresh.get_epsilon(DELTA), rel=1e-6)
    assert set(per) == {"model update", "fedrdn statistics"}  # equal names compose into one entry
    assert total >= max(per.values())


def test_two_equal_gaussian_releases_compose_like_one_with_z_over_sqrt_2():
    z = 1.5
    two = Accountant((release(z), release(z, what="fedfa statistics")), 8, 8, DELTA).epsilon(3)[0]
    one = Accountant((release(z / math.sqrt(2)),), 8, 8, DELTA).epsilon(3)[0]
    assert two == pytest.approx(one, rel=1e-9)


def test_a_once_release_does_not_grow_with_rounds_and_is_not_amplified():
    once = release(1.0, "once", "sample", "fedrdn statistics")
    full = Accountant((once,), 10, 10, DELTA)
    sampled = Accountant((once,), 10, 2, DELTA)
    assert full.epsilon(1)[0] == full.epsilon(50)[0] == sampled.epsilon(50)[0]


@settings(max_examples=15, deadline=None)
@given(z=st.floats(0.6, 4.0), m=st.integers(1, 10), rounds=st.integers(1, 40))
def test_epsilon_grows_with_rounds_and_shrinks_with_noise(z, m, rounds):
    acc = Accountant((release(z),), 10, m, DELTA)
    assert 0 < acc.epsilon(rounds)[0] < acc.epsilon(rounds + 1)[0]
    assert Accountant((release(1.25 * z),), 10, m, DELTA).epsilon(rounds)[0] < acc.epsilon(rounds)[0]


def test_zero_noise_is_no_guarantee():
    assert Accountant((release(0.0),), 4, 2, DELTA).epsilon(3)[0] == math.inf
    assert Accountant((release(0.0),), 4, 2, DELTA, "pld").epsilon(3)[0] == math.inf


@pytest.mark.parametrize("kwargs, message", [
    ({"delta": 1.0}, r"privacy\.delta must be in \(0, 1\), got 1\.0"),
    ({"delta": 0.0}, r"privacy\.delta must be in \(0, 1\), got 0\.0"),
    ({"method": "moments"}, r"privacy\.accountant must be one of rdp, pld, got 'moments'"),
    ({"clients_per_round": 0}, r"clients per round must be in 1\.\.4, got 0"),
])
def test_bad_accountant_settings_are_one_config_error(kwargs, message):
    args = {"releases": (release(),), "num_clients": 4, "clients_per_round": 2, "delta": DELTA} | kwargs
    with pytest.raises(ConfigError, match=message):
        Accountant(**args)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2.0])
def test_schema_refuses_a_delta_outside_the_open_interval(delta):
    raw = tiny_raw()
    raw["privacy"] = {"delta": delta}
    with pytest.raises(ConfigError, match=r"'privacy\.delta' must be > 0\.0 and < 1\.0"):
        validate(raw)


def test_schema_defaults_and_choices():
    cfg = validate(tiny_raw())
    assert (cfg.privacy.delta, cfg.privacy.accountant) == (1e-5, "rdp")
    raw = tiny_raw()
    raw["privacy"] = {"accountant": "opacus"}
    with pytest.raises(ConfigError, match=r"'privacy\.accountant' must be one of rdp, pld"):
        validate(raw)


@dataclass
class Stub:
    """A component as the accountant reads it (e.g. DP-FedAvg's server rule, branch wt-robust)."""

    role: str
    releases: tuple[GaussianRelease, ...] = ()


def test_run_accountant_reads_the_components_declarations():
    assert run_accountant([Stub("server"), Stub("augmentation")], 10, 5, DELTA, "rdp") is None
    fedavg = Stub("server", (GaussianRelease("model update", 1.1, 0.5, "every_round", "client"),))
    acc = run_accountant([fedavg, Stub("augmentation")], 10, 5, DELTA, "rdp")
    assert acc.model_protected and acc.unit == "client" and acc.sampling_probability == 0.5
    record = acc.record(3)
    assert record["releases"].keys() == {"model update"} and math.isfinite(record["epsilon"])
    assert record["delta"] == DELTA
    flea = Stub("augmentation", (GaussianRelease("flea features", 1.0, 2.0, "every_round", "sample"),))
    both = run_accountant([fedavg, flea], 10, 5, DELTA, "rdp")
    assert both.unit == "sample" and both.record(3)["epsilon"] > max(both.record(3)["releases"].values())
    assert not run_accountant([Stub("server"), flea], 10, 5, DELTA, "rdp").model_protected


def test_without_dp_accounting_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    with pytest.raises(FedaugError, match=r"pip install 'fedaug\[privacy\]' \(dp-accounting==0\.6\.0\)"):
        Accountant((release(),), 4, 2, DELTA)
