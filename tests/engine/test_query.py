"""The engine's post-aggregation query (the "query" phase): order, model, accounting, rejection."""

from __future__ import annotations

import torch

from fedaug.config.schema import validate
from fedaug.core.payload import TensorSpec
from fedaug.data.registry import load_dataset
from fedaug.engine.run import Simulation, build_simulation
from fedaug.methods.component import Component
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import Recipe
from tests.conftest import tiny_raw


class Asker(Component):
    """Records hooks; after aggregation uploads the sum of the model's weights it holds."""

    name = "asker"
    phases = ("train", "query")

    def __init__(self, bad_client: int | None = None) -> None:
        self.calls: list[str] = []
        self.seen: dict[int, float] = {}
        self.bad_client = bad_client

    def receive(self, ctx, part, state): self.calls.append(f"receive:{ctx.phase}")

    def reply(self, ctx):
        if ctx.training:
            self.calls.append("reply:train")
            return {}, {}
        self.calls.append(f"reply:query:{ctx.client_id}:{ctx.model.training}:{torch.is_grad_enabled()}")
        total = sum(float(p.sum()) for p in ctx.model.parameters())
        value = float("nan") if ctx.client_id == self.bad_client else total
        return {"w": torch.tensor([value])}, {}

    def uplink_spec(self, server, phase="train"):
        return {"w": TensorSpec((1,), torch.float32)} if phase == "query" else {}

    def aggregate(self, server, uplinks, phase="train"):
        self.calls.append(f"aggregate:{phase}")
        return {"w": {u.client_id: float(u.part["w"]) for u in uplinks}} if phase == "query" else server


def simulation(asker, participation=1.0):
    cfg = validate(tiny_raw(participation=participation, rounds=1))
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    return Simulation(cfg, data, Recipe(FedAvg(), [asker]))


def test_query_runs_after_aggregation_on_each_client_with_the_new_global_model():
    asker = Asker()
    sim = simulation(asker)
    sim.run_round(1)
    assert asker.calls == (["receive:train", "reply:train"] * 3 + ["aggregate:train"]
                           + [x for c in (0, 1, 2) for x in ("receive:query", f"reply:query:{c}:False:False")]
                           + ["aggregate:query"])
    new_global = sum(float(v.sum()) for k, v in sim.server["fedavg"]["weights"].items()
                     if k in dict(sim.model.named_parameters()))
    for value in sim.server["asker"]["w"].values():
        assert abs(value - new_global) < 1e-3


def test_query_bytes_are_accounted_both_ways():
    sim = simulation(Asker())
    rec = sim.run_round(1)
    weights = sum(t.numel() * t.element_size() for t in sim.server["fedavg"]["weights"].values())
    assert rec["after_aggregate"] == {"down": {"fedavg": 3 * weights}, "up": {"asker": 3 * 4}}
    assert rec["comm"]["down"]["fedavg"] == 2 * 3 * weights  # round start + post-aggregation model
    assert rec["comm"]["up"]["asker"] == 3 * 4


def test_bad_query_part_is_rejected_with_its_reason_and_the_others_go_on():
    sim = simulation(Asker(bad_client=1))
    rec = sim.run_round(1)
    assert [(r["client"], r["phase"]) for r in rec["rejected"]] == [(1, "after_aggregate")]
    assert "non-finite" in rec["rejected"][0]["reason"]
    assert sorted(sim.server["asker"]["w"]) == [0, 2]


def test_no_querier_no_phase(tiny_cfg):
    rec = build_simulation(tiny_cfg).run_round(1)
    assert "after_aggregate" not in rec


class Drawer(Asker):
    """Takes the server's random stream in ``aggregate`` and keeps its first draw per phase."""

    name = "drawer"

    def aggregate(self, server, uplinks, phase="train", rng=None):
        self.calls.append(f"aggregate:{phase}")
        return {**server, phase: float(torch.rand((), generator=rng))}


def test_aggregate_gets_the_server_stream_of_seed_round_component_and_phase_only_when_it_takes_one():
    from fedaug.core.rng import generator

    drawer, asker = Drawer(), Asker()
    sim = simulation(drawer)
    sim.run_round(1)
    for phase in ("train", "query"):
        want = float(torch.rand((), generator=generator(sim.cfg.seed, "server", 1, "drawer", phase)))
        assert sim.server["drawer"][phase] == want
    assert sim.server["drawer"]["train"] != sim.server["drawer"]["query"]
    simulation(asker).run_round(1)  # an aggregate without rng is called as before
    assert asker.calls.count("aggregate:query") == 1
