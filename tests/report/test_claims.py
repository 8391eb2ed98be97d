"""fedaug.report.claims: a claim's verdict from paired t-tests over seeds (summaries built by hand)."""

from __future__ import annotations

import pytest
from scipy.stats import t as student_t
from scipy.stats import ttest_rel

from fedaug.core.errors import ConfigError
from fedaug.report.claims import NOT_REPRODUCED, REPRODUCED, REVERSED, Claim, judge


def cell(scores: dict[int, float]) -> dict:
    seeds = list(scores)
    return {"n": len(seeds), "seeds": seeds, "final": {"values": [scores[s] for s in seeds]},
            "best": {"values": [scores[s] + 0.01 for s in seeds]}}


def summary(**settings: dict[str, dict[int, float]]) -> dict:
    return {"settings": {name: {"methods": {m: cell(v) for m, v in methods.items()}}
                         for name, methods in settings.items()}}


BASE = {0: 0.60, 1: 0.62, 2: 0.58}


def test_clear_gains_in_every_setting_are_reproduced_with_scipys_p_values():
    s = summary(a={"FedAvg": BASE, "FedFA": {0: 0.65, 1: 0.68, 2: 0.62}},
                b={"FedAvg": BASE, "FedFA": {0: 0.70, 1: 0.71, 2: 0.69}})
    v = judge(Claim("FedFA beats FedAvg", "FedFA", ("FedAvg",)), s)
    assert v.verdict == REPRODUCED
    for c, ours in zip(v.comparisons, ([0.65, 0.68, 0.62], [0.70, 0.71, 0.69])):
        assert c.test.p == pytest.approx(ttest_rel(ours, [0.60, 0.62, 0.58]).pvalue, rel=1e-9)
    assert v.evidence().startswith("claimed direction in 2 of 2, p < 0.05 in 2: +5.0 vs FedAvg, a")


def test_one_significant_loss_reverses_the_claim():
    s = summary(a={"FedAvg": BASE, "FedFA": {0: 0.65, 1: 0.68, 2: 0.62}},
                b={"FedAvg": BASE, "FedFA": {0: 0.50, 1: 0.51, 2: 0.49}})
    assert judge(Claim("", "FedFA", ("FedAvg",)), s).verdict == REVERSED


def test_a_noisy_gain_is_not_reproduced_and_the_evidence_says_so():
    s = summary(a={"FedAvg": BASE, "FedFA": {0: 0.70, 1: 0.55, 2: 0.61}})
    v = judge(Claim("", "FedFA", ("FedAvg",)), s)
    assert v.verdict == NOT_REPRODUCED
    # d = (0.10, -0.07, 0.03): mean 0.02, sd 0.0854; the 95 % interval 0.02 -/+ 4.303 * 0.0854 / sqrt(3) in points
    half = student_t.ppf(0.975, 2) * 0.0854400374531753 / 3 ** 0.5
    assert f"{100 * (0.02 - half):+.1f}, {100 * (0.02 + half):+.1f}" == "-19.2, +23.2"
    assert v.evidence().startswith("claimed direction in 1 of 1, p < 0.05 in 0: "
                                   "+2.0 vs FedAvg (95 % CI [-19.2, +23.2], p ")


def test_direction_minus_one_claims_a_lower_score():
    s = summary(a={"FedAvg": BASE, "FedFA-R": {0: 0.50, 1: 0.53, 2: 0.47}})
    assert judge(Claim("", "FedFA-R", ("FedAvg",), direction=-1), s).verdict == REPRODUCED
    assert judge(Claim("", "FedFA-R", ("FedAvg",)), s).verdict == REVERSED


def test_seeds_are_paired_by_seed_not_by_position():
    # the same scores listed in another seed order: the pairs, hence the verdict and p, are unchanged
    ours = {0: 0.65, 1: 0.68, 2: 0.62}
    shuffled = {2: 0.62, 0: 0.65, 1: 0.68}
    a = judge(Claim("", "X", ("FedAvg",)), summary(s={"FedAvg": BASE, "X": ours}))
    b = judge(Claim("", "X", ("FedAvg",)), summary(s={"FedAvg": BASE, "X": shuffled}))
    assert a.comparisons[0].test == b.comparisons[0].test and a.verdict == REPRODUCED


def test_only_common_seeds_are_compared_and_settings_can_be_chosen():
    s = summary(a={"FedAvg": BASE, "X": {0: 0.7, 1: 0.72}}, b={"FedAvg": BASE, "X": {0: 0.1, 1: 0.1, 2: 0.1}})
    v = judge(Claim("", "X", ("FedAvg",), settings=("a",)), s)
    assert [c.setting for c in v.comparisons] == ["a"] and v.comparisons[0].test.n == 2 and v.seeds == (0, 1)


def test_every_comparison_of_a_claim_rests_on_the_seeds_all_its_cells_finished():
    # X has 5 seeds, FedAvg 4, FedProx 3 (seeds 0, 2 and 4) and setting b's FedAvg misses seed 0: the claim's
    # seeds are those every compared cell has, 2 and 4, in both comparisons of both settings
    five = {0: 0.70, 1: 0.72, 2: 0.74, 3: 0.69, 4: 0.75}
    s = summary(a={"FedAvg": {0: 0.6, 1: 0.61, 2: 0.62, 4: 0.63}, "FedProx": {0: 0.6, 2: 0.65, 4: 0.6}, "X": five},
                b={"FedAvg": {1: 0.5, 2: 0.52, 3: 0.5, 4: 0.51}, "FedProx": {0: 0.5, 2: 0.5, 4: 0.53}, "X": five})
    v = judge(Claim("", "X", ("FedAvg", "FedProx")), s)
    assert v.seeds == (2, 4) and [c.test.n for c in v.comparisons] == [2, 2, 2, 2]
    assert v.comparisons[0].test.diff == pytest.approx((0.74 - 0.62 + 0.75 - 0.63) / 2)
    assert v.comparisons[3].test.diff == pytest.approx((0.74 - 0.50 + 0.75 - 0.53) / 2)
    # a cell that finished nothing leaves the claim no common seed: no comparison has a p-value
    empty = summary(a={"FedAvg": BASE, "X": {}})
    v = judge(Claim("", "X", ("FedAvg",)), empty)
    assert v.seeds == () and v.comparisons[0].test.n == 0 and v.verdict == NOT_REPRODUCED


def test_best_scores_are_used_when_asked():
    s = summary(a={"FedAvg": BASE, "X": {0: 0.65, 1: 0.68, 2: 0.62}})
    assert judge(Claim("", "X", ("FedAvg",), which="best"), s).comparisons[0].test.diff == pytest.approx(0.05)


@pytest.mark.parametrize("claim, match", [
    (Claim("", "Nope", ("FedAvg",)), "setting 'a' has no method 'Nope'; it has FedAvg, X"),
    (Claim("", "X", ("FedAvg",), settings=("z",)), r"unknown setting\(s\) \['z'\]; the grid has a"),
    (Claim("", "X", ("FedAvg",), direction=0), "direction must be \\+1 or -1, got 0"),
    (Claim("", "X", ("FedAvg",), which="mean"), "'which' must be 'final' or 'best', got 'mean'"),
])
def test_bad_claims_are_one_clear_error(claim, match):
    with pytest.raises(ConfigError, match=match):
        judge(claim, summary(a={"FedAvg": BASE, "X": BASE}))
