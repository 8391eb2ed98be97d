"""The update screening on Flower (issue 41): a SuperNode sending values under ``trust.max_abs`` in every
weight is rejected with its update norm by the server code the in-process engine shares, the run finishes
near the clean accuracy, and the records are the in-process engine's."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from fedaug.config.schema import validate  # noqa: E402
from fedaug.engine.flower.inprocess import run_in_process  # noqa: E402
from fedaug.engine.run import run_experiment  # noqa: E402
from tests.engine.flower.conftest import records  # noqa: E402
from tests.engine.test_screen import FILLED, MARGIN, SWEEP, fill_raw, final_acc  # noqa: E402


@pytest.mark.parametrize("value", SWEEP)
def test_an_in_bound_scaled_upload_from_a_supernode_is_rejected_with_its_norm(tmp_path, value):
    raw = fill_raw(value, tmp_path)
    raw["train"]["rounds"] = 1
    (rec,) = records(run_in_process(validate(raw), 3)["run_dir"])
    (culprit,) = rec["rejected"]
    assert culprit["client"] == 1 and re.fullmatch(FILLED, culprit["reason"])
    for kind in ("parameters", "statistics"):
        assert rec["updates"]["norm"]["fedavg"][kind]["1"] > value > rec["updates"]["limit"]["fedavg"][kind]
    assert sorted(rec["train"]["clients"]) == ["0", "2"] and rec["attack"] == {"kind": "fill", "clients": [1]}


def test_a_flower_federation_with_an_in_bound_attacker_finishes_near_the_clean_accuracy_as_in_process(tmp_path):
    clean = run_in_process(validate(fill_raw(None, tmp_path / "clean")), 3)
    summary = run_in_process(validate(fill_raw(5e5, tmp_path / "attacked")), 3)
    got = records(summary["run_dir"])
    assert summary["rounds"] == 4 and final_acc(clean) - final_acc(summary) < MARGIN
    assert all([x["client"] for x in r["rejected"]] == [1] for r in got)
    _, run_dir = run_experiment(validate(fill_raw(5e5, tmp_path / "in-process")), quiet=True)
    assert got == records(run_dir.path)


def test_a_poisoned_flower_federation_under_the_kept_state_default_finishes(tmp_path):
    """Screening off, the attacker's 5e5 in every weight is accepted in round 1 and no honest client can
    train from the aggregate: from round 2 on only the attacker's upload passes, fewer than
    ``train.min_clients = 2``, so every later round keeps the previous state and says so, and the run
    finishes (where it stopped before issue 41)."""
    raw = fill_raw(5e5, tmp_path, screen="off")
    raw["train"]["min_clients"] = 2
    summary = run_in_process(validate(raw), 3)
    got = records(summary["run_dir"])
    assert summary["rounds"] == 4 and got[0]["rejected"] == [] and "aggregate" not in got[0]
    for r in got[1:]:
        assert [x["client"] for x in r["rejected"]] == [0, 2] and r["aggregate"] == [{
            "phase": "train", "kept": "previous",
            "reason": f"round {r['round']}: only 1 of 3 uploads passed validation, fewer than train.min_clients=2"}]
