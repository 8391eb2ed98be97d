"""FedData: a fraction of raw samples shared once, appended to training batches, not to evaluation."""

from __future__ import annotations

import pytest

from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.methods.aug.feddata import FedData
from fedaug.methods.component import Batch
from tests.methods.aug.inputs import make_ctx, tiny_cfg


def test_shares_a_fraction_once_and_extends_training_batches_only():
    sim = build_simulation(tiny_cfg(["feddata"], {"feddata": {"fraction": 0.25, "per_batch": 0.5}}, participation=1.0))
    r1, r2 = sim.run_round(1), sim.run_round(2)
    shared = 12  # 25 % of 48 training samples
    assert r1["comm"]["up"]["feddata"] == 3 * (shared * (64 * 4 + 8) + 8)  # x float32 + y int64, + 'have'
    assert r2["comm"]["up"]["feddata"] == 3 * 8
    assert sim.server["feddata"]["owner"].tolist() == [0] * shared + [1] * shared + [2] * shared
    feddata = sim.recipe.components[1]
    ctx = make_ctx(sim.data.clients[0].train.x, sim.data.clients[0].train.y, client_id=0)
    feddata.receive(ctx, feddata.downlink(sim.server["feddata"], 0), sim.client_states[0]["feddata"])
    assert feddata.shared_x.shape == (2 * shared, 1, 8, 8)  # the other two clients' samples
    batch = Batch(ctx.data.x[:16], ctx.data.y[:16])
    out = feddata.transform_batch(ctx, batch)
    assert out.x.shape[0] == 24 and out.y.shape == (24,)
    ctx.phase = "evaluate"
    assert feddata.transform_batch(ctx, batch) is batch


def test_options_are_validated():
    with pytest.raises(ConfigError, match=r"feddata\.fraction"):
        FedData(fraction=0.0)
    with pytest.raises(ConfigError, match=r"feddata\.per_batch"):
        FedData(per_batch=-1)
