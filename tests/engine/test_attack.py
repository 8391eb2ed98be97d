"""Attack scenarios (issue 20): each kind's effect on the upload, measured against the same client's
honest upload; who attacks and from when; the round records; the refused configs."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from fedaug.config.schema import AttackConfig, validate
from fedaug.core.errors import ConfigError
from fedaug.data.base import ClientData, Split
from fedaug.engine.client.attack import DEFAULT_STD, choose_attackers, flip_labels
from fedaug.engine.run import Simulation, build_simulation, run_experiment
from fedaug.methods.recipe import build_recipe
from tests.conftest import tiny_raw
from tests.engine.toyseg import toy_segmentation

#: a few examples each, the same ones every run (each example trains a client)
FEW = settings(max_examples=4, deadline=None, derandomize=True)


def sim_of(attack: dict | None = None, method: dict | None = None, seed: int = 7, **train):
    raw = {**tiny_raw(**train), "seed": seed}
    if attack is not None:
        raw["attack"] = attack
    if method is not None:
        raw["method"] = method
    return build_simulation(validate(raw))


def upload(sim, cid: int, phase: str = "train", r: int = 1, client: ClientData | None = None):
    """Client ``cid``'s reply to the phase's message built from the simulation's current server
    state (returned too), as the server would send it."""
    message = {c.name: c.downlink(sim.server[c.name], cid, phase) for c in sim.recipe.participants(phase)}
    reply = sim.fleet.worker.run(phase, cid, r, 0.05, client or sim.data.clients[cid], message, {})
    return message, reply


def floats(part):
    return {k: v for k, v in part.items() if v.is_floating_point()}


#: the tiny model's buffers (BatchNorm running statistics and counters): update attacks send them as trained
BUFFERS = frozenset(n for n, _ in sim_of().model.named_buffers())


def params(part):
    """The floating entries an update attack poisons: the model's parameters."""
    return {k: v for k, v in floats(part).items() if k not in BUFFERS}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --- each kind's effect on the upload -----------------------------------------------------------
@FEW
@given(seed=st.integers(0, 2**16))
def test_sign_flip_uploads_exactly_twice_the_global_minus_the_honest_weights(seed):
    down, honest = upload(sim_of(seed=seed), 1)
    _, attacked = upload(sim_of({"kind": "sign_flip", "clients": [1]}, seed=seed), 1)
    w_g, w_k, sent = down["fedavg"], honest.message["fedavg"], attacked.message["fedavg"]
    assert sent.keys() == w_k.keys()
    assert any("running_var" in k for k in BUFFERS)
    for k, t in w_k.items():
        if k in params(w_k):
            assert torch.equal(sent[k], 2 * w_g[k] - t), k
            assert not torch.equal(sent[k], t) or torch.equal(t, w_g[k]), k
        else:  # running statistics as trained (valid), num_batches_tracked (integer): never touched
            assert torch.equal(sent[k], t), k
    assert attacked.metrics == honest.metrics and attacked.state.keys() == honest.state.keys()


@FEW
@given(s=st.floats(-20.0, 20.0, allow_nan=False), seed=st.integers(0, 2**16))
def test_scale_uploads_the_global_weights_plus_s_times_the_update(s, seed):
    down, honest = upload(sim_of(seed=seed), 0)
    _, attacked = upload(sim_of({"kind": "scale", "clients": [0], "scale": s}, seed=seed), 0)
    w_g, w_k, sent = down["fedavg"], honest.message["fedavg"], attacked.message["fedavg"]
    for k, t in floats(w_k).items():
        want = w_g[k] + s * (t - w_g[k]) if k not in BUFFERS else t
        torch.testing.assert_close(sent[k], want, rtol=0, atol=0)


def test_scale_defaults_to_ten():
    down, honest = upload(sim_of(), 2)
    _, attacked = upload(sim_of({"kind": "scale", "clients": [2]}), 2)
    k = sorted(params(down["fedavg"]))[0]
    torch.testing.assert_close(attacked.message["fedavg"][k] - down["fedavg"][k],
                               10 * (honest.message["fedavg"][k] - down["fedavg"][k]))


