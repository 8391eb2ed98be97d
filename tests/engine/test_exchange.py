"""Every phase is one exchange: evaluation traffic is counted, its messages validated both ways."""

from __future__ import annotations

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.errors import PayloadError
from fedaug.core.payload import TensorSpec
from fedaug.data.registry import load_dataset
from fedaug.engine.protocol import METERS, Reply
from fedaug.engine.run import Simulation, build_simulation
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.component import Component
from fedaug.methods.recipe import Recipe
from tests.conftest import tiny_raw


def test_evaluation_traffic_is_in_the_round_record(tiny_cfg):
    sim = build_simulation(tiny_cfg)
    sim.run_round(1)
    ev = sim.evaluate()
    weights = sum(t.numel() * t.element_size() for t in sim.server["fedavg"]["weights"].values())
    # 3 clients each receive the global weights; each answers 2 splits x (loss_sum float64, correct, count int64)
    assert ev["comm"] == {"down": {"fedavg": 3 * weights}, "up": {METERS: 3 * 2 * 3 * 8},
                          "down_total": 3 * weights, "up_total": 3 * 48}


class BadEvalDownlink(Component):
    """Sends an evaluation part that breaks its own spec (a malformed server message)."""

    name = "bad"
    phases = ("train", "evaluate")

    def downlink(self, server, client_id, phase="train"):
        return {"t": torch.zeros(3)} if phase == "evaluate" else {}

    def downlink_spec(self, model, phase="train"):
        return {"t": TensorSpec((2,), torch.float32)} if phase == "evaluate" else {}


def simulation(*augs):
    cfg = validate(tiny_raw(rounds=1))
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    return Simulation(cfg, data, Recipe(FedAvg(), list(augs)))


def test_a_malformed_evaluation_message_fails_loudly_on_the_client():
    sim = simulation(BadEvalDownlink())
    sim.run_round(1)
    with pytest.raises(PayloadError, match=r"evaluation downlink to client 0, part 'bad': 't' has shape \(3,\)"):
        sim.evaluate()


class CorruptingFleet:
    """Passes every phase through, but client 1's evaluation reply comes back with a negative count
    and client 2's without its meters."""

    def __init__(self, fleet):
        self.fleet = fleet

    def run(self, phase, r, lr, client_ids, message):
        for cid, reply in self.fleet.run(phase, r, lr, client_ids, message):
            if phase == "evaluate" and cid == 1:
                part = dict(reply.message[METERS])
                part["test.count"] = torch.tensor(-5)
                reply = Reply({METERS: part})
            elif phase == "evaluate" and cid == 2:
                reply = Reply({})
            yield cid, reply

    def __getattr__(self, name):
        return getattr(self.fleet, name)


def test_malformed_evaluation_replies_are_rejected_with_reasons_and_the_others_are_summarised():
    sim = simulation()
    sim.run_round(1)
    sim.fleet = CorruptingFleet(sim.fleet)
    ev = sim.evaluate()
    assert [(x["client"], x["phase"]) for x in ev["rejected"]] == [(1, "evaluate"), (2, "evaluate")]
    assert "negative test.count" in ev["rejected"][0]["reason"]
    assert "missing" in ev["rejected"][1]["reason"]
    assert list(ev["clients"]) == [sim.federation.names[0]]
