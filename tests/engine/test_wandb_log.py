"""W&B offline runs (``[log] wandb = "offline"``, issue 50), read back with W&B's own offline reader
(``wandb leet inspect --json``, which parses the run's ``.wandb`` transaction log), with the network
unavailable to the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb", reason="the tracking extra is not installed (W&B): pip install 'fedaug[tracking]'")

from fedaug.config.schema import validate  # noqa: E402
from fedaug.core.errors import ConfigError  # noqa: E402
from fedaug.engine.records import tracking  # noqa: E402
from fedaug.engine.records.rundir import RunDir  # noqa: E402
from fedaug.engine.run import resume_experiment, run_experiment  # noqa: E402
from fedaug.engine.records.tracking import round_scalars  # noqa: E402
from tests.conftest import tiny_raw  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_network")  # tests/engine/conftest.py


def records(wandb_file: Path) -> list[dict]:
    """Every record of an offline run, as W&B's reader prints them (one JSON object per line)."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
                         capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def history(recs: list[dict]) -> dict[int, dict]:
    return {r["history"]["step"]["num"]: r["history"]["item"] for r in recs if r["type"] == "history"}


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.slow
def test_every_round_config_and_summary_land_in_an_offline_run_and_a_resume_adds_the_rounds_after_it(tmp_path):
    raw = tiny_raw(rounds=3)
    raw.update(out_dir=str(tmp_path / "runs"), log={"wandb": "offline"}, keep_checkpoints=3)
    summary, run_dir = run_experiment(validate(raw), quiet=True)
    (wandb_file,) = offline_runs(run_dir.path)
    recs = records(wandb_file)
    (run,) = [r["run"] for r in recs if r["type"] == "run"]
    run_id = json.loads((run_dir.path / "tracking.json").read_text())["wandb"]["run_id"]
    assert run["run_id"] == run_id and run["display_name"] == run_dir.path.name and run["project"] == "fedaug"
    config = run["config"]["update"]
    assert config["train.rounds"] == 3 and config["log.wandb"] == "offline" and config["method.base"] == "fedavg"
    expected = {r["round"]: round_scalars(r, "acc") for r in run_dir.rounds()}
    got = history(recs)
    assert sorted(got) == [1, 2, 3]
    for step, scalars in expected.items():
        assert {k: got[step][k] for k in scalars} == scalars  # every scalar, the same float
    (exit_,) = [r["exit"] for r in recs if r["type"] == "exit"]
    assert exit_.get("exit_code", 0) == 0
    final = {k: v for r in recs if r["type"] == "summary" for k, v in r["summary"].get("update", {}).items()}
    assert final["final/test_acc"] == summary["final"]["eval"]["mean"]["test_acc"]

    resume_experiment(str(run_dir.path), quiet=True, from_round=1)  # rounds 2-3 again: a second offline run
    first, second = offline_runs(run_dir.path)
    assert first == wandb_file and second.name == f"run-{run_id}.wandb"  # the same W&B run when synced
    again = history(records(second))
    assert sorted(again) == [2, 3]
    expected = {r["round"]: round_scalars(r, "acc") for r in RunDir(run_dir.path).rounds()}
    assert all(again[s]["train/loss"] == expected[s]["train/loss"] for s in (2, 3))


def test_wandb_is_refused_before_the_run_where_it_is_not_installed_and_only_offline_is_accepted(tmp_path,
                                                                                             monkeypatch):
    with pytest.raises(ConfigError, match=r"'log\.wandb' must be one of off, offline, got 'online'"):
        validate({**tiny_raw(), "log": {"wandb": "online"}})
    monkeypatch.setattr(tracking, "find_spec", lambda name: None)
    raw = tiny_raw(rounds=1)
    raw.update(out_dir=str(tmp_path / "runs"), log={"wandb": "offline"})
    with pytest.raises(ConfigError, match=r"log\.wandb needs the 'wandb' package, which is not installed; install it "
                                          r"with: pip install 'fedaug\[tracking\]'"):
        run_experiment(validate(raw), quiet=True)
