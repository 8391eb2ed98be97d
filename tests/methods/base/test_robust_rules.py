"""Robust server rules (median, trimmed mean, Krum) against Flower's functions on the same
weights; FedAvg's update-norm clipping on both paths; DP-FedAvg's server noise; option refusals;
two in-process rounds of median + FedFA and of Krum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg
from torch import nn

from fedaug.config.schema import validate
from fedaug.core.errors import AggregationError, ConfigError
from fedaug.core.rng import generator
from fedaug.engine.run import build_simulation, run_experiment
from fedaug.methods.base.fedavg import FedAvg, clip_update
from fedaug.methods.base.robust import Krum, Median, TrimmedMean
from fedaug.methods.component import Uplink
from fedaug.methods.recipe import Recipe, build_recipe
from fedaug.privacy.clip import l2_norm
from fedaug.privacy.release import GaussianRelease
from tests.conftest import tiny_raw
from tests.methods.base.tiny import Linear2, run_client


class Net(nn.Module):
    """Shared entries: ``fc.weight (3, 4)``, ``fc.bias (3,)``, BatchNorm's affine, statistics and counter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)


def uplinks(num: int, seed: int = 0, samples: list[int] | None = None) -> list[Uplink]:
    g = torch.Generator().manual_seed(seed)
    ref = Net().state_dict()
    out = []
    for k in range(num):
        part = {key: (torch.randn(v.shape, generator=g) if v.is_floating_point() else torch.tensor(k + 2))
                for key, v in ref.items()}
        out.append(Uplink(k, (samples or [10] * num)[k], part))
    return out


def flower_lists(ups: list[Uplink], keys: list[str]) -> list[tuple[list[np.ndarray], int]]:
    return [([u.part[k].double().numpy() for k in keys], u.num_samples) for u in ups]


def floating_keys(rule) -> list[str]:
    return [k for k, v in rule.init_server(Net(), 1)["weights"].items() if v.is_floating_point()]


def aggregate(rule, ups, **kw):
    return rule.aggregate(rule.init_server(Net(), len(ups)), ups, **kw)["weights"]


# --- the rules against Flower -------------------------------------------------------------------
@pytest.mark.parametrize("rule, flower", [
    (Median(), lambda res: aggregate_median(res)),
    (TrimmedMean(beta=0.2), lambda res: aggregate_trimmed_avg(res, 0.2)),
    (Krum(f=1), lambda res: aggregate_krum(res, 1, 0)),
    (Krum(f=1, m=3), lambda res: aggregate_krum(res, 1, 3)),  # equal sample counts: Flower's weighted mean = mean
], ids=["median", "trimmed_mean", "krum", "multi_krum"])
def test_rule_equals_flower(rule, flower):
    ups = uplinks(7)
    keys = floating_keys(rule)
    new = aggregate(rule, ups)
    for k, expected in zip(keys, flower(flower_lists(ups, keys))):
        assert new[k].dtype == torch.float32
        np.testing.assert_allclose(new[k].double().numpy(), expected, rtol=1e-6, atol=1e-7)
    assert int(new["bn.num_batches_tracked"]) == 8  # integers: the maximum, as FedAvg