@FEW
@given(std=st.sampled_from([1e-3, 0.1, 2.0]), seed=st.integers(0, 2**16))
def test_gaussian_uploads_an_update_of_pure_noise_with_the_std_asked(std, seed):
    sim = sim_of({"kind": "gaussian", "clients": [1], "std": std}, seed=seed)
    down, attacked = upload(sim, 1)
    noise = torch.cat([(attacked.message["fedavg"][k] - w).flatten().double()
                       for k, w in params(down["fedavg"]).items()])
    n = noise.numel()
    # the sample std of n >= 1000 normals is within 4 standard errors (std / sqrt(2n)) of std
    assert n >= 1000 and abs(float(noise.std()) - std) < 4 * std / math.sqrt(2 * n) + 1e-6 * std
    assert abs(float(noise.mean())) < 4 * std / math.sqrt(n)
    _, again = upload(sim, 1)
    assert_same(again.message["fedavg"], attacked.message["fedavg"])  # the client's own seeded stream
    first = sorted(params(down["fedavg"]))[0]
    _, next_round = upload(sim, 1, r=2)  # same global weights, the next round's draw
    assert not torch.equal(next_round.message["fedavg"][first], attacked.message["fedavg"][first])


def test_free_ride_sends_back_the_floating_entries_it_received_buffers_included():
    down, honest = upload(sim_of(), 1)
    _, attacked = upload(sim_of({"kind": "free_ride", "clients": [1]}), 1)
    w_g, w_k, sent = down["fedavg"], honest.message["fedavg"], attacked.message["fedavg"]
    assert sent.keys() == w_k.keys()
    for k, t in sent.items():
        if t.is_floating_point():
            assert torch.equal(t, w_g[k]) and t is not w_g[k], k  # a copy of what it received
        else:  # integer counters as trained (never changed by an attack)
            assert torch.equal(t, w_k[k]), k
    moved = [k for k in BUFFERS if w_k[k].is_floating_point() and not torch.equal(w_k[k], w_g[k])]
    assert moved  # training moved the running statistics; the free-rider sends them back unmoved
    assert attacked.metrics == honest.metrics


def test_gaussian_std_defaults_to_one():
    assert DEFAULT_STD == 1.0
    down, attacked = upload(sim_of({"kind": "gaussian", "clients": [0]}), 0)
    noise = torch.cat([(attacked.message["fedavg"][k] - w).flatten() for k, w in params(down["fedavg"]).items()])
    assert abs(float(noise.std()) - 1.0) < 0.1


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_nan_and_inf_uploads_are_rejected_with_the_client_and_the_part(kind):
    sim = sim_of({"kind": kind, "clients": [1]}, min_clients=2)
    record = sim.run_round(1)
    (rejected,) = record["rejected"]
    assert rejected["client"] == 1 and rejected["phase"] == "train"
    assert re.search(r"uplink of client 1, part 'fedavg': .*non-finite value", rejected["reason"]), rejected
    assert record["attack"] == {"kind": kind, "clients": [1]}
    assert sorted(record["train"]["clients"]) == ["0", "2"]
    assert all(bool(torch.isfinite(w).all()) for w in floats(sim.server["fedavg"]["weights"]).values())


def test_label_flip_trains_on_mirrored_labels_and_changes_nothing_else():
    sim = sim_of({"kind": "label_flip", "clients": [1]})
    client = sim.data.clients[1]
    _, attacked = upload(sim, 1)
    flipped = ClientData(client.name, client.group, Split(client.train.x, 3 - client.train.y), client.val, client.test)
    _, on_flipped_data = upload(sim_of(), 1, client=flipped)  # an honest client whose data says K-1-y
    _, honest = upload(sim_of(), 1)
    assert_same(attacked.message["fedavg"], on_flipped_data.message["fedavg"])
    assert attacked.metrics == on_flipped_data.metrics != honest.metrics
    assert torch.equal(client.train.y, sim_of().data.clients[1].train.y)  # the client's data is not changed
    ev_attacked = sim.fleet.worker.run("evaluate", 1, 1, 0.0, client, upload(sim, 1, "evaluate")[0], {})
    ev_honest = sim_of().fleet.worker.run("evaluate", 1, 1, 0.0, client, upload(sim, 1, "evaluate")[0], {})
    assert ev_attacked.message.keys() == ev_honest.message.keys()
    assert_same(ev_attacked.message["meters"], ev_honest.message["meters"])  # evaluated on the true labels


