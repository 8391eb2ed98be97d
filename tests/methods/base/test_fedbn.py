"""FedBN: BatchNorm weights and statistics stay in each client's state, across rounds and at evaluation."""

from __future__ import annotations

import torch

from fedaug.config.schema import validate
from fedaug.engine.run import build_simulation
from fedaug.methods.base.fedbn import norm_layer_keys
from fedaug.methods.component import ClientCtx
from tests.conftest import tiny_raw

BN_KEYS = {f"block{i}.1.{k}" for i in range(1, 5)
           for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}


def simulation(rounds=2):
    raw = tiny_raw(rounds=rounds, local_steps=2)
    raw["method"] = {"base": "fedbn"}
    return build_simulation(validate(raw))


def test_bn_layers_never_travel_and_each_client_keeps_its_own():
    sim = simulation()
    assert set(norm_layer_keys(sim.model)) == BN_KEYS
    assert not BN_KEYS & set(sim.server["fedbn"]["weights"])
    rec1 = sim.run_round(1)
    states1 = {c: {k: v.clone() for k, v in sim.client_states[c]["fedbn"]["bn"].items()} for c in rec1["sampled"]}
    assert set(states1[0]) == BN_KEYS
    assert not torch.equal(states1[0]["block1.1.weight"], states1[1]["block1.1.weight"])  # trained locally
    # round 2 starts from each client's own BN layers: check it on client 0 directly
    fedbn = sim.recipe.base
    ctx = ClientCtx(sim.model, 0, 2, 7, sim.data.clients[0].train)
    fedbn.receive(ctx, fedbn.downlink(sim.server["fedbn"], 0), sim.client_states[0]["fedbn"])
    for k, v in states1[0].items():
        assert torch.equal(sim.model.state_dict()[k], v), k
    # evaluation of client 1 uses client 1's BN layers
    fedbn.receive(ClientCtx(sim.model, 1, 1, 7, sim.data.clients[1].train, phase="evaluate"),
                  fedbn.downlink(sim.server["fedbn"], 1, "evaluate"), sim.client_states[1]["fedbn"])
    assert torch.equal(sim.model.state_dict()["block2.1.bias"], states1[1]["block2.1.bias"])


def test_per_client_state_size_is_recorded():
    sim = simulation()
    rec = sim.run_round(1)
    # width 8: per BN layer weight, bias, running mean and var (8 float32 each) + one int64 counter
    per_client = 4 * (4 * 8 * 4 + 8)
    assert rec["client_state"]["bytes"] == {str(c): per_client for c in rec["sampled"]}
    assert rec["client_state"]["total_bytes"] == per_client * len(rec["sampled"])
    params = sum(p.numel() * 4 for p in sim.model.parameters())
    bn_params = 4 * 2 * 8 * 4
    assert rec["comm"]["up"]["fedbn"] == len(rec["sampled"]) * (params - bn_params)


def test_first_round_starts_from_the_initial_bn_layers():
    sim = simulation()
    initial = {k: v.clone() for k, v in sim.model.state_dict().items() if k in BN_KEYS}
    with torch.no_grad():
        sim.model.block1[1].weight.fill_(5.0)  # what a previous client might have left
    fedbn = sim.recipe.base
    ctx = ClientCtx(sim.model, 2, 1, 7, sim.data.clients[2].train)
    fedbn.receive(ctx, fedbn.downlink(sim.server["fedbn"], 2), {})
    for k, v in initial.items():
        assert torch.equal(sim.model.state_dict()[k], v), k
