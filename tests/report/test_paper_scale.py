"""The paper-scale variant of a grid (``fedaug compare GRID --scale paper``, issue 60): every cell at the paper's
rounds and local epochs (no local steps), seeds 0-4, its own name and directory; a grid without the paper's numbers,
and overrides that would fight the scale, refused with the fix."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fedaug.cli.main import main
from fedaug.config.load import parse_config
from fedaug.core.errors import ConfigError
from fedaug.report import grid as grid_module
from fedaug.report.paper_scale import PAPER_SEEDS, at_scale, paper_counts, paper_scale
from fedaug.report.runner import GRID_FILE, plan
from tests.report.conftest import declared_spec, tiny_spec


def test_every_cell_trains_the_papers_rounds_and_local_epochs_on_five_seeds(tmp_path):
    spec = paper_scale(declared_spec(400, 5))
    assert (spec.name, spec.seeds, list(spec.methods)) == ("tiny-paper-scale", list(PAPER_SEEDS),
                                                           ["FedAvg", "FedAvg lr 0.2"])
    assert spec.description == "tiny test grid (at the paper's scale: 400 rounds x 5 local epochs)"
    cells = plan(spec, tmp_path / spec.name)
    assert len(cells) == 10 and sorted({c.seed for c in cells}) == [0, 1, 2, 3, 4]
    for cell in cells:
        train = parse_config(cell.raw).train
        assert (train.rounds, train.local_epochs, train.local_steps) == (400, 5, None)
        assert train.lr == (0.2 if cell.method == "FedAvg lr 0.2" else 0.05)  # the rest is the grid's
        assert cell.dir.parent.parent.parent == tmp_path / "tiny-paper-scale"
    assert spec.meta()["scale"] == {"scale": "paper", "grid": "tiny", "rounds": 400, "local_epochs": 5}


@pytest.mark.parametrize(("rounds", "local_epochs", "expected"), [
    (100, 5, (100, 5)),
    ((400, 500), 1, (500, 1)),  # the paper's datasets trained for different counts: the largest
    ((400,), (1,), (400, 1)),
])
def test_the_papers_counts_as_declared(rounds, local_epochs, expected):
    assert paper_counts(declared_spec(rounds, local_epochs)) == expected


@pytest.mark.parametrize(("rounds", "local_epochs", "named"), [
    ((), (), r"paper_rounds \(not stated\) and paper_local_epochs \(not stated\)"),
    ((), 1, r"paper_rounds \(not stated\)"),
    (100, (), r"paper_local_epochs \(not stated\)"),
])
def test_a_grid_without_the_papers_numbers_is_refused_with_the_fix(rounds, local_epochs, named):
    with pytest.raises(ConfigError, match=rf"grid 'tiny' has no paper scale: it does not state the paper's {named}; "
                                          r"--scale paper needs both .* or run the grid at its own scale"):
        paper_scale(declared_spec(rounds, local_epochs))
    with pytest.raises(ConfigError, match=r"grid 'tiny' has no paper scale: .*paper_rounds \(absent\) and "
                                          r"paper_local_epochs \(absent\)"):
        paper_scale(tiny_spec())  # a grid with no declaration at all


def test_a_shipped_grid_whose_paper_states_no_rounds_is_refused():
    with pytest.raises(ConfigError, match=r"grid 'vfda_table2_brain_mri' has no paper scale: .*paper_rounds "
                                          r"\(not stated\)"):
        paper_scale(grid_module.load_grid("vfda_table2_brain_mri"))


def test_overrides_of_the_scales_keys_are_refused_and_others_kept():
    spec = declared_spec(40, 2)
    with pytest.raises(ConfigError, match=r"--scale paper sets train.rounds and train.local_epochs to the paper's "
                                          r"\(40 x 2\) and unsets train.local_steps; drop --set train.rounds=5"):
        paper_scale(replace(spec, overrides=["device=cpu", "train.rounds=5"]))
    kept = paper_scale(replace(spec, overrides=["train.lr=0.3"]), seeds=[7])
    assert kept.seeds == [7] and parse_config(kept.raw("default", "FedAvg", 7)).train.lr == 0.3


def test_at_scale_keeps_a_stand_in_grid_and_names_an_unknown_scale():
    spec = tiny_spec()
    assert at_scale(spec, "stand-in") is spec
    with pytest.raises(ConfigError, match=r"unknown scale 'full'; choose from stand-in, paper"):
        at_scale(spec, "full")


def test_compare_scale_paper_writes_the_variant_into_its_own_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grid_module, "load_grid", lambda *a, **k: declared_spec(6, 1))
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "tiny", "--scale", "paper", "--table-only"]) == 0
    meta = json.loads((tmp_path / "runs" / "compare" / "tiny-paper-scale" / GRID_FILE).read_text())
    assert meta["seeds"] == [0, 1, 2, 3, 4] and meta["scale"]["rounds"] == 6
    assert main(["compare", "tiny", "--scale", "paper", "--seeds", "3", "--table-only"]) == 0
    assert json.loads((tmp_path / "runs" / "compare" / "tiny-paper-scale" / GRID_FILE).read_text())["seeds"] == [3]
    capsys.readouterr()
    assert main(["compare", "--method", "FedAvg", "--scale", "paper"]) == 2
    assert "--scale paper runs a grid file at another scale" in capsys.readouterr().err