def test_flip_labels_mirrors_the_classes():
    y = torch.tensor([0, 1, 2, 3, 3])
    assert flip_labels(y, 4).tolist() == [3, 2, 1, 0, 0]


def test_stats_scales_spreads_and_shifts_means_of_the_augmentation_only():
    fedfa = {"augs": ["fedfa"]}
    _, honest = upload(sim_of(method=fedfa), 1)
    _, attacked = upload(sim_of({"kind": "stats", "clients": [1], "scale": 3.0}, method=fedfa), 1)
    h, a = honest.message["fedfa"], attacked.message["fedfa"]
    assert {k.rsplit(".", 1)[1] for k in h} == {"running_mean", "running_std"}
    for k in h:
        expected = h[k] * 3.0 if k.endswith("running_std") else h[k] + 3.0
        assert torch.equal(a[k], expected), k
    assert_same(attacked.message["fedavg"], honest.message["fedavg"])  # the default parts: not the server rule's


def test_stats_on_a_named_part_touches_that_part_only():
    fedfa = {"augs": ["fedfa"]}
    _, honest = upload(sim_of(method=fedfa), 0)
    _, attacked = upload(sim_of({"kind": "stats", "clients": [0], "parts": ["fedavg"]}, method=fedfa), 0)
    h, a = honest.message["fedavg"], attacked.message["fedavg"]
    seen = set()
    for k, t in h.items():
        last = k.rsplit(".", 1)[1]
        if last == "running_var":
            assert torch.equal(a[k], t * 1e4), k
        elif last == "running_mean":
            assert torch.equal(a[k], t + 1e4), k
        else:  # weights, biases and the integer num_batches_tracked
            assert torch.equal(a[k], t), k
        seen.add(last)
    assert {"running_var", "running_mean", "weight"} <= seen
    assert_same(attacked.message["fedfa"], honest.message["fedfa"])


@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_features_keeps_shape_and_labels_and_sends_noise_of_the_scaled_std(scale):
    flea = {"augs": ["flea"]}
    _, honest = upload(sim_of(method=flea), 2, "query")
    _, attacked = upload(sim_of({"kind": "features", "clients": [2], "scale": scale}, method=flea), 2, "query")
    h, a = honest.message["flea"], attacked.message["flea"]
    assert a["features"].shape == h["features"].shape and a["features"].dtype == h["features"].dtype
    assert torch.equal(a["labels"], h["labels"])
    assert not torch.equal(a["features"], h["features"])
    want = scale * float(h["features"].std(correction=0))
    n = h["features"].numel()
    assert n >= 500 and abs(float(a["features"].std()) - want) < 4 * want / math.sqrt(2 * n)
    assert abs(float(a["features"].mean())) < 4 * want / math.sqrt(n)


@pytest.mark.parametrize("attack", [
    {"kind": "sign_flip"}, {"kind": "scale"}, {"kind": "gaussian"}, {"kind": "free_ride"}, {"kind": "nan"}, {"kind": "inf"},
    {"kind": "label_flip"}, {"kind": "stats", "parts": ["fedavg"]}, {"kind": "features", "parts": ["fedavg"]},
])
def test_the_uploads_of_clients_that_do_not_attack_are_bit_identical(attack):
    attacked_sim = sim_of({**attack, "clients": [1]})
    honest_sim = sim_of()
    for cid in (0, 2):
        _, a = upload(attacked_sim, cid)
        _, h = upload(honest_sim, cid)
        assert_same(a.message["fedavg"], h.message["fedavg"])
        assert a.metrics == h.metrics


