"""FedRDN: statistics, per-image draws, test-time statistics, FedRDN-V, equivalence with fixed
normalisation, protocol (upload once, table per client), accounting and pooled evaluation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.layers.functional import normalize_channels
from fedaug.methods.aug.fedrdn import FedRDN, client_stats, draw_pairs
from fedaug.methods.aug.norm import Normalize
from fedaug.methods.component import Batch, Uplink
from tests.methods.aug.inputs import make_ctx, tiny_cfg


def table(means, stds, ids=None):
    means = torch.tensor(means, dtype=torch.float32)
    ids = torch.arange(means.shape[0]) if ids is None else torch.tensor(ids)
    return {"ids": ids, "mean": means, "std": torch.tensor(stds, dtype=torch.float32)}


def test_client_statistics_match_an_independent_computation():
    x = torch.rand(10, 3, 6, 5, generator=torch.Generator().manual_seed(0))
    a = x.numpy().astype(np.float64)
    mean, std = client_stats(make_ctx(x))
    np.testing.assert_allclose(mean.numpy(), a.mean(axis=(2, 3)).mean(axis=0), rtol=1e-6)  # Eq. 5, then 4
    np.testing.assert_allclose(std.numpy(), a.std(axis=(2, 3)).mean(axis=0), rtol=1e-6)


def test_constant_channel_is_a_config_error():
    x = torch.zeros(4, 2, 3, 3)
    x[:, 1] = torch.rand(4, 3, 3)
    with pytest.raises(ConfigError, match=r"constant input channel\(s\) \[0\]"):
        client_stats(make_ctx(x))


def test_per_image_draws_are_uniform_over_clients_and_matched():
    # client k's pair: mean k, std k + 1; an input of ones maps to (1 - mean) / std, which
    # identifies the mean row and the std row used for each image.
    k = 5
    server = table([[float(i)] for i in range(k)], [[float(i + 1)] for i in range(k)], ids=[1, 2, 3, 4, 5])
    x = torch.ones(4, 1, 2, 2)
    ctx = make_ctx(x, client_id=3)
    fedrdn = FedRDN()
    fedrdn.receive(ctx, fedrdn.downlink(server, 3), {"n": 4})
    pairs = {round((1 - m) / (m + 1), 5): m for m in range(k)}
    counts = np.zeros(k)
    for _ in range(400):
        out = fedrdn.transform_batch(ctx, Batch(torch.ones(10, 1, 2, 2), torch.zeros(10, dtype=torch.int64)))
        for v in out.x[:, 0, 0, 0].tolist():
            counts[pairs[round(v, 5)]] += 1  # KeyError if a mean met another client's std
        assert bool((out.x == out.x[:, :, :1, :1]).all())  # one pair per image, not per pixel
    assert counts.sum() == 4000
    assert chisquare(counts).pvalue > 0.01


def test_batch_draw_is_one_unmatched_draw_per_batch():
    i, j = draw_pairs(4, 6, "batch", torch.Generator().manual_seed(0))
    assert len(set(i.tolist())) == 1 and len(set(j.tolist())) == 1
    hits = [len(set(draw_pairs(4, 1, "batch", torch.Generator().manual_seed(s))[0].tolist()
                    + draw_pairs(4, 1, "batch", torch.Generator().manual_seed(s))[1].tolist())) for s in range(50)]
    assert 2 in hits  # the mean row and the std row differ in some batches


def test_test_time_uses_the_clients_own_statistics_and_variant_v_the_average():
    server = table([[0.1, 0.2], [0.5, 0.6], [0.9, 1.0]], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    x = torch.rand(6, 2, 3, 3)
    ctx = make_ctx(x, client_id=1, phase="evaluate")
    fedrdn = FedRDN()
    fedrdn.receive(ctx, fedrdn.downlink(server, 1, "evaluate"), {"n": 6})
    out = fedrdn.transform_batch(ctx, Batch(x, ctx.data.y)).x
    assert torch.allclose(out, (x - torch.tensor([0.5, 0.6]).view(1, 2, 1, 1)) / torch.tensor([3.0, 4.0]).view(1, 2, 1, 1))
    v = FedRDN(variant="average")
    for phase in ("train", "evaluate"):
        ctx.phase = phase
        v.receive(ctx, v.downlink(server, 1, phase), {"n": 6})
        out = v.transform_batch(ctx, Batch(x, ctx.data.y)).x
        mean, std = torch.tensor([0.5, 0.6]).view(1, 2, 1, 1), torch.tensor([3.0, 4.0]).view(1, 2, 1, 1)
        assert torch.allclose(out, (x - mean) / std, atol=1e-6)  # Eq. 8: the unweighted average


def test_identical_statistics_everywhere_equal_conventional_normalisation():
    mean, std = [0.3, 0.4, 0.5], [0.2, 0.25, 0.3]
    server = table([mean] * 4, [std] * 4)
    x = torch.rand(8, 3, 4, 4)
    norm = Normalize(mean=mean, std=std)
    for phase in ("train", "evaluate"):
        ctx = make_ctx(x, client_id=2, phase=phase)
        fedrdn = FedRDN()
        fedrdn.receive(ctx, fedrdn.downlink(server, 2, phase), {"n": 8})
        batch = Batch(x, ctx.data.y)
        assert torch.allclose(fedrdn.transform_batch(ctx, batch).x, norm.transform_batch(ctx, batch).x)


def test_a_client_uploads_its_statistics_once_and_the_server_keeps_a_table():
    x = torch.rand(5, 2, 3, 3) + 1
    fedrdn = FedRDN()
    empty = fedrdn.init_server(torch.nn.Identity(), 8)
    ctx = make_ctx(x, client_id=7)
    fedrdn.receive(ctx, fedrdn.downlink(empty, 7), {})  # round 1: only its own pair
    assert fedrdn._clients[7].train[0].shape == (1, 2)
    own = normalize_channels(x, *client_stats(ctx))  # Eq. 7, available from receive on (CCVR uses it)
    assert torch.equal(fedrdn.transform_batch(dataclasses.replace(ctx, phase="evaluate"), Batch(x, x[:, 0, 0, 0])).x, own)
    up, state = fedrdn.reply(ctx)
    assert up["mean"].shape == (1, 2) and state == {"n": 5}
    server = fedrdn.aggregate(empty, [Uplink(7, 5, up)])
    assert server["ids"].tolist() == [7] and torch.equal(server["mean"][0], client_stats(ctx)[0])
    fedrdn.receive(ctx, fedrdn.downlink(server, 7), state)  # known: nothing to upload
    assert fedrdn.reply(ctx)[0]["mean"].shape == (0, 2)
    fedrdn.receive(ctx, fedrdn.downlink(server, 7), {"n": 4})  # data changed: recompute and replace
    up, _ = fedrdn.reply(ctx)
    assert up["mean"].shape == (1, 2)
    assert fedrdn.aggregate(server, [Uplink(7, 5, up)])["ids"].tolist() == [7]


def test_engine_accounting_statistics_are_a_few_bytes():
    cfg = tiny_cfg(["fedrdn"], participation=1.0)
    sim = build_simulation(cfg)
    r1, r2 = sim.run_round(1), sim.run_round(2)
    c, k = 1, 3  # channels, clients
    assert r1["comm"]["up"]["fedrdn"] == k * 2 * c * 4  # each client uploads (mean, std) once
    assert r1["comm"]["down"]["fedrdn"] == 0  # the server's table is empty in round 1
    assert r2["comm"]["up"]["fedrdn"] == 0
    assert r2["comm"]["down"]["fedrdn"] == k * (k * 8 + 2 * k * c * 4)  # ids + table, to each client
    for cid, client in enumerate(sim.data.clients):
        mean, std = client_stats(make_ctx(client.train.x))
        assert torch.equal(sim.server["fedrdn"]["mean"][cid], mean)


def test_pooled_evaluation_uses_each_samples_own_client_statistics(monkeypatch):
    sim = build_simulation(tiny_cfg(["fedrdn"], participation=1.0))
    sim.run_round(1)
    used = []
    original = FedRDN.transform_batch

    def spy(self, ctx, batch):
        used.append((ctx.client_id, ctx.training, self._clients[ctx.client_id].eval[0].clone()))
        return original(self, ctx, batch)

    monkeypatch.setattr(FedRDN, "transform_batch", spy)
    ev = sim.evaluate()
    assert ev["pooled"]["n"] == sum(len(c.test) for c in sim.data.clients)
    assert {cid for cid, _, _ in used} == {0, 1, 2}
    for cid, training, mean in used:
        assert not training and torch.equal(mean, sim.server["fedrdn"]["mean"][cid])


@pytest.mark.parametrize("augs", [["fedrdn", "fedfa"], ["fedrdn", "mixstyle"]])
def test_composes_with_feature_augmentations(augs):
    sim = build_simulation(tiny_cfg(augs, rounds=1))
    rec = sim.run_round(1)
    assert np.isfinite(rec["train"]["loss"])


def test_bad_options_name_the_key():
    with pytest.raises(ConfigError, match=r"fedrdn\.variant"):
        FedRDN(variant="v")
    with pytest.raises(ConfigError, match=r"fedrdn\.draw"):
        FedRDN(draw="pixel")
