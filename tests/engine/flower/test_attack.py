"""Attack scenarios on Flower (issue 20): ``[attack]`` travels in the run config, so the SuperNode
whose partition id is an attacker attacks by itself. NaN updates are rejected with the reason in the
records and the run completes; a scaled update under the median is accepted and does not throw the
model off; the records are the in-process engine's over the in-process Flower path (and over a loopback
deployment: tests/engine/flower/test_deployment.py)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from fedaug.config.schema import validate  # noqa: E402
from fedaug.engine.flower.inprocess import run_in_process  # noqa: E402
from fedaug.engine.run import run_experiment  # noqa: E402
from tests.conftest import tiny_raw  # noqa: E402
from tests.engine.flower.conftest import records  # noqa: E402


def test_an_attacking_supernode_sending_nan_is_rejected_and_the_run_completes(tmp_path):
    raw = tiny_raw(rounds=2, local_steps=2, min_clients=2)  # FedAvg; two valid uploads let a round go on
    raw.update(out_dir=str(tmp_path / "runs"), attack={"kind": "nan", "clients": [1]})
    cfg = validate(raw)
    summary = run_in_process(cfg, 3)
    got = records(summary["run_dir"])
    assert summary["rounds"] == 2 and [r["round"] for r in got] == [1, 2]
    for r in got:
        (rejected,) = r["rejected"]
        assert rejected["client"] == 1 and rejected["phase"] == "train"
        assert re.search(r"round \d: uplink of client 1, part 'fedavg': .*non-finite value", rejected["reason"])
        assert r["attack"] == {"kind": "nan", "clients": [1]} and r["dropped"] == []
        assert sorted(r["train"]["clients"]) == ["0", "2"]
    cfg.out_dir = str(tmp_path / "in-process")
    _, run_dir = run_experiment(cfg, quiet=True)
    assert got == records(run_dir.path)


def _final_test_loss(run_dir) -> float:
    return records(run_dir)[-1]["eval"]["mean"]["test_loss"]


def test_a_scaling_supernode_under_median_the_run_keeps_learning_where_fedavg_is_thrown_off(tmp_path):
    """Client 1 sends its update scaled by 100 (valid: finite, within trust.max_abs, BatchNorm statistics
    as trained) with the update screening off (``trust.screen``, which would reject it: tests/engine/
    test_screen.py), so nothing is rejected: FedAvg's model is thrown off, the median's is not; the Flower
    path gives the in-process engine's records."""
    losses = {}
    for base in ("fedavg", "median"):
        raw = tiny_raw(rounds=3, local_steps=2)
        raw.update(out_dir=str(tmp_path / base), method={"base": base, "augs": []}, trust={"screen": "off"},
                   attack={"kind": "scale", "clients": [1], "scale": 100.0})
        summary = run_in_process(validate(raw), 3)
        got = records(summary["run_dir"])
        assert all(r["attack"] == {"kind": "scale", "clients": [1]} and r["rejected"] == [] for r in got)
        losses[base] = _final_test_loss(summary["run_dir"])
        if base == "median":
            raw["out_dir"] = str(tmp_path / "in-process")
            _, run_dir = run_experiment(validate(raw), quiet=True)
            assert got == records(run_dir.path)
    clean = tiny_raw(rounds=3, local_steps=2)
    clean.update(out_dir=str(tmp_path / "clean"), method={"base": "median", "augs": []}, trust={"screen": "off"})
    _, run_dir = run_experiment(validate(clean), quiet=True)
    assert losses["median"] < 1.1 * _final_test_loss(run_dir.path) < losses["fedavg"] / 10
