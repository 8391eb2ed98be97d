"""Attack scenarios on Flower (issue 20): ``[attack]`` travels in the run config, so the SuperNode
whose partition id is an attacker attacks by itself; the server rejects its NaN updates with the
reason in the records, the run completes, and the records are the in-process engine's."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from fedaug.config.schema import validate  # noqa: E402
from fedaug.engine.flower.inprocess import run_in_process  # noqa: E402
from fedaug.engine.simulate import run_experiment  # noqa: E402
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


@pytest.mark.slow
def test_an_attacking_supernode_in_a_loopback_deployment(tmp_path):
    """The same over a real SuperLink and three SuperNodes started here (``fedaug flower local``'s trial)."""
    from fedaug.engine.flower.app import write_app
    from fedaug.engine.flower.local import LoopbackTrial

    raw = tiny_raw(rounds=1, local_steps=2, min_clients=2)
    raw.update(out_dir=str(tmp_path / "runs"), attack={"kind": "nan", "clients": [2]})
    cfg = validate(raw)
    trial = LoopbackTrial(write_app(cfg, tmp_path / "app", round_timeout=300, connect_timeout=120), tmp_path, 3)
    with trial.running():
        trial.call(trial.flwr_run(), timeout=420)
    (run_dir,) = (tmp_path / "runs").iterdir()
    (r1,) = records(run_dir)
    assert r1["attack"] == {"kind": "nan", "clients": [2]} and r1["dropped"] == []
    (rejected,) = r1["rejected"]
    assert rejected["client"] == 2 and "part 'fedavg'" in rejected["reason"] and "non-finite" in rejected["reason"]
    assert sorted(r1["train"]["clients"]) == ["0", "1"] and "eval" in r1
