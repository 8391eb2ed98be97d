"""The in-process engine: determinism, order independence, validation, accounting, hook order."""

from __future__ import annotations

import math

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError, FedaugError
from fedaug.data.registry import load_dataset
from fedaug.engine.run import Simulation, build_simulation
from fedaug.methods.component import PHASES, Component
from fedaug.methods.recipe import Recipe, build_recipe
from fedaug.methods.base.fedavg import FedAvg
from tests.conftest import tiny_raw


def strip_times(records):
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


def run_records(cfg, order=None):
    sim = build_simulation(cfg, order)
    out = []
    for r in range(1, cfg.train.rounds + 1):
        rec = sim.run_round(r)
        rec["eval"] = sim.evaluate()
        out.append(rec)
    return strip_times(out), sim


def reverse(ids):
    return list(reversed(ids))


def shuffle(ids):
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(123)).tolist()
    return [ids[i] for i in perm]


def test_same_config_same_seed_gives_identical_metrics(tiny_cfg):
    a, _ = run_records(tiny_cfg)
    b, _ = run_records(tiny_cfg)
    assert a == b


def test_other_seed_gives_other_metrics(tiny_cfg):
    a, _ = run_records(tiny_cfg)
    tiny_cfg.seed = 8
    b, _ = run_records(tiny_cfg)
    assert a[-1]["train"] != b[-1]["train"]


@pytest.mark.parametrize("order", [reverse, shuffle])
def test_result_does_not_depend_on_client_execution_order(order):
    cfg = validate(tiny_raw(participation=1.0))
    a, sim_a = run_records(cfg)
    b, sim_b = run_records(cfg, order)
    assert a == b
    for k, v in sim_a.server["fedavg"]["weights"].items():
        assert torch.equal(v, sim_b.server["fedavg"]["weights"][k]), k


def test_order_independence_with_local_batchnorm_state():
    raw = tiny_raw()
    raw["method"] = {"options": {"fedavg": {"bn": "local"}}}
    cfg = validate(raw)
    a, _ = run_records(cfg)
    b, _ = run_records(cfg, reverse)
    assert a == b


def test_communication_bytes_equal_tensor_sizes(tiny_cfg):
    sim = build_simulation(tiny_cfg)
    rec = sim.run_round(1)
    # independent count: every state_dict entry, numel * bytes per element, once per client each way
    per_client = sum(t.numel() * t.element_size() for t in sim.model.state_dict().values())
    n = len(rec["sampled"])
    assert rec["comm"]["down"] == {"fedavg": n * per_client}
    assert rec["comm"]["up"] == {"fedavg": n * per_client}
    assert rec["comm"]["down_total"] == n * per_client


def test_local_bn_policy_keeps_statistics_out_of_messages():
    raw = tiny_raw()
    raw["method"] = {"options": {"fedavg": {"bn": "local"}}}
    sim = build_simulation(validate(raw))
    rec = sim.run_round(1)
    params = sum(p.numel() * 4 for p in sim.model.parameters())
    assert rec["comm"]["up"]["fedavg"] == len(rec["sampled"]) * params
    assert set(sim.client_states) == set(rec["sampled"])
    means = [sim.client_states[c]["fedavg"]["bn"]["block1.1.running_mean"] for c in rec["sampled"]]
    assert not torch.equal(means[0], means[1])  # each client kept its own statistics


def test_drop_bn_policy_removes_running_statistics():
    raw = tiny_raw()
    raw["method"] = {"options": {"fedavg": {"bn": "drop"}}}
    sim = build_simulation(validate(raw))
    assert not any("running" in k for k in sim.server["fedavg"]["weights"])
    sim.run_round(1)
    ev = sim.evaluate()
    assert math.isfinite(ev["mean"]["test_acc"])


class NaNForClient(Component):
    """Test component: poisons one client's uplink by feeding it NaN inputs."""

    name = "poison"

    def __init__(self, victim: int) -> None:
        self.victim = victim

    def transform_batch(self, ctx, batch):
        if ctx.training and ctx.client_id == self.victim:
            return type(batch)(batch.x * float("nan"), batch.y)
        return batch


def simulation_with(cfg, *augs):
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    return Simulation(cfg, data, Recipe(FedAvg(), list(augs)))


def test_nan_upload_is_rejected_with_reason_and_round_goes_on(tiny_cfg):
    sim = simulation_with(tiny_cfg, NaNForClient(victim=1))
    rec = sim.run_round(1)
    assert [x["client"] for x in rec["rejected"]] == [1]
    assert "non-finite" in rec["rejected"][0]["reason"] and "client 1" in rec["rejected"][0]["reason"]
    assert set(rec["train"]["clients"]) == {"0", "2"}
    assert all(torch.isfinite(v).all() for v in sim.server["fedavg"]["weights"].values() if v.is_floating_point())


def test_too_few_valid_uploads_fails_loudly_when_asked_to_stop(tiny_cfg):
    tiny_cfg.train.min_clients, tiny_cfg.train.on_empty_round = 3, "stop"
    sim = simulation_with(tiny_cfg, NaNForClient(victim=0))
    with pytest.raises(FedaugError, match=r"only 2 of 3 uploads .*min_clients=3"):
        sim.run_round(1)


