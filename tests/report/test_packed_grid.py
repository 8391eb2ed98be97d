"""Packed grids (``fedaug compare --pack``, issue 62): the tiny grid's four cells (two learning rates x two seeds)
train as one pack; each cell's records equal the cell alone within the grouped tolerance; the command names the
pack and each cell it did not pack, with the reason; a packed grid stopped at a time limit, or killed, and
continued equals the uninterrupted packed grid bit for bit; packs run in worker processes too; a cell that fails
leaves the pack."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from fedaug.cli.main import main
from fedaug.report import deadline
from fedaug.report.runner import run_grid
from tests.cli.test_compare_cmd import kill_at_first_checkpoint, write_grid
from tests.engine.test_grouped import METHODS, assert_close_trees
from tests.report.conftest import TickClock, records_by_cell, tiny_spec


@pytest.fixture(scope="module")
def packed_grid(tmp_path_factory) -> Path:
    """The tiny grid, finished packed (read-only for tests)."""
    out = tmp_path_factory.mktemp("packed") / "tiny"
    outcomes = run_grid(tiny_spec(), out, pack=True)
    assert sorted(o.status for o in outcomes) == ["ran"] * 4
    return out


def test_a_packed_cell_equals_the_cell_alone_within_the_grouped_tolerance(packed_grid, tiny_grid):
    got, want = records_by_cell(packed_grid), records_by_cell(tiny_grid)
    assert got.keys() == want.keys() and len(got) == 4
    for cell in want:
        assert_close_trees(got[cell], want[cell], METHODS["fedavg"][3])


def test_compare_says_what_it_packed_and_why_it_did_not(tmp_path, capsys):
    grid = write_grid(tmp_path, seeds=(0,))
    text = grid.read_text() + '\n[methods.MOON]\nmethod.base = "moon"\n'
    grid.write_text(text)
    assert main(["compare", str(grid), "--out", str(tmp_path / "out"), "--pack", "--set", "train.rounds=1"]) == 0
    err = capsys.readouterr().err
    assert "fedaug compare: pack 1 (2 cells): default | FedAvg | seed 0; default | FedAvg lr 0.2 | seed 0" in err
    assert ("fedaug compare: not packed: default | MOON | seed 0: its clients cannot train grouped: 'moon' (it has "
            "no grouped form of its client hooks)") in err


def test_pack_size_needs_pack(tmp_path, capsys):
    grid = write_grid(tmp_path, seeds=(0,))
    assert main(["compare", str(grid), "--out", str(tmp_path / "out"), "--pack-size", "2"]) == 2
    assert "--pack-size 2 bounds the cells of a pack: give it with --pack" in capsys.readouterr().err


def test_a_time_limited_packed_grid_continues_to_the_uninterrupted_packed_grid(packed_grid, tmp_path, monkeypatch):
    """The pack stops at one round (its decision taken once per round), is continued as the same pack by the same
    command, and equals the uninterrupted packed grid bit for bit (the readings of :class:`TickClock` fix where)."""
    monkeypatch.setattr(deadline, "time", SimpleNamespace(time=TickClock()))
    grid, out = write_grid(tmp_path), tmp_path / "out"
    args = ["compare", str(grid), "--out", str(out), "-q", "--pack", "--time-limit", "14s"]
    statuses = [main(args)]
    while statuses[-1] == 75 and len(statuses) < 10:
        statuses.append(main(args))
    assert statuses[0] == 75 and statuses[-1] == 0, statuses
    rounds = [sorted(len(v) for v in records_by_cell(out).values())]
    assert records_by_cell(out) == records_by_cell(packed_grid), rounds


@pytest.mark.filterwarnings("ignore:run directory .* ended without releasing it:UserWarning")
def test_a_killed_packed_compare_then_the_same_command_equals_the_uninterrupted_packed_grid(packed_grid, tmp_path):
    grid, out = write_grid(tmp_path), tmp_path / "out"
    args = ["compare", str(grid), "--out", str(out), "-q", "--pack"]
    kill_at_first_checkpoint(args, out)
    assert main(args) == 0
    assert records_by_cell(out) == records_by_cell(packed_grid)


def test_packs_run_in_worker_processes_too(packed_grid, tmp_path):
    """Two packs of two cells (``--pack-size 2``) in two worker processes: each pack's cells compute what they
    compute in a pack of four within the grouped tolerance."""
    out = tmp_path / "g"
    outcomes = run_grid(tiny_spec(), out, jobs=2, pack=True, pack_size=2)
    assert sorted(o.status for o in outcomes) == ["ran"] * 4
    got, want = records_by_cell(out), records_by_cell(packed_grid)
    for cell in want:
        assert_close_trees(got[cell], want[cell], METHODS["fedavg"][3])


def test_a_cell_that_fails_leaves_its_pack_and_the_others_finish(tmp_path, packed_grid):
    """A cell whose run fails late (its learning rate diverges and, with every upload rejected, the round
    stops it: ``train.on_empty_round = "stop"``) fails alone; the pack's other cells finish as packed."""
    spec = tiny_spec(methods={"FedAvg": {}, "FedAvg lr 0.2": {"train": {"lr": 0.2}},
                              "diverges": {"train": {"lr": 1e6, "on_empty_round": "stop"}}})
    out = tmp_path / "g"
    from fedaug.report.runner import CellError

    with pytest.raises(CellError) as info:
        run_grid(spec, out, pack=True, keep_going=True)
    statuses = {(o.cell.method, o.cell.seed): o.status for o in info.value.outcomes}
    assert statuses[("diverges", 0)] == statuses[("diverges", 1)] == "failed"
    assert [s for k, s in statuses.items() if k[0] != "diverges"] == ["ran"] * 4
    got, want = records_by_cell(out), records_by_cell(packed_grid)
    for cell in want:
        assert_close_trees(got[cell], want[cell], METHODS["fedavg"][3])
