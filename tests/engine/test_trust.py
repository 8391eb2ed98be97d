"""The trust boundary on the in-process engine (issue 21): a hostile or buggy client's reply is
rejected with its reason, the round completes, the global state stays finite and is what gets
checkpointed, and the run resumes without the attacker."""

from __future__ import annotations

import math
import re

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.engine.protocol import Malformed, Reply
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.server.loop import state_problems
from fedaug.engine.run import build_simulation, resume_experiment
from fedaug.methods.recorded import pin
from tests.engine.attacks import ATTACKS, Attack, attack_raw, finite, scaled


class Hostile:
    """The in-process fleet, except that client 1's reply in ``phase`` of round 1 is rewritten."""

    def __init__(self, fleet, phase, rewrite):
        self.fleet, self.phase, self.rewrite = fleet, phase, rewrite

    def run(self, phase, r, lr, client_ids, message):
        for cid, reply in self.fleet.run(phase, r, lr, client_ids, message):
            if phase == self.phase and r == 1 and cid == 1:
                reply = self.rewrite(reply)
            yield cid, reply

    def __getattr__(self, name):
        return getattr(self.fleet, name)


def corrupting(attack: Attack):
    def rewrite(reply):
        message = dict(reply.message)
        message[attack.part] = attack.corrupt(dict(message[attack.part]))
        return Reply(message, reply.metrics, reply.state)
    return rewrite


def attacked_run(tmp_path, raw, phase, rewrite):
    raw = {**raw, "out_dir": str(tmp_path / "runs")}
    cfg = pin(validate(raw))  # as run_experiment does: the run directory records every recorded option
    sim = build_simulation(cfg)
    sim.fleet = Hostile(sim.fleet, phase, rewrite)
    with RunDir.start(cfg) as run_dir:  # released at the end, as run_experiment does
        summary = sim.run(run_dir)
    return sim, run_dir, summary


def resumes_without_the_attacker(run_dir: RunDir) -> dict:
    """Drop the newest checkpoint (the one written after round 1 stays) and finish the run again."""
    run_dir.checkpoints()[-1][1].unlink()
    summary, _ = resume_experiment(str(run_dir.path), quiet=True)
    return summary


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_is_rejected_the_round_completes_and_the_run_resumes(tmp_path, name):
    attack = ATTACKS[name]
    sim, run_dir, summary = attacked_run(tmp_path, attack_raw(attack), attack.phase, corrupting(attack))
    r1, r2 = run_dir.rounds()
    (culprit,) = r1["rejected"]
    assert culprit["client"] == 1 and culprit["phase"] == {"query": "after_aggregate"}.get(attack.phase, attack.phase)
    assert culprit["reason"].startswith("round 1:") and f"part '{attack.part}'" in culprit["reason"]
    assert re.search(attack.reason, culprit["reason"]), culprit["reason"]
    assert r2["rejected"] == [] and summary["rounds"] == 2
    assert finite(sim.server) and finite(run_dir.load_latest()["server"])
    assert math.isfinite(summary["final"]["eval"]["mean"]["test_acc"])
    assert resumes_without_the_attacker(run_dir)["rounds"] == 2


def _fedfa_means_of_1e6(screen: str):
    """Client 1's FedFA running means times 1e6: each within trust.max_abs, FedFA's direct variance of
    means of 0 and 1e6 is ~3e11."""
    attack = ATTACKS["fedfa std of 1e30 (variance=direct)"]
    raw = attack_raw(attack)
    raw["trust"] = {"screen": screen}
    sim = build_simulation(validate(raw))
    sim.fleet = Hostile(sim.fleet, "train", corrupting(
        Attack(attack.method, "train", "fedfa", scaled("running_mean", 1e6), "")))
    return sim


def test_shared_statistics_far_over_the_rounds_are_rejected_by_the_update_screening():
    rec = _fedfa_means_of_1e6("reject").run_round(1)
    (culprit,) = rec["rejected"]
    assert culprit["client"] == 1 and "part 'fedfa', shared: update norm" in culprit["reason"]
    assert "aggregate" not in rec


