"""``fedaug privacy``: exposure, dCor and attacks on a tiny FLea run."""

from __future__ import annotations

import json

import pytest

from fedaug.cli.main import main
from fedaug.config.schema import validate
from fedaug.engine.simulate import run_experiment
from tests.conftest import tiny_raw


@pytest.fixture(scope="module")
def flea_run(tmp_path_factory):
    raw = tiny_raw(participation=0.67, rounds=2)
    raw["out_dir"] = str(tmp_path_factory.mktemp("runs"))
    raw["method"] = {"base": "fedavg", "augs": ["flea"], "options": {"flea": {"stage": "block2"}}}
    _, run_dir = run_experiment(validate(raw), quiet=True)
    return str(run_dir.path)


def test_exposure_per_round(flea_run, capsys):
    assert main(["privacy", "exposure", flea_run, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["round"] for r in rows] == [1, 2] and rows[0]["exposure"] == 0.0 and 0 < rows[1]["exposure"] <= 1


def test_dcor_at_each_checkpoint(flea_run, capsys):
    assert main(["privacy", "dcor", flea_run, "--samples", "64", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(0 <= r["dcor"] <= 1 for r in rows)


def test_reconstruction_attack_writes_a_picture(flea_run, capsys, tmp_path):
    png = tmp_path / "rec.png"
    assert main(["privacy", "attack", flea_run, "--kind", "reconstruction", "--samples", "36", "--epochs", "1",
                 "--png", str(png), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["test_mse"] > 0 and png.stat().st_size > 0


def test_context_attack_reports_accuracy_per_size(flea_run, capsys):
    assert main(["privacy", "attack", flea_run, "--kind", "context", "--samples", "36", "--train-sizes", "10,20",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["train_size"] for r in rows] == [10, 20] and all(0 <= r["accuracy"] <= 1 for r in rows)


def test_run_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.toml").write_text("")
    assert main(["privacy", "dcor", str(tmp_path)]) == 2
    assert "no checkpoint" in capsys.readouterr().err