# --- who attacks, and when ----------------------------------------------------------------------
@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 40), fraction=st.floats(0.0, 1.0))
def test_attackers_by_fraction_are_a_seeded_share_of_the_federation(seed, n, fraction):
    cfg = AttackConfig(kind="sign_flip", fraction=fraction)
    chosen = choose_attackers(cfg, seed, n)
    assert len(chosen) == math.floor(fraction * n + 0.5) and len(set(chosen)) == len(chosen)
    assert list(chosen) == sorted(chosen) and all(0 <= c < n for c in chosen)
    assert choose_attackers(cfg, seed, n) == chosen


def test_attackers_by_fraction_differ_between_seeds():
    picks = {choose_attackers(AttackConfig(kind="nan", fraction=0.25), seed, 8) for seed in range(10)}
    assert len(picks) > 1


def test_attackers_by_fraction_are_the_same_whatever_order_the_clients_run():
    raw = tiny_raw(rounds=2)
    raw["attack"] = {"kind": "sign_flip", "fraction": 0.34}
    raw["eval"] = {"every": 2}
    runs = []
    for order in (None, lambda ids: ids[::-1], lambda ids: ids[1:] + ids[:1]):
        sim = build_simulation(validate(raw), execution_order=order)
        runs.append([{k: v for k, v in sim.run_round(r).items() if k != "time"} for r in (1, 2)])
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0][0]["attack"]["clients"]) == 1


def test_attacks_start_at_start_round():
    sim = sim_of({"kind": "nan", "clients": [2], "start_round": 2}, min_clients=2)
    r1, r2, r3 = (sim.run_round(r) for r in (1, 2, 3))
    assert r1["rejected"] == [] and "attack" not in r1
    for record in (r2, r3):
        assert [x["client"] for x in record["rejected"]] == [2]
        assert record["attack"] == {"kind": "nan", "clients": [2]}


def test_a_round_that_samples_no_attacker_records_no_attack():
    sim = sim_of({"kind": "sign_flip", "clients": [0]}, participation=0.67)
    records = [sim.run_round(r) for r in (1, 2, 3)]
    assert {0 in r["sampled"] for r in records} == {True, False}  # both cases occur with seed 7
    for record in records:
        assert ("attack" in record) == (0 in record["sampled"])


