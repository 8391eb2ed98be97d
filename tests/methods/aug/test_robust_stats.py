"""Robust shared statistics (``stats_rule``) of FedFA, VFDA and FedRDN: one poisoned client
(running std x 1e4, running mean + 1e3) barely moves what the server sends under ``median`` and
``trimmed_mean``, and moves it by orders of magnitude under the papers' ``mean``; ``mean`` is
the papers' computation, unchanged."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.layers.functional import client_sharing_variance
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.aug.fedrdn import FedRDN
from fedaug.methods.aug.vfda import VFDA
from fedaug.methods.component import Uplink

C = 16  # channels
ROBUST = ("median", "trimmed_mean")


def clean_stats(num: int, seed: int = 0, centre: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``num`` clients' running means ``(M, C)`` ~ N(centre, 0.5^2) and stds ``(M, C)`` in [0.5, 1.5], float32."""
    g = torch.Generator().manual_seed(seed)
    return (centre + 0.5 * torch.randn(num, C, generator=g),
            1.0 + 0.2 * torch.randn(num, C, generator=g).clamp(-2.5, 2.5))


def poisoned(means: torch.Tensor, stds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    means, stds = means.clone(), stds.clone()
    means[0] += 1e3
    stds[0] *= 1e4
    return means, stds


def moved(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> float:
    """The largest relative change ``||new - old|| / ||old||`` over the downlink quantities."""
    return max(float((new[k].double() - old[k].double()).norm() / old[k].double().norm()) for k in old)


def aggregate_featstats(aug, means: torch.Tensor, stds: torch.Tensor) -> dict[str, torch.Tensor]:
    """The downlink part from ``aug.aggregate`` over one layer ``l`` with M uplinks."""
    server = {"layers": ["l"], "part": {}, "channels": {"l": C}}
    ups = [Uplink(k, 10, {"l.running_mean": means[k], "l.running_std": stds[k]}) for k in range(len(means))]
    return aug.aggregate(server, ups)["part"]


FEATSTATS = [lambda **kw: FedFA(variance="direct", **kw), lambda **kw: VFDA(**kw)]


# A robust spread moves by about one order statistic when one client's value is replaced: O(1/M)
# (and a MAD from M values has a sampling error of its own of about 0.8/sqrt(M) relative).
# "Under 5 %" therefore needs a large federation (M = 200: about 2-3 %; M = 20: 20-30 %);
# a small one (M = 10) stays within a factor 2, where the mean moves by 1e8.
@pytest.mark.parametrize("num, bound", [(200, 0.05), (10, 1.0)])
@pytest.mark.parametrize("make", FEATSTATS, ids=["fedfa_direct", "vfda"])
def test_one_poisoned_client_barely_moves_robust_variances(make, num, bound):
    clean = clean_stats(num)
    for rule in ROBUST:
        aug = make(stats_rule=rule, stats_beta=0.1)
        assert moved(aggregate_featstats(aug, *poisoned(*clean)), aggregate_featstats(aug, *clean)) < bound, rule
    mean = make()
    assert moved(aggregate_featstats(mean, *poisoned(*clean)), aggregate_featstats(mean, *clean)) > 1e6


def test_fedfa_fused_gamma_moves_less_under_a_robust_rule():
    clean = clean_stats(200, seed=1)
    changes = {rule: moved(aggregate_featstats(FedFA(stats_rule=rule), *poisoned(*clean)),
                           aggregate_featstats(FedFA(stats_rule=rule), *clean)) for rule in ("mean", "median")}
    assert changes["median"] < 0.05 < changes["mean"]  # gamma sums to C: the mean rule flattens it


@pytest.mark.parametrize("make", FEATSTATS, ids=["fedfa_direct", "vfda"])
def test_the_mean_rule_is_the_papers_variance_bit_for_bit(make):
    means, stds = clean_stats(20, seed=2)
    part = aggregate_featstats(make(), means, stds)
    assert torch.equal(part["l.var_mu"], client_sharing_variance(means))
    assert torch.equal(part["l.var_sigma"], client_sharing_variance(stds))


def test_featstats_options_refused_and_warned():
    with pytest.raises(ConfigError, match=r"fedfa\.stats_rule must be one of mean, median, trimmed_mean, got 'mad'"):
        FedFA(stats_rule="mad")
    with pytest.raises(ConfigError, match=r"vfda\.stats_beta must be >= 0 and < 0\.5, got 0\.5"):
        VFDA(stats_beta=0.5)
    with pytest.raises(ConfigError, match=r"official_compat .* stats_rule='median'"):
        FedFA(official_compat=True, stats_rule="median")
    with pytest.warns(UserWarning, match=r"fedfa\.stats_rule='median' does nothing"):
        FedFA(variance="client", stats_rule="median")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FedFA(stats_rule="median")
        VFDA(stats_rule="trimmed_mean", stats_beta=0.25)


@pytest.mark.parametrize("make", [FedFA, VFDA, FedRDN])
@pytest.mark.parametrize("rule", ["mean", "median"])
def test_stats_beta_without_trimming_is_warned(make, rule):
    name = make.__name__.lower()
    with pytest.warns(UserWarning, match=rf"{name}\.stats_beta=0\.25 does nothing with stats_rule='{rule}'; "
                                         r"set stats_rule='trimmed_mean'"):
        aug = make(stats_rule=rule, stats_beta=0.25)
    assert (aug.stats_rule, aug.stats_beta) == (rule, 0.25)


# --- FedRDN -------------------------------------------------------------------------------------
def rdn_downlink(rule: str, means: torch.Tensor, stds: torch.Tensor) -> dict[str, torch.Tensor]:
    rdn = FedRDN(stats_rule=rule)
    server = rdn.init_server(torch.nn.Identity(), len(means))  # the model only places the table (on the CPU)
    ups = [Uplink(k, 10, {"mean": means[k : k + 1], "std": stds[k : k + 1]}) for k in range(len(means))]
    return rdn.downlink(rdn.aggregate(server, ups), 0)


@pytest.mark.parametrize("num, bound", [(20, 0.1), (200, 0.05)])
def test_fedrdn_table_clamped_under_a_robust_rule(num, bound):
    clean = clean_stats(num, seed=3, centre=2.0)  # input means away from 0, so relative changes mean something
    bad = poisoned(*clean)
    for rule in ROBUST:
        before, after = rdn_downlink(rule, *clean), rdn_downlink(rule, *bad)
        honest = {k: before[k][1:] for k in ("mean", "std")}
        assert moved({k: after[k][1:] for k in honest}, honest) < 0.05, rule  # the other clients' pairs
        # FedRDN-V's average (Eq. 8) of the table sent: the clamped pair sits up to 3 spreads out, O(1/M)
        assert moved({k: after[k].mean(0) for k in honest}, {k: before[k].mean(0) for k in honest}) < bound, rule
        assert float(after["std"][0].max()) < 3 * float(clean[1].max())  # the poisoned pair is brought in
    before, after = rdn_downlink("mean", *clean), rdn_downlink("mean", *bad)
    assert torch.equal(after["std"][0], bad[1][0])  # the paper's table: as uploaded
    assert moved({k: after[k].mean(0) for k in ("mean", "std")}, {k: before[k].mean(0) for k in ("mean", "std")}) > 10


def test_fedrdn_options_refused():
    with pytest.raises(ConfigError, match=r"fedrdn\.stats_rule must be one of"):
        FedRDN(stats_rule="krum")
    with pytest.raises(ConfigError, match=r"fedrdn\.stats_beta must be >= 0 and < 0\.5"):
        FedRDN(stats_beta=0.7)
