"""experiments/flea_tradeoff.py on a tiny finished grid: FedAvg and FLea at two stages, 2 rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedaug.report.grid import parse_grid
from fedaug.report.runner import run_grid
from tests.experiments.scripts import load_script
from tests.report.conftest import tiny_grid_raw


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    def flea(lam: float, stage: str) -> dict:
        return {"method": {"augs": ["flea"], "options": {"flea": {"stage": stage, "dcor_weight": lam}}}}

    raw = tiny_grid_raw(seeds=[0], methods={"FedAvg": {}, "FLea 3 block1": flea(3.0, "block1"),
                                            "FLea 0 block2": flea(0.0, "block2")})
    raw["common"]["train"].update(rounds=2, participation=0.67)
    out = tmp_path_factory.mktemp("grid") / "tiny_flea"
    run_grid(parse_grid(raw, "tiny_flea"), out)
    return out


def test_every_cell_gets_dcor_and_mse_at_its_stage_and_fedavg_at_every_stage(grid, tmp_path):
    tradeoff = load_script("flea_tradeoff")
    tradeoff.main([str(grid), "--out", str(tmp_path), "--samples", "32", "--epochs", "1"])
    cells = json.loads((tmp_path / "tradeoff.json").read_text())
    where = {(c["method"], c["stage"]): c for c in cells}
    assert set(where) == {("FedAvg", "block1"), ("FedAvg", "block2"), ("FLea 3 block1", "block1"),
                          ("FLea 0 block2", "block2")}
    assert [where[k]["lambda2"] for k in sorted(where)] == [0.0, 3.0, None, None]
    for c in cells:
        assert 0 <= c["dcor2"]["mean"] <= 1 and c["mse"]["mean"] > 0 and 0 <= c["final"]["mean"] <= 1
    # the undefended model at block1 and FLea's at block1 are different models: different dCor^2
    assert where[("FedAvg", "block1")]["dcor2"]["mean"] != where[("FLea 3 block1", "block1")]["dcor2"]["mean"]
    assert (tmp_path / "tradeoff.png").stat().st_size > 0 and (tmp_path / "curves.png").stat().st_size > 0
    assert (tmp_path / "tradeoff.md").read_text().count("\n") == 2 + len(cells)


def test_a_rerun_reads_the_cache_instead_of_measuring(grid, tmp_path, monkeypatch):
    tradeoff = load_script("flea_tradeoff")
    tradeoff.main([str(grid), "--out", str(tmp_path), "--samples", "32", "--epochs", "1"])
    first = (tmp_path / "tradeoff.json").read_text()
    monkeypatch.setattr(tradeoff, "measure", lambda *a, **k: pytest.fail("measured a cached run again"))
    tradeoff.main([str(grid), "--out", str(tmp_path), "--samples", "32", "--epochs", "1"])
    assert (tmp_path / "tradeoff.json").read_text() == first


def test_the_attack_takes_every_test_image_when_the_federation_holds_fewer_than_asked(grid, tmp_path):
    from fedaug.cli.privacy_runs import restore_run

    tradeoff = load_script("flea_tradeoff")
    sim, _ = restore_run(next(p.parent for p in grid.rglob("summary.json")))
    train = sum(c.train.x.shape[0] for c in sim.data.clients)
    test = sum(c.test.x.shape[0] for c in sim.data.clients)
    assert test < train  # the tiny grid's pools: a sample count between them exists
    tradeoff.main([str(grid), "--out", str(tmp_path), "--samples", str(train), "--epochs", "1"])
    rows = json.loads((tmp_path / "runs.json").read_text())
    assert rows and all(r["samples"] == train and r["attack_samples"] == test for r in rows)