def test_a_three_round_run_with_one_of_three_clients_sign_flipping(tmp_path):
    raw = tiny_raw()
    raw.update(out_dir=str(tmp_path / "runs"), attack={"kind": "sign_flip", "clients": [1]})
    summary, run_dir = run_experiment(validate(raw), quiet=True)
    records = run_dir.rounds()
    assert [r["round"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["attack"] == {"kind": "sign_flip", "clients": [1]}
        assert r["rejected"] == [] and sorted(r["train"]["clients"]) == ["0", "1", "2"]
    assert math.isfinite(summary["final"]["eval"]["mean"]["test_acc"])
    honest_raw = tiny_raw()
    honest_raw.update(out_dir=str(tmp_path / "honest"))
    honest, honest_dir = run_experiment(validate(honest_raw), quiet=True)
    assert all("attack" not in r for r in honest_dir.rounds())
    assert honest["final"]["eval"]["mean"] != summary["final"]["eval"]["mean"]


# --- refused configs ----------------------------------------------------------------------------
def refused(attack: dict, **raw_extra) -> str:
    raw = {**tiny_raw(), **raw_extra, "attack": attack}
    with pytest.raises(ConfigError) as info:
        build_simulation(validate(raw))
    return str(info.value)


@pytest.mark.parametrize("attack, message", [
    ({"kind": "sign_flp", "clients": [1]}, r"'attack\.kind' must be one of none, sign_flip.*did you mean 'sign_flip'"),
    ({"kind": "nan", "fraction": 1.5}, r"'attack\.fraction' must be >= 0\.0 and <= 1\.0, got 1\.5"),
    ({"kind": "nan", "clients": [1], "fraction": 0.5}, r"set either 'attack\.clients' or 'attack\.fraction', not both"),
    ({"kind": "nan"}, r"attack\.kind='nan' names no attacker; set 'attack\.clients'"),
    ({"kind": "nan", "clients": [-1]}, r"'attack\.clients' holds -1; client ids are >= 0"),
    ({"kind": "nan", "clients": [1, 1]}, r"'attack\.clients' lists client\(s\) 1 more than once"),
    ({"kind": "nan", "clients": [1], "start_round": 0}, r"'attack\.start_round' must be >= 1, got 0"),
    ({"kind": "gaussian", "clients": [1], "std": 0.0}, r"'attack\.std' must be > 0\.0, got 0\.0"),
    ({"kind": "scale", "clients": [1], "scale": math.nan}, r"'attack\.scale' must be a finite number"),
])
def test_bad_attack_options_are_refused_by_the_schema(attack, message):
    text = refused(attack)
    assert re.search(message, text), text
    assert text.count("\n") == 1, text  # one problem, one line


def test_client_ids_beyond_the_federation_are_refused_at_run_start_naming_ids_and_count():
    text = refused({"kind": "nan", "clients": [1, 3, 7]})
    assert re.search(r"attack\.clients names client\(s\) 3, 7, but the federation has 3 clients \(ids 0\.\.2\)", text)


def test_parts_naming_a_component_not_in_the_method_are_refused_with_a_suggestion():
    text = refused({"kind": "stats", "clients": [1], "parts": ["fedfaa"]}, method={"augs": ["fedfa"]})
    assert re.search(r"attack\.parts names 'fedfaa', which is not a component of the method; choose from "
                     r"fedavg, fedfa.*did you mean 'fedfa'", text), text


def test_label_flip_on_segmentation_is_refused():
    data = toy_segmentation(2, num_classes=2)
    cfg = validate({"model": {"name": "unet2d", "options": {"base_width": 4, "depth": 2}},
                    "attack": {"kind": "label_flip", "clients": [0]}})
    with pytest.raises(ConfigError, match=r"attack\.kind='label_flip' flips class labels, but this is a "
                                          r"segmentation task; choose another kind"):
        Simulation(cfg, data, build_recipe("fedavg"))


@pytest.mark.parametrize("attack, key", [
    ({"kind": "nan", "clients": [1], "std": 2.0}, "std"),
    ({"kind": "sign_flip", "clients": [1], "scale": 2.0}, "scale"),
    ({"kind": "label_flip", "clients": [1], "parts": ["fedavg"]}, "parts"),
    ({"kind": "none", "clients": [1]}, "clients"),
])
def test_options_that_do_nothing_are_warned_about(attack, key):
    with pytest.warns(UserWarning, match=rf"'attack\.{key}' does nothing with attack\.kind='{attack['kind']}'"):
        validate({"attack": attack})


def test_the_default_config_has_no_attack_and_its_records_no_attack_key():
    cfg = validate(tiny_raw())
    assert cfg.attack.kind == "none" and cfg.to_dict()["attack"] == {"kind": "none", "clients": [], "start_round": 1,
                                                                      "parts": []}
    assert "attack" not in build_simulation(cfg).run_round(1)


def test_a_round_whose_every_evaluation_is_rejected_neither_crashes_the_run_nor_becomes_best():
    """What a sign flip of BatchNorm's running variances can do to the global model (negative
    variances: NaN outputs, every evaluation reply rejected): the mean score is ``None``."""
    sim = sim_of()
    empty = {"mean": {"val_acc": None, "test_acc": None, "test_loss": None}}
    sim._track_best(1, empty)
    assert sim.best["round"] == 1 and sim.best["score"] is None
    sim._track_best(2, {"mean": {"val_acc": 0.5, "test_acc": 0.4, "test_loss": 1.0}})
    sim._track_best(3, empty)
    assert sim.best["round"] == 2 and sim.last_eval["round"] == 3
    assert sim._progress_metric({"train": {"loss": 1.0}, "eval": empty}).endswith("n/a (no evaluation accepted)")