def test_multi_krum_with_sample_weighting_is_flowers_multi_krum():
    ups = uplinks(7, seed=1, samples=[5, 50, 10, 80, 20, 30, 40])
    keys = floating_keys(Krum())
    expected = aggregate_krum(flower_lists(ups, keys), 1, 3)
    paper, flower_like = aggregate(Krum(f=1, m=3), ups), aggregate(Krum(f=1, m=3, weighting="samples"), ups)
    for k, e in zip(keys, expected):
        np.testing.assert_allclose(flower_like[k].double().numpy(), e, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(paper["fc.weight"], flower_like["fc.weight"])  # the paper averages uniformly


def test_krum_ignores_a_far_client_and_median_resists_it():
    ups = uplinks(6)
    bad = {k: (v + 1e4 if v.is_floating_point() else v) for k, v in ups[3].part.items()}
    ups[3] = Uplink(3, 10, bad)
    honest = [u for i, u in enumerate(ups) if i != 3]
    lo = torch.stack([u.part["fc.weight"] for u in honest]).amin(0)
    hi = torch.stack([u.part["fc.weight"] for u in honest]).amax(0)
    for rule in (Median(), Krum(f=1, m=2), TrimmedMean(beta=0.2)):
        w = aggregate(rule, ups)["fc.weight"]
        assert bool(((w >= lo - 1e-6) & (w <= hi + 1e-6)).all()), rule.name
    assert aggregate(FedAvg(), ups)["fc.weight"].abs().min() > 1e3


def test_krum_with_too_few_updates_is_a_clear_error():
    with pytest.raises(AggregationError, match=r"krum\.f=1, krum\.m=1 need at least 5 accepted updates per round .* got 4"):
        aggregate(Krum(f=1), uplinks(4))
    with pytest.raises(AggregationError, match=r"krum\.m=5 need at least 5 .* got 4"):
        aggregate(Krum(f=0, m=5), uplinks(4))


def test_a_round_krum_cannot_aggregate_keeps_the_previous_global_model_and_the_run_goes_on(tmp_path):
    raw = tiny_raw(rounds=2)  # 3 clients: Krum with f = 1 needs 5
    raw["method"] = {"base": "krum", "augs": [], "options": {"krum": {"f": 1}}}
    sim = build_simulation(validate(raw))
    before = {k: v.clone() for k, v in sim.server["krum"]["weights"].items()}
    record = sim.run_round(1)
    assert record["aggregate"] == [{"phase": "train", "kept": "previous", "reason": (
        "krum: krum.f=1, krum.m=1 need at least 5 accepted updates per round (M > 2f + 2 and m <= M - f, "
        "Blanchard et al. 2017), got 3: lower krum.f or krum.m, or sample more clients and set "
        "train.min_clients to at least that")}]
    assert all(torch.equal(before[k], v) for k, v in sim.server["krum"]["weights"].items())


# --- clipping -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rule_cls", [FedAvg, Median, TrimmedMean, Krum])
def test_server_clipping_bounds_every_update(rule_cls):
    class Spy(rule_cls):
        def combine(self, parts, weights, keys):
            self.seen = parts
            return super().combine(parts, weights, keys)

    rule = Spy(clip_norm=0.5)
    ups = uplinks(3)
    server = rule.init_server(Net(), 3)
    new = rule.aggregate(server, ups)["weights"]
    for part, up in zip(rule.seen, ups):
        assert l2_norm({k: part[k] - server["weights"][k] for k in part}) <= 0.5 + 1e-6
        assert l2_norm({k: up.part[k] - server["weights"][k] for k in part}) > 1.0  # each was clipped
        assert torch.equal(part["bn.num_batches_tracked"], up.part["bn.num_batches_tracked"])
    if rule_cls in (FedAvg, Krum):  # averages of whole updates stay in the ball (median: per coordinate only)
        assert l2_norm({k: new[k] - server["weights"][k] for k in new}) <= 0.5 + 1e-6


def test_the_median_of_clipped_updates_can_leave_the_ball():
    # docs/robustness.md: three unit updates whose coordinate-wise median (1, 1, 1)/sqrt(2) has norm 1.22
    ups = [Uplink(k, 1, {"w": torch.tensor(v) / 2**0.5}) for k, v in enumerate([[1.0, 1, 0], [0.0, 1, 1], [1.0, 0, 1]])]
    new = Median(clip_norm=1.0).aggregate({"weights": {"w": torch.zeros(3)}}, ups)["weights"]
    assert l2_norm(new) == pytest.approx(3**0.5 / 2**0.5)


def test_clip_update_leaves_a_small_update_and_keeps_its_direction():
    ref = {"w": torch.zeros(2)}
    small, norm = clip_update({"w": torch.tensor([0.3, 0.4])}, ref, 1.0)
    assert norm == pytest.approx(0.5) and small["w"].tolist() == pytest.approx([0.3, 0.4])
    big, norm = clip_update({"w": torch.tensor([3.0, 4.0])}, ref, 1.0)
    assert norm == pytest.approx(5.0) and big["w"].tolist() == pytest.approx([0.6, 0.8])


@pytest.mark.parametrize("rule_cls", [FedAvg, TrimmedMean])
def test_client_clipping_bounds_what_the_client_sends(rule_cls):
    rule = rule_cls(clip_norm=1e-3, clip_at="client")
    model = Linear2()
    server = rule.init_server(model, 1)
    reply = run_client(Recipe(rule), model, {rule.name: rule.downlink(server, 0)}, steps=3)
    sent = reply.message[rule.name]
    trained = model.state_dict()
    assert l2_norm({k: sent[k] - server["weights"][k] for k in sent}) <= 1e-3 + 1e-6
    assert l2_norm({k: trained[k] - server["weights"][k] for k in sent}) > 1e-2  # it did clip
    unclipped = rule_cls()
    reply = run_client(Recipe(unclipped), Linear2(), {unclipped.name: unclipped.downlink(server, 0)}, steps=3)
    assert l2_norm({k: reply.message[unclipped.name][k] - server["weights"][k] for k in sent}) > 1e-2


# --- DP-FedAvg's noise --------------------------------------------------------------------------
class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(200_000))


