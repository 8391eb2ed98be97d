"""FLea (KDD 2024): mixup (Eq. 2), distillation (Eq. 4), the buffer protocol (Alg. 1 lines 14-18)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from scipy import stats

import fedaug.methods.aug.flea as flea_module
from fedaug.analysis.probe import global_model
from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.methods.aug.flea import FLea
from fedaug.methods.aug.flea_buffer import (distillation_loss, draw_pairs, merge_buffer,
                                            mix_features, share_indices)
from fedaug.methods.component import Batch, ClientCtx, Uplink
from fedaug.models.split import extract_features, forward_front
from fedaug.privacy.dcor import distance_correlation
from tests.conftest import tiny_raw


def flea_cfg(participation=0.5, num_clients=4, **flea):
    raw = tiny_raw(participation=participation)
    raw["data"]["options"]["num_clients"] = num_clients
    raw["method"] = {"base": "fedavg", "augs": ["flea"], "options": {"flea": {"stage": "block2", **flea}}}
    return validate(raw)


def test_beta_weights_follow_beta_a_a_and_mixed_labels_sum_to_one():
    g = torch.Generator().manual_seed(0)
    j, beta = draw_pairs(4000, 50, 2.0, g)
    assert j.min() >= 0 and j.max() < 50
    assert stats.kstest(beta.numpy(), stats.beta(2.0, 2.0).cdf).pvalue > 0.01
    assert stats.kstest(beta.numpy(), stats.beta(0.5, 0.5).cdf).pvalue < 1e-6  # the test has power
    y = torch.nn.functional.one_hot(torch.randint(10, (4000,), generator=g), 10).float()
    y_buf = torch.nn.functional.one_hot(torch.randint(10, (4000,), generator=g), 10).float()
    f, f_buf = torch.randn(4000, 3, 2, 2, generator=g), torch.randn(4000, 3, 2, 2, generator=g)
    f_mix, y_mix = mix_features(f, y, f_buf, y_buf, beta)
    assert torch.allclose(y_mix.sum(1), torch.ones(4000))
    b = beta.reshape(-1, 1, 1, 1)
    assert torch.allclose(f_mix, b * f + (1 - b) * f_buf)  # Eq. 2: beta weighs the local feature


def test_distillation_matches_a_hand_computed_kl():
    local = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    glob = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    # row 1: p_l = (e^2, 1)/(e^2 + 1), p_g = (1/2, 1/2); row 2: p_l = (1/2, 1/2), p_g = (1/4, 3/4)
    pl = math.exp(2) / (math.exp(2) + 1)
    row1 = pl * math.log(pl / 0.5) + (1 - pl) * math.log((1 - pl) / 0.5)
    row2 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(distillation_loss(local, glob)) == pytest.approx((row1 + row2) / 2, rel=1e-6)
    assert float(distillation_loss(glob, glob)) == pytest.approx(0.0, abs=1e-7)


def test_buffer_is_replaced_each_round_with_features_of_the_new_global_model():
    cfg = flea_cfg()
    sim = build_simulation(cfg)
    flea = sim.recipe.components[1]
    for r in (1, 2, 3):
        rec = sim.run_round(r)
        buf = sim.server["flea"]
        assert sorted(set(buf["owner"].tolist())) == sorted(rec["sampled"])  # only this round's clients
        model = global_model(sim)  # theta(t+1), after this round's aggregation
        rows = []
        with torch.no_grad():
            for cid in sorted(rec["sampled"]):
                data = sim.data.clients[cid].train
                idx = share_indices(len(data), flea.share_fraction, cfg.seed, cid)
                rows.append(extract_features(model, data.x[idx], "block2").flatten(1))
                assert torch.equal(buf["labels"][buf["owner"] == cid], data.y[idx])
        assert torch.allclose(buf["features"], torch.cat(rows), atol=1e-5)
        assert rec["after_aggregate"]["up"]["flea"] == buf["features"].numel() * 4 + buf["labels"].numel() * 8


def test_round_one_has_no_buffer_and_later_rounds_receive_it():
    sim = build_simulation(flea_cfg())
    first = sim.run_round(1)
    assert first["comm"]["down"]["flea"] == 0  # Alg. 1 line 3: no buffer in round 1
    buf = sim.server["flea"]
    per_client = buf["features"].numel() * 4 + buf["labels"].numel() * 8  # float32 rows, int64 labels
    second = sim.run_round(2)
    assert per_client > 0 and second["comm"]["down"]["flea"] == per_client * len(second["sampled"])


def test_result_does_not_depend_on_client_order():
    cfg = flea_cfg(participation=1.0, num_clients=3)
    a, b = build_simulation(cfg), build_simulation(cfg, lambda ids: list(reversed(ids)))
    for r in (1, 2):
        ra, rb = a.run_round(r), b.run_round(r)
        ra.pop("time"), rb.pop("time")
        assert ra == rb
    assert torch.equal(a.server["flea"]["features"], b.server["flea"]["features"])


def test_max_buffer_keeps_an_even_share_per_contributor():
    ups = [Uplink(c, 10, {"features": torch.full((n, 2), float(c)), "labels": torch.full((n,), c)})
           for c, n in ((0, 5), (3, 1), (7, 4))]
    buf = merge_buffer(ups, 6)  # quota 2 each -> (2, 1, 2), the spare row to client 0
    assert buf["owner"].tolist() == [0, 0, 0, 3, 7, 7]
    assert buf["features"].shape == (6, 2)
    assert merge_buffer(ups, 100)["owner"].tolist() == [0] * 5 + [3] + [7] * 4


def test_noise_perturbs_the_shared_features():
    clean, noisy = build_simulation(flea_cfg()), build_simulation(flea_cfg(share_noise=0.5))
    clean.run_round(1), noisy.run_round(1)
    diff = noisy.server["flea"]["features"] - clean.server["flea"]["features"]
    assert float(diff.std()) == pytest.approx(0.5, rel=0.2)


def test_dcor_weight_schedule_of_the_public_code():
    flea = FLea(dcor_weight=3.0, dcor_final_weight=1.0, dcor_decay_rounds=20)
    assert [flea.dcor_weight_at(r) for r in (1, 11, 21, 40)] == [3.0, 2.0, 1.0, 1.0]
    assert FLea().dcor_weight_at(50) == 3.0


def test_dcor_weight_schedule_golden_values_per_round():
    # the public code's lambda2 in its 0-based round t: 3 - 0.1 t while t < 20, then 1 (fedaug round r = t + 1)
    golden = [3.0, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4, 2.3, 2.2, 2.1, 2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1,
              1.0, 1.0, 1.0]
    flea = FLea(dcor_weight=3.0, dcor_final_weight=1.0, dcor_decay_rounds=20)
    assert [flea.dcor_weight_at(r) for r in range(1, 24)] == pytest.approx(golden, abs=1e-12)
    assert [FLea(dcor_weight=0.3).dcor_weight_at(r) for r in (1, 20, 100)] == [0.3, 0.3, 0.3]  # paper: constant


@pytest.mark.parametrize("squared", [True, False])
def test_dcor_term_is_between_the_raw_local_batch_and_its_unmixed_features(squared, monkeypatch):
    # Eq. 5 / Eq. 8: L_dec(B) on the local batch B only, f = theta_k[:l](x) before the mixing of Eq. 2,
    # weighted by lambda2 of the round (Eq. 6)
    sim = build_simulation(flea_cfg(participation=1.0, num_clients=3, dcor_final_weight=1.0, dcor_squared=squared))
    sim.run_round(1)  # fills the buffer, so that round 2 mixes
    flea, cid = sim.recipe.components[1], 0
    data = sim.data.clients[cid].train
    ctx = ClientCtx(sim.model, cid, 2, sim.cfg.seed, data, task=sim.task, device=sim.device).view("flea")
    flea.receive(ctx, flea.downlink(sim.server["flea"], cid), {})
    sim.model.train()
    x, y = data.x[:16], data.y[:16]
    run = lambda fn, *args, module=None, state=None: fn(sim.model if module is None else module, *args)  # noqa: E731
    inputs = flea.group_inputs(ctx, 16)
    seen = []
    back = flea_module.forward_back
    monkeypatch.setattr(flea_module, "forward_back", lambda model, f, stage: seen.append(f) or back(model, f, stage))
    out, target, terms = flea.group_replace_forward(run, flea.group_capture(ctx), inputs, Batch(x, y))
    f = forward_front(sim.model, x, "block2")
    f_mix = seen[0]  # what the back of the model ran on
    assert not torch.allclose(f_mix, f)  # the batch was mixed with buffer features
    want = 2.9 * distance_correlation(x, f, squared=squared)  # lambda2(2) = 3 - 0.1
    assert float(terms["dcor"].detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    mixed = 2.9 * distance_correlation(x, f_mix, squared=squared)
    assert float(terms["dcor"].detach()) != pytest.approx(float(mixed.detach()), rel=1e-3)


@pytest.mark.parametrize("options, match", [
    ({"share_fraction": 1.5}, r"flea\.share_fraction must be >= 0 and <= 1, got 1.5"),
    ({"beta": 0}, r"flea\.beta must be > 0"),
    ({"distill_on": "both"}, r"flea\.distill_on must be one of mixed, buffer, got 'both'"),
    ({"max_buffer": 0}, r"flea\.max_buffer must be an integer >= 1"),
    ({"share_noise": -1}, r"flea\.share_noise must be a finite number >= 0"),
])
def test_bad_options_are_config_errors(options, match):
    with pytest.raises(ConfigError, match=match):
        FLea(**options)


def test_unknown_stage_lists_the_model_stages():
    with pytest.raises(ConfigError, match=r"flea\.stage 'block9'.*choose from block1, block2"):
        build_simulation(flea_cfg(stage="block9"))


@pytest.mark.parametrize("options", [{"distill_on": "buffer", "unmixed_ce": True, "dcor_squared": False}])
def test_public_code_options_train(options):
    sim = build_simulation(flea_cfg(**options))
    sim.run_round(1)
    rec = sim.run_round(2)
    metrics = rec["train"]["clients"][str(rec["sampled"][0])]
    assert {"flea/distill", "flea/dcor", "flea/ce_unmixed"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())


needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="spoken_digits synthesises its audio with espeak-ng (apt-get install espeak-ng)")


@pytest.mark.parametrize("data, model, stage", [
    ({"name": "synthetic", "options": {"num_clients": 3, "samples_per_client": 32, "size": 16}}, "small_cnn", "block2"),
    ({"name": "smartwatch_imu", "options": {}}, "cnn1d", "block1"),  # sensor windows (6, 100)
    pytest.param({"name": "spoken_digits", "options": {"voices": ["en-us", "en-gb-scotland"], "samples_per_class": 3,
                                                        "n_mels": 16}}, "small_cnn", "block2", marks=needs_espeak),
], ids=["images", "sensor-windows", "spectrograms"])
def test_flea_trains_on_images_sensor_windows_and_spectrograms(data, model, stage):
    raw = tiny_raw(rounds=2, local_steps=1, participation=1.0)
    raw.update(data=data, model={"name": model})
    raw["method"] = {"base": "fedavg", "augs": ["flea"], "options": {"flea": {"stage": stage}}}
    sim = build_simulation(validate(raw))
    sim.run_round(1)
    second = sim.run_round(2)
    buf = sim.server["flea"]
    rows = sum(int(0.1 * len(c.train)) for c in sim.data.clients)
    assert buf["features"].shape[0] == rows > 0 and buf["labels"].shape == (rows,)
    assert second["comm"]["down"]["flea"] > 0 and torch.isfinite(buf["features"]).all()
