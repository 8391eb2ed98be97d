"""CUDA runs against CPU runs, deterministic CUDA runs, and resume on CUDA (issue 17, Must show 2).

CUDA random streams are CUDA generators (:mod:`fedaug.core.rng`): with the same seeds they draw
other numbers than the CPU's, so a CUDA run and a CPU run of a method that draws (batch order,
augmentation noise) are two samples of the same experiment, not the same numbers. Hence two
tolerances:

* :data:`EXACT_RTOL`: methods trained full-batch (one batch of all of a client's samples per step:
  the batch order cannot matter) and without random augmentation (fedavg, fedbn, scaffold, moon):
  every loss and accuracy within 1e-3 relative (float32 kernels sum in another order; cuDNN
  convolutions may use TF32-free but differently blocked algorithms);
* :data:`SAMPLE_RTOL`: the augmentations (fedfa, vfda in 3D, fedrdn, flea), whose draws differ:
  training losses within 15 % relative after 2 rounds, and every exact field (sampled clients,
  steps, bytes of every message part, per-client state bytes) equal.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from fedaug.config.load import load_config
from fedaug.config.schema import validate
from fedaug.core.runtime import deterministic_algorithms
from fedaug.engine.simulate import build_simulation, resume_experiment, run_experiment
from tests.conftest import tiny_raw

EXACT_RTOL = 1e-3
SAMPLE_RTOL = 0.15
DETERMINISTIC = ("fedavg", "fedbn", "scaffold", "moon")
AUGMENTED = ("fedfa", "fedrdn", "flea")


def raw_for(name: str, device: str, **top: Any) -> dict[str, Any]:
    raw = tiny_raw(rounds=2, participation=0.67)
    if name in DETERMINISTIC:
        raw["train"]["batch_size"] = 64  # full batch: the shuffle order cannot change a step
    base, augs = (name, []) if name in ("fedavg", "fedbn", "scaffold") else ("fedavg", [name])
    options = {name: {"kernel": "off"}} if name in ("fedfa", "vfda") else {}
    raw["method"] = {"base": base, "augs": augs, "options": options}
    raw.update(device=device, **top)
    return raw


def records(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Two rounds' records (times left out), under the config's deterministic setting as ``run`` applies it."""
    cfg = validate(raw)
    sim = build_simulation(cfg)
    out = []
    with deterministic_algorithms(cfg.deterministic):
        for r in range(1, 3):
            rec = sim.run_round(r)
            rec["eval"] = sim.evaluate()
            rec.pop("time")
            out.append(json.loads(json.dumps(rec)))
    return out


def exact_fields(rec: dict[str, Any]) -> dict[str, Any]:
    return {"sampled": rec["sampled"], "comm": rec["comm"], "client_state": rec["client_state"],
            "steps": {c: m["steps"] for c, m in rec["train"]["clients"].items()},
            "eval_comm": rec["eval"]["comm"]}


def assert_close(cpu: list[dict[str, Any]], cuda: list[dict[str, Any]], rtol: float, evaluation: bool) -> None:
    for a, b in zip(cpu, cuda, strict=True):
        assert exact_fields(a) == exact_fields(b)
        assert b["train"]["loss"] == pytest.approx(a["train"]["loss"], rel=rtol)
        if evaluation:
            assert b["eval"]["mean"] == pytest.approx(a["eval"]["mean"], rel=rtol, abs=rtol)


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_cuda_equals_cpu_within_float_tolerance(name: str) -> None:
    assert_close(records(raw_for(name, "cpu")), records(raw_for(name, "cuda")), EXACT_RTOL, evaluation=True)


@pytest.mark.parametrize("name", AUGMENTED)
def test_cuda_augmentations_match_cpu_in_distribution(name: str) -> None:
    assert_close(records(raw_for(name, "cpu")), records(raw_for(name, "cuda")), SAMPLE_RTOL, evaluation=False)


def test_vfda_3d_on_cuda_matches_cpu_in_distribution() -> None:
    """VFDA on the 3D U-Net: the ``vfda_brain_mri_3d`` preset, small (16^3 patches, 2 rounds)."""
    def raw(device: str) -> dict[str, Any]:
        cfg, _ = load_config("vfda_brain_mri_3d", ["train.rounds=2", "train.local_steps=2", "data.options.patch=16",
                                                   "data.options.size=32", "method.options.vfda.kernel=off",
                                                   f"device={device}"])
        return cfg.to_dict()

    assert_close(records(raw("cpu")), records(raw("cuda")), SAMPLE_RTOL, evaluation=False)


#: a model without AdaptiveAvgPool2d, whose CUDA backward has no deterministic kernel (docs/engine.md)
DETERMINISTIC_MODEL = {"name": "digit_model", "options": {"input_size": 8}}


@pytest.mark.parametrize("name", ["fedavg", "fedfa", "flea"])
def test_deterministic_cuda_runs_are_identical(name: str) -> None:
    raw = raw_for(name, "cuda", deterministic=True, model=DETERMINISTIC_MODEL)
    assert records(raw) == records(raw)


def test_deterministic_cuda_names_an_operation_without_a_deterministic_kernel() -> None:
    with pytest.raises(RuntimeError, match="adaptive_avg_pool2d"):  # small_cnn's global pooling
        records(raw_for("fedavg", "cuda", deterministic=True))


def test_resume_on_cuda_equals_an_uninterrupted_run(tmp_path) -> None:
    raw = raw_for("scaffold", "cuda", deterministic=True, model=DETERMINISTIC_MODEL)
    raw.update(out_dir=str(tmp_path / "whole"), checkpoint_every=1)
    whole, _ = run_experiment(validate(raw), quiet=True)
    raw["out_dir"] = str(tmp_path / "cut")
    raw["train"]["rounds"] = 1
    _, run_dir = run_experiment(validate(raw), quiet=True)
    text = (run_dir.path / "config.toml").read_text().replace("rounds = 1", "rounds = 2")
    (run_dir.path / "config.toml").write_text(text)
    resumed, _ = resume_experiment(str(run_dir.path), quiet=True)
    assert resumed["final"] == whole["final"] and resumed["comm_total"] == whole["comm_total"]
    assert resumed["environment"]["device"].startswith("cuda")


def test_checkpoint_written_on_cuda_loads_on_the_cpu(tmp_path) -> None:
    raw = raw_for("fedavg", "cuda")
    raw["out_dir"] = str(tmp_path)
    _, run_dir = run_experiment(validate(raw), quiet=True)
    payload = run_dir.load_latest()
    assert all(t.device.type == "cpu" for t in payload["server"]["fedavg"]["weights"].values())
    cpu = build_simulation(validate({**raw, "device": "cpu"}))
    cpu.restore(payload)
    assert next(iter(cpu.server["fedavg"]["weights"].values())).device == torch.device("cpu")
