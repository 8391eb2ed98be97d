"""Tracking ([log], issue 40): read back with the backends' own readers (TensorBoard's
EventAccumulator, MLflow's MlflowClient on a sqlite store), with the network unavailable."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the tracking extra is not installed: pip install 'fedaug[tracking]'")
pytest.importorskip("mlflow", reason="the tracking extra is not installed: pip install 'fedaug[tracking]'")

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from fedaug.cli.main import main  # noqa: E402
from fedaug.config.load import dump_toml, flatten, read_toml  # noqa: E402
from fedaug.config.schema import validate  # noqa: E402
from fedaug.core.errors import ConfigError  # noqa: E402
from fedaug.engine import run as simulate  # noqa: E402
from fedaug.engine.records import tracking  # noqa: E402
from fedaug.engine.records.rundir import RunDir  # noqa: E402
from fedaug.engine.run import resume_experiment, run_experiment  # noqa: E402
from fedaug.engine.records.tracking import TB_DIR, round_scalars  # noqa: E402
from fedaug.report.runner import run_grid  # noqa: E402
from tests.conftest import tiny_raw  # noqa: E402
from fedaug.report.grid import parse_grid  # noqa: E402
from tests.report.conftest import tiny_grid_raw  # noqa: E402


pytestmark = pytest.mark.usefixtures("no_network")  # tests/engine/conftest.py


def tracked(tmp_path: Path, rounds: int = 2, **extra):
    raw = tiny_raw(rounds=rounds)
    raw.update(out_dir=str(tmp_path / "runs"), name="tracked",
               log={"tensorboard": True, "mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"}, **extra)
    return raw


def mlflow_runs(tmp_path: Path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fedaug")
    return client, client.search_runs([exp.experiment_id])


def tb_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir / TB_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_round_scalars_of_a_record():
    record = {"round": 3, "lr": 0.05, "sampled": [0, 2], "rejected": [{"client": 1}], "dropped": [],
              "train": {"loss": 1.5, "clients": {"0": {"loss": 1.0, "steps": 3, "fedprox/prox": 0.2},
                                                 "2": {"loss": 2.0, "steps": 3, "fedprox/prox": 0.4}}},
              "comm": {"down": {"fedavg": 100}, "up": {"fedavg": 90}, "down_total": 100, "up_total": 90},
              "time": {"train_s": 1.25, "eval_s": 0.5}, "privacy": {"epsilon": float("inf")},
              "eval": {"clients": {"site A|1": {"val": {"acc": 0.5, "loss": 1.0}, "test": {"acc": 0.75, "loss": 0.8}}},
                       "mean": {"val_acc": 0.5, "test_acc": 0.75, "test_loss": 0.8},
                       "pooled": {"test_acc": 0.75, "test_loss": 0.8, "n": 4},
                       "spread": {"test_acc": {"std": 0.0, "min": 0.75, "worst10": 0.75}},
                       "comm": {"down_total": 100, "up_total": 24}}}
    s = round_scalars(record, "acc")
    assert s["train/fedprox/prox"] == pytest.approx(0.3) and s["train/loss"] == 1.5 and s["lr"] == 0.05
    assert s["comm/down/fedavg"] == 100 and s["comm/up_total"] == 90 and s["eval/comm/up_total"] == 24
    assert (s["clients/sampled"], s["clients/rejected"], s["clients/dropped"], s["clients/evaluated"]) == (2, 1, 0, 1)
    assert s["time/round_s"] == 1.75
    assert s["eval/test_acc/worst10"] == 0.75 and s["eval/test_acc/pooled"] == 0.75 and s["eval/val_acc/mean"] == 0.5
    assert s["eval/test_acc/client/site A_1"] == 0.75  # '|' is not a character MLflow takes in a key
    assert "privacy/epsilon" not in s  # infinite: left out
    assert "train/steps" not in s


def test_every_round_lands_in_tensorboard_and_mlflow_with_config_and_artifacts(tmp_path):
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(dump_toml(validate(tracked(tmp_path, eval={"finetune_steps": 1})).to_dict()))
    assert main(["run", str(cfg_file), "-q"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    records = RunDir(run_dir).rounds()
    expected = {r["round"]: round_scalars(r, "acc") for r in records}
    assert "finetuned/test_acc/worst10" in expected[2] and "eval/test_acc/client/client1" in expected[2]

    tb = tb_scalars(run_dir)
    assert set(tb) == set(expected[1]) | set(expected[2])
    for tag, points in tb.items():
        assert [step for step, _ in points] == [r for r in (1, 2) if tag in expected[r]]
        for step, value in points:
            assert value == pytest.approx(expected[step][tag], rel=1e-6, abs=1e-6), tag

    client, (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"] == run.info.run_id
    config = flatten(read_toml(run_dir / "config.toml"))
    assert run.data.params["train.lr"] == "0.05" and run.data.params["eval.finetune_steps"] == "1"
    assert set(run.data.params) == set(config)
    for key in ("train/loss", "eval/test_acc/mean", "eval/test_acc/std", "eval/test_acc/min", "comm/up/fedavg",
                "time/round_s", "finetuned/test_acc/mean"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(r, expected[r][key]) for r in (1, 2)], key
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["config.toml", "report.md",
                                                                             "summary.json"]
    beside = tmp_path / "mlflow-artifacts"  # beside the database file, not in ./mlruns
    assert client.get_experiment_by_name("fedaug").artifact_location == beside.as_uri()
    assert sorted(p.name for p in beside.rglob("*") if p.is_file()) == ["config.toml", "report.md", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.toml", "cwd", "mlflow-artifacts", "mlflow.db", "runs"]


@pytest.mark.parametrize(("uri", "expected"), [
    ("sqlite:///store/mlflow.db", "store/mlflow-artifacts"),
    ("sqlite:///store/my%20runs.sqlite?timeout=20", "store/my runs-artifacts"),
    ("file:./mlruns", None),
    ("./mlruns", None),
    ("http://127.0.0.1:5000", None),
    ("databricks", None),
])
def test_artifact_location_of_each_kind_of_store(uri, expected):
    got = tracking.artifact_location(uri)
    assert got == (None if expected is None else (Path.cwd() / expected).as_uri())


@pytest.mark.parametrize("uri", ["postgresql://user@db/mlflow", "mysql+pymysql://db/mlflow", "sqlite://",
                                 "sqlite:///:memory:"])
def test_a_database_whose_artifacts_would_land_in_the_working_directory_is_refused_before_the_run(tmp_path, uri):
    raw = tiny_raw(rounds=1)
    raw.update(out_dir=str(tmp_path / "runs"), log={"mlflow": uri})
    with pytest.raises(ConfigError) as err:
        run_experiment(validate(raw), quiet=True)
    assert str(err.value) == (
        f"log.mlflow = {uri!r}: MLflow would put this store's artifacts in ./mlruns of the working directory; use "
        "sqlite:///FILE (artifacts beside FILE), a file store (file:DIR) or a tracking server (http://host:5000) in "
        "front of that database")
    assert not (tmp_path / "runs").exists()


def test_a_resumed_run_continues_the_same_tracking_run_without_duplicate_steps(tmp_path, monkeypatch):
    raw = tracked(tmp_path, rounds=5, checkpoint_every=2)
    original = simulate.Simulation.run_round

    def crash_in_round_4(self, r):
        if r == 4:
            raise KeyboardInterrupt
        return original(self, r)

    monkeypatch.setattr(simulate.Simulation, "run_round", crash_in_round_4)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(validate(raw), quiet=True)
    monkeypatch.setattr(simulate.Simulation, "run_round", original)
    (run_dir,) = (tmp_path / "runs").iterdir()
    client, (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2, 3]

    resume_experiment(str(run_dir), quiet=True)  # from the checkpoint of round 2: rounds 3-5 run again
    expected = {r["round"]: round_scalars(r, "acc") for r in RunDir(run_dir).rounds()}
    client, (again,) = mlflow_runs(tmp_path)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    for key in ("train/loss", "eval/test_acc/mean"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(r, expected[r][key]) for r in range(1, 6)]
    tb = tb_scalars(run_dir)
    assert [step for step, _ in tb["train/loss"]] == [1, 2, 3, 4, 5]  # round 3's first events are purged
    assert [v for _, v in tb["train/loss"]] == pytest.approx([expected[r]["train/loss"] for r in range(1, 6)])


def test_an_unwritable_store_warns_once_and_the_run_finishes(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    raw = tiny_raw(rounds=2)
    raw.update(out_dir=str(tmp_path / "runs"), log={"mlflow": f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary, run_dir = run_experiment(validate(raw), quiet=True)
    failed = [w for w in caught if "tracking to mlflow failed" in str(w.message)]
    assert len(failed) == 1 and "the run goes on without it" in str(failed[0].message)
    assert summary["rounds"] == 2 and (run_dir.path / "summary.json").is_file()


def test_a_backend_that_fails_mid_run_warns_once_and_leaves_the_records_as_untracked(tmp_path, monkeypatch):
    calls = []

    def broken(self, step, scalars):
        calls.append(step)
        raise OSError("disk full")

    monkeypatch.setattr(tracking.TensorBoardBackend, "log_round", broken)
    raw = tiny_raw(rounds=3)
    raw.update(out_dir=str(tmp_path / "tracked"), log={"tensorboard": True})
    with pytest.warns(UserWarning, match=r"tracking to tensorboard failed \(OSError: disk full\)") as caught:
        _, tracked_dir = run_experiment(validate(raw), quiet=True)
    assert calls == [1] and len([w for w in caught if "tracking" in str(w.message)]) == 1
    raw.update(out_dir=str(tmp_path / "plain"), log={})
    _, plain_dir = run_experiment(validate(raw), quiet=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "time"} for r in rs]  # noqa: E731
    assert strip(RunDir(tracked_dir.path).rounds()) == strip(RunDir(plain_dir.path).rounds())


def test_compare_logs_one_tagged_run_per_cell(tmp_path):
    raw = tiny_grid_raw(seeds=[0])
    raw["common"]["train"].update(rounds=1, local_steps=1)
    raw["common"]["log"] = {"mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    spec = parse_grid(raw, "tiny")
    run_grid(spec, tmp_path / "grid")
    _, runs = mlflow_runs(tmp_path)
    tags = sorted((r.data.tags["fedaug.grid"], r.data.tags["fedaug.setting"], r.data.tags["fedaug.method"],
                   r.data.tags["fedaug.seed"]) for r in runs)
    assert tags == [("tiny", "default", "FedAvg", "0"), ("tiny", "default", "FedAvg lr 0.2", "0")]
    assert all(r.info.status == "FINISHED" for r in runs)


def test_a_backend_that_is_not_installed_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "find_spec", lambda name: None)
    raw = tiny_raw(rounds=1)
    raw.update(out_dir=str(tmp_path / "runs"), log={"tensorboard": True})
    with pytest.raises(ConfigError, match=r"log\.tensorboard needs the 'tensorboard' package, which is not "
                                          r"installed; install it with: pip install 'fedaug\[tracking\]'"):
        run_experiment(validate(raw), quiet=True)
    assert not (tmp_path / "runs").exists()
