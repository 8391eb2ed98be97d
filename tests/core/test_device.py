"""Device resolution, precision checks, placement helpers and the run environment record."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedaug.core import device as dev
from fedaug.core.device import (available_devices, check_fits, check_precision, data_on_device, environment,
                                resolve_device, to_device)
from fedaug.core.errors import ConfigError


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend this machine has CUDA devices 0 and 1 (no MPS)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize(("name", "expected"), [
    ("cpu", "cpu"), ("auto", "cuda:1"), ("cuda", "cuda:1"), ("cuda:0", "cuda:0"), ("cuda:1", "cuda:1"),
])
def test_resolution_with_two_gpus(two_gpus: None, name: str, expected: str) -> None:
    assert resolve_device(name) == torch.device(expected)


def test_missing_cuda_index_names_the_available_devices(two_gpus: None) -> None:
    with pytest.raises(ConfigError, match=r"'cuda:3' is not available on this machine; available: cpu, cuda:0, cuda:1"):
        resolve_device("cuda:3")


def test_auto_is_the_cpu_without_cuda(no_gpu: None) -> None:
    assert available_devices() == ["cpu"]
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("name", ["mps", "cuda", "cuda:0"])
def test_absent_device_is_one_clear_error(no_gpu: None, name: str) -> None:
    with pytest.raises(ConfigError, match=rf"device '{name}' is not available on this machine; available: cpu"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", ""])
def test_malformed_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="device must be auto, cpu, cuda, cuda:N or mps"):
        resolve_device(name)


def test_precision_checks() -> None:
    cpu = torch.device("cpu")
    for precision in ("32", "tf32", "bf16-mixed", "16-mixed"):  # torch autocasts both half types on the CPU
        check_precision(cpu, precision)
    with pytest.raises(ConfigError, match="precision must be one of 32, tf32, bf16-mixed, 16-mixed"):
        check_precision(cpu, "64")


def test_autocast_and_scaler_follow_the_precision() -> None:
    cpu = torch.device("cpu")
    lin = torch.nn.Linear(4, 4)
    with dev.autocast(cpu, "bf16-mixed"):
        assert lin(torch.ones(2, 4)).dtype == torch.bfloat16
    with dev.autocast(cpu, "32"):
        assert lin(torch.ones(2, 4)).dtype == torch.float32
    assert dev.grad_scaler(cpu, "32") is None and dev.grad_scaler(cpu, "bf16-mixed") is None
    assert isinstance(dev.grad_scaler(cpu, "16-mixed"), torch.amp.GradScaler)


def _tf32_settings() -> dict[str, object]:
    """torch's TF32 settings as they stand (the ones :func:`fedaug.core.device.float32_math` sets)."""
    return {f"{type(owner).__name__}.{name}": getattr(owner, name) for owner, name in dev._float32_math_settings()}


@pytest.mark.parametrize(("precision", "want"), [("32", "ieee"), ("tf32", "tf32"), ("bf16-mixed", "ieee"),
                                                 ("16-mixed", "ieee")])
def test_float32_math_sets_every_tf32_switch_and_restores_it(precision: str, want: str) -> None:
    before = _tf32_settings()
    for owner, name in dev._float32_math_settings():  # start from the opposite of what the block wants
        setattr(owner, name, "tf32" if want == "ieee" else "ieee")
    opposite = _tf32_settings()
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with dev.float32_math(precision):
                inside = _tf32_settings()
                raise RuntimeError("inside")
        assert set(inside.values()) == {want}, inside
        assert _tf32_settings() == opposite  # restored, also when the block raised
    finally:
        for (owner, name), value in zip(dev._float32_math_settings(), before.values()):
            setattr(owner, name, value)


def test_pytorchs_default_lets_cudnn_convolutions_use_tf32() -> None:
    """Why ``"32"`` needs :func:`~fedaug.core.device.float32_math`: out of the box, cuDNN's float32
    convolutions may round to TF32 (the defect the first GPU run found, issue 45)."""
    assert torch.backends.cudnn.allow_tf32 is True


