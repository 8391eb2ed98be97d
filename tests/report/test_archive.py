"""fedaug archive: a grid's finished runs without checkpoints, read back as the grid, and brought back
into an output directory where fedaug compare counts them as done."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from fedaug.cli.main import main
from fedaug.core.errors import ConfigError
from fedaug.engine.records.rundir import ENVIRONMENT, METRICS, METRICS_GZ, SUMMARY
from fedaug.report.archive import archive_grid, finished_run_dirs
from fedaug.report.results import load_grid_results, summarize
from fedaug.report.runner import INVOCATIONS, run_grid
from tests.report.conftest import tiny_spec


def scores(out):
    """Every run's cell, final/best scores, curve and bytes: what tables and pages are made of."""
    return sorted((r.setting, r.method, r.seed, r.score("final"), r.score("best"), sorted(r.curve().items()),
                   r.comm_bytes()["total"], r.seconds()) for r in load_grid_results(out).runs)


def copy_grid(tiny_grid, tmp_path):
    out = tmp_path / "grid"
    shutil.copytree(tiny_grid, out)
    (out / INVOCATIONS).write_text('{"wall_s": 5.0, "cells": {"ran": 4}}\n')
    return out


def test_the_archive_holds_every_finished_run_without_checkpoints_and_reads_as_the_grid(tiny_grid, tmp_path):
    out = copy_grid(tiny_grid, tmp_path)
    done = archive_grid(out, tmp_path / "kept")
    assert (done.copied, done.present, done.merged) == (4, 0, 1)
    kept = tmp_path / "kept"
    names = {p.name for p in kept.rglob("*") if p.is_file()}
    assert not any(n.endswith(".pt") or n in ("lock", ".lock") for n in names)
    assert not list(kept.rglob("checkpoints")) and not list(kept.rglob(METRICS))
    assert scores(kept) == scores(tiny_grid) and len(scores(kept)) == 4
    for run in finished_run_dirs(out):  # the records are the same bytes, gzipped
        archived = kept / run.relative_to(out)
        assert gzip.decompress((archived / METRICS_GZ).read_bytes()) == (run / METRICS).read_bytes()
        assert (archived / SUMMARY).read_bytes() == (run / SUMMARY).read_bytes()
        assert (archived / ENVIRONMENT).read_bytes() == (run / ENVIRONMENT).read_bytes()  # where it ran
    assert summarize(load_grid_results(kept))["missing"] == []
    assert (kept / "table.md").is_file()


def test_archiving_again_copies_nothing_and_counts_no_invocation_twice(tiny_grid, tmp_path):
    out = copy_grid(tiny_grid, tmp_path)
    archive_grid(out, tmp_path / "kept")
    gz = sorted((tmp_path / "kept").rglob(METRICS_GZ))
    before = {p: p.read_bytes() for p in gz}
    done = archive_grid(out, tmp_path / "kept")
    assert (done.copied, done.present, done.merged) == (0, 4, 0)
    assert {p: p.read_bytes() for p in gz} == before
    with open(out / INVOCATIONS, "a") as f:
        f.write('{"wall_s": 7.0, "cells": {"ran": 1}}\n')
    assert archive_grid(out, tmp_path / "kept").merged == 1
    assert [json.loads(line)["wall_s"] for line in (tmp_path / "kept" / INVOCATIONS).read_text().splitlines()] == [5.0, 7.0]


def test_an_unfinished_run_stays_behind_and_its_cell_is_missing(tiny_grid, tmp_path):
    out = copy_grid(tiny_grid, tmp_path)
    (run,) = out.glob("default/fedavg/seed1/*-*")
    (run / SUMMARY).unlink()
    assert archive_grid(out, tmp_path / "kept").copied == 3
    assert not (tmp_path / "kept" / run.relative_to(out)).exists()
    assert summarize(load_grid_results(tmp_path / "kept"))["missing"] == ["default | FedAvg | seed 1: not started"]


def test_an_archive_brought_back_is_done_for_compare(tiny_grid, tmp_path):
    archive_grid(copy_grid(tiny_grid, tmp_path), tmp_path / "kept")
    back = tmp_path / "runs" / "tiny"
    assert archive_grid(tmp_path / "kept", back).copied == 4
    outcomes = run_grid(tiny_spec(), back)
    assert sorted(o.status for o in outcomes) == ["done before"] * 4
    assert scores(back) == scores(tiny_grid)


def test_errors_name_the_directory_and_damage_nothing(tiny_grid, tmp_path):
    with pytest.raises(ConfigError, match=r"'.*nogrid' is not a grid directory \(no grid.json\)"):
        archive_grid(tmp_path / "nogrid", tmp_path / "kept")
    out = copy_grid(tiny_grid, tmp_path)
    with pytest.raises(ConfigError, match="is the grid directory itself"):
        archive_grid(out, out)
    archive_grid(out, tmp_path / "kept")
    (run,) = (tmp_path / "kept").glob("default/fedavg/seed0/*-*")
    changed = json.loads((run / SUMMARY).read_text()) | {"rounds": -1}
    (run / SUMMARY).write_text(json.dumps(changed))
    (other,) = out.glob("default/fedavg/seed1/*-*")
    shutil.rmtree(tmp_path / "kept" / other.relative_to(out))
    with pytest.raises(ConfigError, match=r"holds another run than .*summaries differ"):
        archive_grid(out, tmp_path / "kept")
    assert not (tmp_path / "kept" / other.relative_to(out)).exists()  # nothing copied
    assert json.loads((run / SUMMARY).read_text()) == changed


def test_the_command_prints_what_it_did(tiny_grid, tmp_path, capsys):
    out = copy_grid(tiny_grid, tmp_path)
    assert main(["archive", str(out), str(tmp_path / "kept")]) == 0
    assert capsys.readouterr().out.endswith("4 run(s) copied, 0 already there, 1 invocation line(s) merged\n")
    assert main(["archive", str(tmp_path / "none"), str(tmp_path / "kept")]) == 2
    assert "is not a grid directory" in capsys.readouterr().err