def test_dp_noise_has_std_z_c_over_m_and_comes_from_the_server_stream():
    z, c, m = 1.5, 2.0, 4
    rule = FedAvg(weighting="uniform", clip_norm=c, noise_multiplier=z)
    server = rule.init_server(Wide(), m)
    ups = [Uplink(k, 10 * (k + 1), {"w": torch.zeros(200_000)}) for k in range(m)]  # no update: only noise

    def noise(seed: int, round_: int) -> torch.Tensor:
        return rule.aggregate(server, ups, rng=generator(seed, "server", round_, "fedavg", "train"))["weights"]["w"]

    n = noise(0, 1)
    # sample std of 2e5 normal draws: relative standard error 1/sqrt(2 * 2e5) = 0.16%; tolerance 1%
    assert n.double().std().item() == pytest.approx(z * c / m, rel=0.01)
    assert abs(n.double().mean().item()) < 5 * (z * c / m) / math.sqrt(n.numel())
    assert torch.equal(noise(0, 1), n)  # same seed and round: the same noise
    assert not torch.equal(noise(0, 2), n) and not torch.equal(noise(1, 1), n)
    assert rule.releases == (GaussianRelease("model update", z, c, "every_round", "client"),)
    with pytest.raises(ValueError, match="rng"):
        rule.aggregate(server, ups)


def test_dp_noise_leaves_batchnorm_variances_non_negative():
    """The noise on the averaged BatchNorm running variances is clamped at 0 (post-processing: no
    effect on the guarantee); a negative variance would make the global model's normalisation NaN
    and every client's next upload be refused (uplink_spec: running_var >= 0)."""
    rule = FedAvg(weighting="uniform", clip_norm=1.0, noise_multiplier=10.0)  # sigma = 5 on variances of 1
    server = rule.init_server(Net(), 2)
    ups = [Uplink(k, 10, dict(server["weights"])) for k in range(2)]
    for seed in range(5):
        new = rule.aggregate(server, ups, rng=generator(seed, "server", 1, "fedavg", "train"))["weights"]
        assert (new["bn.running_var"] >= 0).all()
        assert not torch.equal(new["bn.running_mean"], server["weights"]["bn.running_mean"])  # still noised
        assert torch.equal(new["bn.num_batches_tracked"], server["weights"]["bn.num_batches_tracked"])


def test_no_noise_no_release_and_fedavg_unchanged():
    assert FedAvg().releases == () and FedAvg(clip_norm=1.0).releases == ()
    ups = uplinks(3, samples=[10, 30, 60])
    plain, off = aggregate(FedAvg(), ups), aggregate(FedAvg(clip_norm=0.0, noise_multiplier=0.0), ups)
    assert all(torch.equal(plain[k], off[k]) for k in plain)


# --- refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("build, match", [
    (lambda: TrimmedMean(beta=0.5), r"trimmed_mean\.beta must be >= 0 and < 0\.5, got 0\.5"),
    (lambda: Krum(f=-1), r"krum\.f must be an integer >= 0, got -1"),
    (lambda: Krum(m=0), r"krum\.m must be an integer >= 1, got 0"),
    (lambda: Median(clip_norm=-1.0), r"median\.clip_norm must be .*>= 0, got -1"),
    (lambda: Median(clip_at="both"), r"median\.clip_at must be one of server, client, got 'both'"),
    (lambda: FedAvg(weighting="uniform", noise_multiplier=1.0),
     r"fedavg\.noise_multiplier=1\.0 needs fedavg\.clip_norm > 0"),
    (lambda: FedAvg(clip_norm=1.0, noise_multiplier=1.0), r"needs fedavg\.weighting='uniform'"),
    (lambda: FedAvg(noise_multiplier=-0.1), r"fedavg\.noise_multiplier must be .*>= 0, got -0\.1"),
])
def test_bad_options_are_refused_by_name(build, match):
    with pytest.raises(ConfigError, match=match):
        build()


def test_robust_rules_offer_no_dp_noise():
    with pytest.raises(ConfigError, match=r"median' has no option 'noise_multiplier'"):
        build_recipe("median", [], {"median": {"noise_multiplier": 1.0}})


# --- end to end ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [
    {"base": "median", "augs": ["fedfa"], "options": {"median": {"clip_norm": 5.0}}},
    {"base": "krum", "augs": [], "options": {"krum": {"f": 0, "m": 2}}},
    {"base": "fedavg", "augs": [], "options": {"fedavg": {"weighting": "uniform", "clip_norm": 1.0,
                                                          "clip_at": "client", "noise_multiplier": 0.1}}},
], ids=["median+fedfa", "multi_krum", "dp_fedavg"])
def test_two_rounds_in_process(method, tmp_path):
    raw = tiny_raw(rounds=2)
    raw["out_dir"] = str(tmp_path / "runs")
    raw["method"] = method
    summary, _ = run_experiment(validate(raw), quiet=True, write=False)
    assert summary["final"]["round"] == 2 and math.isfinite(summary["final"]["eval"]["mean"]["test_loss"])
