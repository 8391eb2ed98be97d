"""The evaluation protocol (issue 40): the spread across clients, ``eval.clients`` and
``eval.finetune_steps``, with golden values computed independently on a tiny federation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.core.rng import generator
from fedaug.data.registry import load_dataset
from fedaug.engine.run import build_simulation
from fedaug.models.registry import build_model
from tests.conftest import tiny_raw


def config(rounds: int = 2, participation: float = 1.0, **eval_opts):
    raw = tiny_raw(rounds=rounds, participation=participation)
    raw["eval"] = {"every": 1, **eval_opts}
    return validate(raw)


def evaluations(cfg):
    """The run's evaluation records, without times (they never repeat)."""
    sim = build_simulation(cfg)
    sim.run()
    return sim, sim.last_eval["eval"]


def test_spread_is_over_the_clients_test_metric():
    _, ev = evaluations(config())
    accs = [c["test"]["acc"] for c in ev["clients"].values()]
    assert len(accs) == 3
    spread = ev["spread"]["test_acc"]
    assert spread["std"] == pytest.approx(np.std(accs), abs=1e-12)
    assert spread["min"] == min(accs) == spread["worst10"]  # 3 clients: the worst 10 % is one client
    vals = [c["val"]["acc"] for c in ev["clients"].values()]
    assert ev["spread"]["val_acc"]["min"] == min(vals)


def test_sampled_evaluation_covers_the_round_sample_with_the_figures_of_a_full_one():
    sampled_sim = build_simulation(config(participation=0.67, clients="sampled"))
    sampled_sim.run()
    full_sim = build_simulation(config(participation=0.67))
    full_sim.run()
    ev, full = sampled_sim.last_eval["eval"], full_sim.last_eval["eval"]
    names = sampled_sim.federation.names
    from fedaug.engine.server.schedule import sample_clients
    sampled = sample_clients(7, 2, 3, 0.67)
    assert len(sampled) == 2
    assert list(ev["clients"]) == [names[c] for c in sampled]
    for name in ev["clients"]:  # evaluation does not change training: the same model, the same figures
        assert ev["clients"][name] == full["clients"][name]
    accs = [full["clients"][names[c]]["test"]["acc"] for c in sampled]
    assert ev["mean"]["test_acc"] == pytest.approx(np.mean(accs), abs=1e-12)
    assert ev["pooled"]["n"] == sum(full["clients"][names[c]]["test"]["n"] for c in sampled)
    assert ev["spread"]["test_acc"]["min"] == min(accs)
    assert ev["comm"]["up_total"] < full["comm"]["up_total"]


def bare_finetune(weights, client, cfg, r: int, cid: int, steps: int):
    """Fine-tune a fresh copy of the model in a plain PyTorch loop (SGD with the run's momentum and
    weight decay, the engine's shuffle stream) and return its test accuracy and mean loss."""
    model = build_model("small_cnn", client.train.x.shape[1], 4, width=8)
    model.load_state_dict(weights)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum,
                          weight_decay=cfg.train.weight_decay)
    g = generator(cfg.seed, "client", r, cid, "engine", "shuffle")
    n, bs = len(client.train), cfg.train.batch_size
    batches: list[torch.Tensor] = []
    while len(batches) < steps:  # each epoch a fresh permutation, cut into full batches
        perm = torch.randperm(n, generator=g)
        batches += [perm[i * bs:(i + 1) * bs] for i in range(n // bs)]
    for idx in batches[:steps]:
        opt.zero_grad()
        F.cross_entropy(model(client.train.x[idx]), client.train.y[idx]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(client.test.x)
    acc = (logits.argmax(1) == client.test.y).double().mean().item()
    return acc, F.cross_entropy(logits, client.test.y).item()


def test_finetuned_evaluation_equals_a_bare_pytorch_finetune_of_the_global_model():
    cfg = config(finetune_steps=3)
    sim, ev = evaluations(cfg)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    weights = sim.server["fedavg"]["weights"]
    tuned = ev["finetuned"]
    assert tuned["steps"] == 3
    for cid, client in enumerate(data.clients):
        acc, loss = bare_finetune(weights, client, cfg, 2, cid, 3)
        got = tuned["clients"][client.name]["test"]
        assert got["acc"] == pytest.approx(acc, abs=1e-12)
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
    accs = [tuned["clients"][c.name]["test"]["acc"] for c in data.clients]
    assert tuned["mean"]["test_acc"] == pytest.approx(np.mean(accs), abs=1e-12)
    assert tuned["spread"]["test_acc"]["min"] == min(accs)
    # fine-tuning moved the model: the fine-tuned losses are not the global model's
    assert all(tuned["clients"][n]["test"]["loss"] != ev["clients"][n]["test"]["loss"] for n in ev["clients"])
    # the training downlink is counted in the evaluation's traffic, under its own name
    assert ev["comm"]["down"]["finetune/fedavg"] == ev["comm"]["down"]["fedavg"]


def test_finetuning_keeps_nothing_the_run_continues_as_without_it():
    def strip(records):
        return [{k: v for k, v in r.items() if k not in ("time", "eval")} | {
            "eval": {k: v for k, v in r["eval"].items() if k not in ("finetuned", "comm")}} for r in records]

    raw_with, raw_without = config(rounds=3, finetune_steps=2), config(rounds=3)
    out = []
    for cfg in (raw_with, raw_without):
        sim = build_simulation(cfg)
        records = []
        for r in range(1, 4):
            rec = sim.run_round(r)
            rec["eval"] = sim.evaluate()
            records.append(rec)
        out.append(strip(records))
    assert out[0] == out[1]


@pytest.mark.parametrize("key, value, match", [
    ("clients", "some", r"'eval\.clients' must be one of all, sampled, got 'some'"),
    ("finetune_steps", -1, r"'eval\.finetune_steps' must be >= 0, got -1"),
    ("finetune_steps", 1.5, r"'eval\.finetune_steps' must be an integer"),
])
def test_bad_eval_options_are_refused(key, value, match):
    with pytest.raises(ConfigError, match=match):
        config(**{key: value})


def test_finetuned_evaluation_on_two_workers_equals_one_worker():
    """The worker processes fine-tune as the in-process worker does (FedFA: its training downlink
    travels under finetune/fedfa), bit for bit at one thread per worker."""
    from tests.engine.test_pool import config as pool_config, records as pool_records

    one = pool_records(build_simulation(pool_config(1, "fedfa", eval={"finetune_steps": 2})), 2)
    two = pool_records(build_simulation(pool_config(2, "fedfa", eval={"finetune_steps": 2})), 2)
    assert two == one and '"finetune/fedfa"' in one and '"finetuned"' in one
