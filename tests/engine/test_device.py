"""The engine's ``device``, ``precision``, ``deterministic`` and ``data.on_device`` (issue 17) on the CPU."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core import device as dev
from fedaug.core.errors import ConfigError
from fedaug.core.runtime import deterministic_algorithms
from fedaug.data.base import ClientData
from fedaug.engine.fleet.inprocess import InProcessFleet
from fedaug.engine.run import build_simulation, run_experiment
from tests.conftest import tiny_raw
from tests.engine.replay import cases as replay_cases
from tests.engine.replay.cases import case_config, differences
from tests.engine.replay.test_replay import as_recorded

#: bf16 autocast vs float32 after 2 rounds: bfloat16 keeps 8 significant bits (relative rounding
#: 2^-8 ~ 0.4 %); over 6 SGD steps per client the losses drift by a few per cent at most.
BF16_RTOL = 0.05


def _run(**top: object) -> list[dict]:
    raw = tiny_raw(rounds=2)
    raw.update(top)
    sim = build_simulation(validate(raw))
    out = []
    for r in (1, 2):
        rec = sim.run_round(r)
        rec["eval"] = sim.evaluate()
        rec.pop("time")
        out.append(rec)
    return out


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_and_auto_give_the_recorded_numbers(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``device = "cpu"`` and ``"auto"`` (the default; the CPU without CUDA) replay a recorded run (to float32
    rounding of the reported losses, as every replay: ``cases.differences``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = case_config("scaffold_fedfa")
    cfg.device = device
    monkeypatch.setattr(replay_cases, "case_config", lambda name: cfg)
    expected = json.loads((replay_cases.RECORDS / "scaffold_fedfa.json").read_text())
    assert differences(as_recorded(replay_cases.run_case("scaffold_fedfa"), None), expected) == []


def test_missing_device_fails_before_anything_is_written(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    raw = tiny_raw()
    raw.update(device="cuda:3", out_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"'cuda:3' is not available on this machine; available: cpu, cuda:0, cuda:1"):
        run_experiment(validate(raw), quiet=True)
    assert not (tmp_path / "runs").exists()


def test_malformed_device_is_a_config_error() -> None:
    raw = tiny_raw()
    raw["device"] = "gpu0"
    with pytest.raises(ConfigError, match=r"'device' must be auto, cpu, cuda, cuda:N or mps, got 'gpu0'"):
        validate(raw)


def test_bf16_mixed_trains_and_matches_fp32_within_tolerance() -> None:
    fp32, bf16 = _run(), _run(precision="bf16-mixed")
    assert bf16 != fp32  # autocast did change the arithmetic
    for a, b in zip(fp32, bf16):
        assert math.isfinite(b["train"]["loss"])
        assert b["train"]["loss"] == pytest.approx(a["train"]["loss"], rel=BF16_RTOL)
        assert b["eval"]["mean"]["test_loss"] == pytest.approx(a["eval"]["mean"]["test_loss"], rel=BF16_RTOL)
    assert bf16[1]["train"]["loss"] < bf16[0]["train"]["loss"] + 0.05  # it trains, it does not diverge


def test_fp16_mixed_runs_the_gradient_scaler_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = []
    original = torch.amp.GradScaler.step

    def spy(self, optimizer, *args, **kwargs):  # noqa: ANN001, ANN202
        steps.append(self.get_scale())
        return original(self, optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "step", spy)
    records = _run(precision="16-mixed", method={"base": "scaffold"})
    assert steps and all(s > 1 for s in steps)  # every step went through the scaler, loss scaled
    assert all(math.isfinite(r["train"]["loss"]) for r in records)


def test_fp16_mixed_refuses_a_replaced_step() -> None:
    raw = tiny_raw()
    raw.update(precision="16-mixed", method={"base": "fedavg", "augs": ["fedsam"]})
    with pytest.raises(ConfigError, match=r"precision='16-mixed' cannot scale the gradients of 'fedsam'"):
        build_simulation(validate(raw))


def test_deterministic_changes_nothing_on_the_cpu_and_restores_the_flags() -> None:
    assert _run(deterministic=True) == _run()
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    with deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before
    with deterministic_algorithms(False):
        assert torch.are_deterministic_algorithms_enabled() == before[0]


def test_resident_data_on_the_cpu_is_the_data_itself() -> None:
    raw = tiny_raw(rounds=1)
    raw["data"]["on_device"] = True
    sim = build_simulation(validate(raw))
    for held, client in zip(sim.fleet.clients, sim.data.clients):
        assert held.train.x is client.train.x and held.test.y is client.test.y  # nothing copied, nothing pinned
    assert _run(data={**tiny_raw()["data"], "on_device": True}) == _run()


def test_per_round_data_on_the_cpu_is_not_pinned() -> None:
    sim = build_simulation(validate(tiny_raw(rounds=1)))
    assert all(held is client for held, client in zip(sim.fleet.clients, sim.data.clients))
    assert not any(c.train.x.is_pinned() for c in sim.fleet.clients)


def test_resident_data_that_does_not_fit_is_refused_with_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tiny_raw(rounds=1)
    raw["data"]["on_device"] = True
    cfg = validate(raw)
    data = build_simulation(cfg).data
    need = sum(c.nbytes for c in data.clients)
    monkeypatch.setattr(dev, "free_memory", lambda d: need - 1)
    with pytest.raises(ConfigError, match=rf"data\.on_device=true \(every client's splits\) needs an estimated "
                                          rf"{need / 2**20:.1f} MiB on cpu"):
        build_simulation(cfg)


def test_each_run_of_a_pack_keeps_its_data_on_the_device_within_the_memory_the_runs_before_it_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.on_device = "auto"`` on a CUDA worker (faked: the copies to the device and into pinned memory only take
    note, and the free memory is what the copies before left): a fleet reads the free memory when it is built, as a
    pack builds its runs' fleets one after another, so the first runs' data goes to the device and a run whose data
    would pass the budget keeps it on the host, pinned, after one notice."""
    sim = build_simulation(validate(tiny_raw(rounds=1)))
    data, worker = sim.data, sim.fleet.worker
    need = sum(c.nbytes for c in data.clients)
    left, moved, pinned = [3 * need], [], []

    def to(client, device, non_blocking=False):
        left[0] -= client.nbytes
        moved.append(client.name)
        return client

    monkeypatch.setattr(dev, "free_memory", lambda d: left[0])
    monkeypatch.setattr(ClientData, "to", to)
    monkeypatch.setattr(ClientData, "pin_memory", lambda client: pinned.append(client.name) or client)
    monkeypatch.setattr(worker, "device", torch.device("cuda", 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fleets = [InProcessFleet(worker, data, on_device="auto") for _ in range(3)]  # budgets: 1.5, 1, 0.5 x need
    assert [f.data_on_device for f in fleets] == [True, True, False]
    names = [c.name for c in data.clients]
    assert moved == names * 2 and pinned == names
    assert [str(w.message).split(" (")[0] for w in caught] == ["data.on_device=auto: the clients' data"]


def test_summary_records_the_environment(tmp_path) -> None:
    raw = tiny_raw(rounds=1)
    raw.update(out_dir=str(tmp_path), precision="bf16-mixed")
    summary, run_dir = run_experiment(validate(raw), quiet=True)
    env = summary["environment"]
    assert env["device"] == str(dev.resolve_device("auto")) and env["precision"] == "bf16-mixed"
    assert env["torch"] == torch.__version__ and "cudnn" in env and env["deterministic"] is False
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["threads"] >= 1
    if not torch.cuda.is_available():  # "auto" steps eagerly, and keeps the data where it is, on a CPU
        assert (env["execution"], env["data"]) == ("eager", "host")
    text = (run_dir.path / "config.toml").read_text()
    assert 'device = "auto"' in text and 'cuda_graph = "auto"' in text  # resolved again on resume


def test_checkpoints_hold_cpu_tensors(tmp_path) -> None:
    raw = tiny_raw(rounds=1)
    raw["out_dir"] = str(tmp_path)
    _, run_dir = run_experiment(validate(raw), quiet=True)
    payload = run_dir.load_latest()
    tensors = [t for t in dev.to_device(payload["server"], torch.device("cpu")).values()]
    assert tensors and payload["server"]["fedavg"]["weights"]
    assert all(t.device.type == "cpu" for t in payload["server"]["fedavg"]["weights"].values())


def _math_settings() -> set[object]:
    return {getattr(owner, attr) for owner, attr in dev._float32_math_settings()}


@pytest.fixture
def math_settings_restored() -> Iterator[None]:
    """CUDA's float32 switches as they were before the test, whatever it set."""
    before = [getattr(owner, attr) for owner, attr in dev._float32_math_settings()]
    yield
    for (owner, attr), value in zip(dev._float32_math_settings(), before):
        setattr(owner, attr, value)


@pytest.mark.parametrize(("precision", "want"), [("32", {"ieee"}), ("tf32", {"tf32"})])
@pytest.mark.usefixtures("math_settings_restored")
def test_a_cuda_workers_client_calls_compute_at_the_runs_float32_precision(monkeypatch: pytest.MonkeyPatch,
                                                                          precision: str, want: set[str]) -> None:
    """The precision contract (issue 45): while a CUDA worker runs a client's phase (one client or a group),
    CUDA's float32 matrix products and cuDNN's convolutions round as ``precision`` says (``"32"``: never
    TF32), and the process's own settings are back after it. A worker whose model is on CUDA is built here
    without a GPU (its device is what ``module_device`` says); the phase itself is replaced by a spy that
    reads the settings, so nothing runs on the device. tests/gpu/test_cuda.py runs the real thing."""
    from fedaug.engine.client import worker as worker_module

    sim = build_simulation(validate({**tiny_raw(rounds=1), "precision": precision}))
    local = sim.fleet.worker
    monkeypatch.setattr(worker_module, "module_device", lambda model: torch.device("cuda"))
    cuda = worker_module.Worker(sim.cfg, local.recipe, local.model, local.task, sim.federation.num_clients)
    seen: list[set[object]] = []
    monkeypatch.setattr(cuda, "_run", lambda *args: seen.append(_math_settings()))
    monkeypatch.setattr(worker_module, "train_stacked", lambda *args: seen.append(_math_settings()) or [])
    monkeypatch.setattr(cuda, "start_group", lambda *args: [])
    for owner, attr in dev._float32_math_settings():  # start from the opposite of what the calls want
        setattr(owner, attr, "tf32" if want == {"ieee"} else "ieee")
    outside = _math_settings()
    cuda.run("train", 0, 1, 0.1, None, {}, {})
    cuda.train_group(1, 0.1, [(0, None, {}, {}), (1, None, {}, {})])
    assert seen == [want, want] and _math_settings() == outside


@pytest.mark.usefixtures("math_settings_restored")
def test_a_cpu_worker_leaves_cudas_float32_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's TF32 switches steer cuBLAS and cuDNN only: a worker on the CPU neither sets nor restores them
    around a client (doing so cost a small client ~20 us and slowed the CPU steps after it, issue 46), so
    a run's client phases see the process's own settings."""
    from fedaug.engine.client import worker as worker_module

    seen: list[set[object]] = []
    for name in ("train_client", "evaluate_client"):
        original = getattr(worker_module, name)

        def spy(*args: object, _original=original, **kwargs: object) -> object:
            seen.append(_math_settings())
            return _original(*args, **kwargs)

        monkeypatch.setattr(worker_module, name, spy)
    for owner, attr in dev._float32_math_settings():
        setattr(owner, attr, "tf32")  # what a "32" run on CUDA would replace
    build_simulation(validate({**tiny_raw(rounds=1), "precision": "32"})).run()
    assert seen and all(s == {"tf32"} for s in seen), seen