def test_too_few_valid_uploads_keep_the_previous_state_by_default_and_the_round_says_so(tiny_cfg):
    tiny_cfg.train.min_clients = 3
    sim = simulation_with(tiny_cfg, NaNForClient(victim=0))
    before = {k: v.clone() for k, v in sim.server["fedavg"]["weights"].items()}
    rec = sim.run_round(1)
    assert rec["aggregate"] == [{"phase": "train", "kept": "previous", "reason": (
        "round 1: only 2 of 3 uploads passed validation, fewer than train.min_clients=3")}]
    assert [x["client"] for x in rec["rejected"]] == [0] and sorted(rec["train"]["clients"]) == ["1", "2"]
    assert all(torch.equal(sim.server["fedavg"]["weights"][k], v) for k, v in before.items())


class Recorder(Component):
    """Test component recording every hook call, to check the documented call sequence."""

    name = "recorder"
    phases = PHASES

    def __init__(self) -> None:
        self.calls: list[str] = []

    def setup(self, model, input_shape): self.calls.append("setup")
    def init_server(self, model, num_clients): self.calls.append("init_server"); return {}
    def downlink(self, server, client_id, phase="train"): self.calls.append(f"downlink:{phase}"); return {}
    def receive(self, ctx, part, state): self.calls.append(f"receive:{ctx.phase}")
    def transform_batch(self, ctx, batch):
        self.calls.append("transform_batch" if ctx.training else "eval_transform_batch")
        return batch
    def loss_terms(self, ctx, batch, out): self.calls.append("loss_terms"); return {}
    def before_step(self, ctx, optimizer): self.calls.append("before_step")
    def reply(self, ctx): self.calls.append(f"reply:{ctx.phase}"); return {}, {}
    def aggregate(self, server, uplinks, phase="train"): self.calls.append(f"aggregate:{phase}"); return server


def test_hooks_are_called_in_the_documented_order():
    raw = tiny_raw(local_steps=2, rounds=1)
    raw["data"]["options"]["num_clients"] = 1
    cfg = validate(raw)
    rec = Recorder()
    sim = simulation_with(cfg, rec)
    sim.run_round(1)
    sim.evaluate()
    batch = ["transform_batch", "loss_terms", "before_step"]
    assert rec.calls == (["setup", "init_server", "downlink:train", "receive:train"] + batch * 2
                         + ["reply:train", "aggregate:train", "downlink:evaluate", "receive:evaluate",
                            "eval_transform_batch", "eval_transform_batch"])


def test_participation_sampling_zero_clients_is_a_config_error(tiny_cfg):
    tiny_cfg.train.participation = 0.1
    with pytest.raises(ConfigError, match=r"participation=0.1 samples 0 of 3 clients.*>= 0.1667"):
        build_simulation(tiny_cfg)


def test_partial_participation_samples_the_configured_number(tiny_cfg):
    raw = tiny_raw(participation=0.5)
    raw["data"]["options"]["num_clients"] = 6
    sim = build_simulation(validate(raw))
    seen = [sim.run_round(r)["sampled"] for r in (1, 2, 3)]
    assert all(len(s) == 3 for s in seen)
    assert len({tuple(s) for s in seen}) > 1


def test_two_components_replacing_forward_is_a_config_error():
    class A(Component):
        name = "a"
        def forward(self, ctx, batch): return ctx.model(batch.x), batch

    class B(A):
        name = "b"

    with pytest.raises(ConfigError, match=r"both 'a' and 'b' replace 'forward'"):
        Recipe(FedAvg(), [A(), B()])


def test_unknown_method_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown method 'fedavgg'.*did you mean 'fedavg'"):
        build_recipe("fedavgg")


def test_segmentation_trains_and_reports_foreground_dice():
    from tests.engine.toyseg import toy_segmentation

    data = toy_segmentation(2)  # 3 classes by intensity
    cfg = validate({"model": {"name": "unet2d", "options": {"base_width": 4, "depth": 2}},
                    "train": {"rounds": 2, "local_steps": 3, "batch_size": 4, "optimizer": "adam", "lr": 0.01}})
    sim = Simulation(cfg, data, build_recipe("fedavg"))
    summary = sim.run()
    assert summary["metric"] == "dice"
    ev = summary["final"]["eval"]
    assert set(ev["mean"]) == {"val_dice", "test_dice", "test_loss"}
    assert len(ev["clients"]["s0"]["test"]["dice_per_class"]) == 2
    assert 0.0 <= ev["pooled"]["test_dice"] <= 1.0


def test_library_calls_leave_process_settings_alone(tiny_cfg, monkeypatch):
    from fedaug.core import runtime
    from fedaug.engine.run import run_experiment

    before = torch.get_num_threads()
    tiny_cfg.threads = before + 1  # a thread count the process does not have
    tiny_cfg.train.rounds = 1
    monkeypatch.setattr(runtime, "retain_freed_memory", lambda: pytest.fail("the allocator was tuned"))
    build_simulation(tiny_cfg).run_round(1)
    run_experiment(tiny_cfg, quiet=True, write=False)
    assert torch.get_num_threads() == before