def test_an_aggregate_over_the_bound_is_not_committed_and_the_round_says_so(tmp_path):
    sim = _fedfa_means_of_1e6("off")  # the screening would reject the upload first (the test above)
    before = {k: v.clone() for k, v in sim.server["fedfa"]["part"].items()}
    rec = sim.run_round(1)
    (kept,) = rec["aggregate"]
    assert kept["phase"] == "train" and kept["kept"] == "previous"
    assert "fedfa.part." in kept["reason"] and "over the bound 1e+06" in kept["reason"]
    assert rec["rejected"] == []
    assert all(torch.equal(sim.server["fedfa"]["part"][k], v) for k, v in before.items())
    assert "aggregate" not in sim.run_round(2) and finite(sim.server)


def test_a_reply_the_fleet_cannot_read_is_rejected_with_its_reason(tmp_path):
    sim, run_dir, _ = attacked_run(tmp_path, attack_raw(ATTACKS["fedavg weights of 1e30"]), "train",
                                   lambda reply: Malformed("the reply lacks its 'metrics' record"))
    (culprit,) = run_dir.rounds()[0]["rejected"]
    assert culprit == {"client": 1, "phase": "train",
                       "reason": "round 1: uplink of client 1: the reply lacks its 'metrics' record"}


@pytest.mark.parametrize("metrics, reason", [
    ({"steps": 2}, r"metrics lack 'loss'"),
    ({"loss": float("nan"), "steps": 2}, r"metric 'loss' must be a finite number, got nan"),
    ({"loss": "low", "steps": 2}, r"metric 'loss' must be a finite number, got low"),
    ({"loss": 1.0, "steps": -3}, r"metric 'steps' must be a non-negative integer, got -3"),
    ({"loss": 1.0, "steps": 2, **{f"m{i}": 0.0 for i in range(70)}}, r"metrics hold 72 names, more than 64"),
])
def test_bad_training_metrics_are_rejected(tmp_path, metrics, reason):
    sim, run_dir, _ = attacked_run(tmp_path, attack_raw(ATTACKS["fedavg weights of 1e30"]), "train",
                                   lambda reply: Reply(reply.message, metrics, reply.state))
    (culprit,) = run_dir.rounds()[0]["rejected"]
    assert re.search(reason, culprit["reason"]), culprit["reason"]


def test_an_unexpected_part_is_rejected(tmp_path):
    sim, run_dir, _ = attacked_run(tmp_path, attack_raw(ATTACKS["fedavg weights of 1e30"]), "train",
                                   lambda reply: Reply({**reply.message, "extra": {}}, reply.metrics, reply.state))
    (culprit,) = run_dir.rounds()[0]["rejected"]
    assert "unexpected part(s) 'extra'" in culprit["reason"]


def test_a_per_part_bound_replaces_max_abs(tmp_path):
    raw = attack_raw(ATTACKS["fedavg weights of 1e30"])
    raw["trust"] = {"max_abs": 1e6, "max_abs_parts": {"fedavg": 1e-3}}  # no honest weight fits
    raw["train"]["on_empty_round"] = "stop"
    with pytest.raises(Exception, match=r"only 0 of 3 uploads passed validation.*over the bound 0.001"):
        build_simulation(validate(raw)).run_round(1)


def test_state_problems_names_where_and_why():
    state = {"w": torch.tensor([1.0, -5.0]), "nest": [{"v": torch.tensor([float("nan")])}], "n": 3}
    assert state_problems(state, 2.0, "x") == ["x.w holds |value| up to 5, over the bound 2", "x.nest[0].v holds non-finite values"]
    assert state_problems(state, None, "x") == ["x.nest[0].v holds non-finite values"]


def test_a_value_that_is_not_a_tensor_is_rejected_not_counted_as_bytes(tmp_path):
    def rewrite(reply):
        part = dict(reply.message["fedavg"])
        part[sorted(part)[0]] = "1e30"
        return Reply({**reply.message, "fedavg": part}, reply.metrics, reply.state)

    sim, run_dir, _ = attacked_run(tmp_path, attack_raw(ATTACKS["fedavg weights of 1e30"]), "train", rewrite)
    r1 = run_dir.rounds()[0]
    (culprit,) = r1["rejected"]
    assert "must be a tensor, got str" in culprit["reason"]
    assert r1["comm"]["up"]["fedavg"] == r1["comm"]["down"]["fedavg"] - sim.server["fedavg"]["weights"][
        sorted(sim.server["fedavg"]["weights"])[0]].numel() * 4