def test_to_device_keeps_tensors_already_there_and_the_nest() -> None:
    t = torch.ones(3)
    tree = {"a": [t, (t, 1)], "b": "x", "c": {"d": None}}
    out = to_device(tree, torch.device("cpu"))
    assert out["a"][0] is t and out["a"][1][0] is t  # no copy on the run's own device
    assert isinstance(out["a"][1], tuple) and out["a"][1][1] == 1 and out["b"] == "x" and out["c"] == {"d": None}
    half = to_device({"x": t}, torch.device("meta"))
    assert half["x"].device.type == "meta"


def test_check_fits_refuses_with_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    check_fits(10**15, cpu, "data")  # the CPU's free memory is not known: nothing to refuse
    monkeypatch.setattr(dev, "free_memory", lambda d: 1 * 2**20)
    check_fits(2**20, cpu, "data")
    with pytest.raises(ConfigError, match=r"data needs an estimated 3\.0 MiB on cpu, but only 1\.0 MiB are free; "
                                          r"set data\.on_device=false"):
        check_fits(3 * 2**20, cpu, "data")


MIB = 2**20
GPU = torch.device("cuda", 0)  # never touched: its free memory is faked


def test_auto_keeps_data_on_a_cuda_device_within_half_its_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "free_memory", lambda d: 100 * MIB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no notice where it fits
        assert data_on_device("auto", 50 * MIB, GPU) is True  # DATA_BUDGET of the free memory, exactly
        assert data_on_device(False, 1, GPU) is False
        assert data_on_device(True, 99 * MIB, GPU) is True  # true keeps what fits at all
    with pytest.warns(UserWarning) as caught:
        assert data_on_device("auto", 50 * MIB + 2**17, GPU) is False
    assert [str(w.message) for w in caught] == [
        "data.on_device=auto: the clients' data (50.1 MiB) stays on the host in pinned memory, since it would take "
        "more than 50% of the 100.0 MiB free on cuda:0; each client's data moves to the device when it runs "
        "(data.on_device=true keeps it there where it fits at all)"]
    with pytest.raises(ConfigError, match=r"^data\.on_device=true \(every client's splits\) needs an estimated "
                                          r"101\.0 MiB on cuda:0, but only 100\.0 MiB are free"):
        data_on_device(True, 101 * MIB, GPU)


def test_auto_on_another_device_keeps_data_on_the_host_without_asking_its_memory(monkeypatch) -> None:
    monkeypatch.setattr(dev, "free_memory", lambda d: pytest.fail("asked for the free memory"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for device in (torch.device("cpu"), torch.device("mps")):
            assert data_on_device("auto", 10**15, device) is False


def test_environment_names_device_precision_and_versions() -> None:
    env = environment(torch.device("cpu"), "bf16-mixed", True)
    assert env["device"] == "cpu" and env["precision"] == "bf16-mixed" and env["deterministic"] is True
    assert env["torch"] == torch.__version__ and env["cuda"] == torch.version.cuda
    assert set(env) == {"device", "device_name", "precision", "deterministic", "torch", "cuda", "cudnn", "cpu",
                        "cpu_capability", "threads"}
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["threads"] == torch.get_num_threads()
    assert env["device_name"] == env["cpu"] == dev.cpu_name() != ""


def test_cpu_name_reads_the_model_name_or_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n")
    real = dev.Path
    monkeypatch.setattr(dev, "Path", lambda p: info if p == "/proc/cpuinfo" else real(p))
    assert dev.cpu_name() == "AMD EPYC 9B14"
    info.unlink()  # no /proc/cpuinfo (macOS, Windows): the platform's name
    monkeypatch.setattr(dev.platform, "processor", lambda: "arm")
    assert dev.cpu_name() == "arm"
