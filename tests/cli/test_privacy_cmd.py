"""``fedaug privacy``: exposure, dCor and attacks on a tiny FLea run."""

from __future__ import annotations

import json

import pytest

from fedaug.cli.main import main
from fedaug.cli.privacy_cmd import NO_GUARANTEE, guarantee
from fedaug.config.schema import validate
from fedaug.engine.run import run_experiment
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
    row = json.loads(capsys.readouterr().out)[0]
    assert row["test_mse"] > 0 and png.stat().st_size > 0
    assert (row["epsilon"], row["delta"], row["guarantee"]) == (None, None, NO_GUARANTEE)  # beside the attack


def test_context_attack_reports_accuracy_per_size(flea_run, capsys):
    assert main(["privacy", "attack", flea_run, "--kind", "context", "--samples", "36", "--train-sizes", "10,20",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["train_size"] for r in rows] == [10, 20] and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert all(r["guarantee"] == NO_GUARANTEE for r in rows)


def test_epsilon_of_a_run_without_dp_says_there_is_no_guarantee(flea_run, capsys):
    assert main(["privacy", "epsilon", flea_run]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "round | epsilon | delta | guarantee"
    assert out[1:] == [f"{r} | None | None | {NO_GUARANTEE}" for r in (1, 2)]


def test_epsilon_of_a_dp_run_per_round_and_per_release(tmp_path_factory, capsys):
    run = _run(tmp_path_factory, {"base": "fedavg", "augs": ["flea"],
                                  "options": {"flea": {"stage": "block2", "dp_clip": 1.0, "dp_noise": 1.0}}},
               participation=0.67)
    assert main(["privacy", "epsilon", run, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["round"] for r in rows] == [1, 2] and 0 < rows[0]["epsilon"] < rows[1]["epsilon"]
    assert all(r["epsilon[flea features]"] == r["epsilon"] and r["delta"] == 1e-5 for r in rows)
    assert rows[1]["guarantee"] == f"({rows[1]['epsilon']:.3g}, 1e-05)-DP per sample; model weights not covered"


def test_guarantee_reads_the_round_asked_for():
    records = [{"round": 1}, {"round": 2, "privacy": {"epsilon": 1.25, "delta": 1e-6, "unit": "client",
                                                       "model_protected": True, "releases": {}}}]
    assert guarantee(records, 1)["guarantee"] == NO_GUARANTEE
    assert guarantee(records, 2) == {"epsilon": 1.25, "delta": 1e-6, "guarantee": "(1.25, 1e-06)-DP per client"}


def test_run_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.toml").write_text("")
    assert main(["privacy", "dcor", str(tmp_path)]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def _run(tmp_path_factory, method: dict, **train) -> str:
    raw = tiny_raw(rounds=2, **train)
    raw["out_dir"] = str(tmp_path_factory.mktemp("runs"))
    raw["method"] = method
    _, run_dir = run_experiment(validate(raw), quiet=True)
    return str(run_dir.path)


def test_a_run_that_shares_no_features_has_exposure_zero_and_says_why(tmp_path_factory, capsys):
    run = _run(tmp_path_factory, {"base": "fedavg", "augs": ["fedrdn"]})  # every client sampled: FLea's schedule gave 1
    assert main(["privacy", "exposure", run, "--format", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [{"round": 1, "exposure": 0.0}, {"round": 2, "exposure": 0.0}]
    assert ("the run's method (fedavg + fedrdn) passes no client's features or samples to others "
            "(only flea, feddata, fedmix do), so its exposure is 0 in every round") in out.err


def test_a_shared_pool_exposes_everyone_once_everyone_has_contributed(tmp_path_factory, capsys):
    run = _run(tmp_path_factory, {"base": "fedavg", "augs": ["feddata"]})
    assert main(["privacy", "exposure", run, "--format", "json"]) == 0
    out = capsys.readouterr()
    assert [r["exposure"] for r in json.loads(out.out)] == [0.0, 1.0] and out.err == ""


@pytest.mark.parametrize("args, message", [
    (["dcor", "--samples", "0"], "argument --samples: must be an integer >= 2, got '0'"),
    (["dcor", "--samples", "1"], "argument --samples: must be an integer >= 2, got '1'"),
    (["attack", "--kind", "reconstruction", "--samples", "-3"], "argument --samples: must be an integer >= 2, got '-3'"),
    (["attack", "--kind", "reconstruction", "--samples", "2.5"], "argument --samples: must be an integer >= 2, got '2.5'"),
    (["attack", "--kind", "reconstruction", "--epochs", "0"], "argument --epochs: must be an integer >= 1, got '0'"),
    (["attack", "--kind", "context", "--train-sizes", "10,x"],
     "argument --train-sizes: must be comma-separated integers >= 1 (e.g. 10,30,100), got '10,x'"),
    (["attack", "--kind", "context", "--train-sizes", "0,10"],
     "argument --train-sizes: must be comma-separated integers >= 1 (e.g. 10,30,100), got '0,10'"),
])
def test_bad_numbers_exit_2_naming_the_argument_and_the_allowed_range(tmp_path, capsys, args, message):
    action, *rest = args
    with pytest.raises(SystemExit) as exc:
        main(["privacy", action, str(tmp_path), *rest])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_context_attack_needs_more_samples_than_its_largest_training_set(tmp_path, capsys):
    assert main(["privacy", "attack", str(tmp_path), "--kind", "context", "--samples", "30",
                 "--train-sizes", "10,30"]) == 2
    assert ("--samples (30) must exceed the largest --train-sizes entry (30): the attacker is tested on the rest; "
            "raise --samples or lower --train-sizes") in capsys.readouterr().err
