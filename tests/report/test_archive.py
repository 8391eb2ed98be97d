"""fedaug archive: a grid's finished runs without checkpoints, read back as the grid, and brought back
into an output directory where fedaug compare counts them as done; with --keep-unfinished its stopped runs with
their newest checkpoint, which fedaug compare continues once brought back; archives of several grids in one
tarball, merged grid by grid."""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile

import pytest

from fedaug.cli.main import main
from fedaug.core.errors import ConfigError
from fedaug.engine.records.rundir import CKPT_DIR, CONFIG, ENVIRONMENT, METRICS, METRICS_GZ, SUMMARY, read_records
from fedaug.report.archive import archive_grid, finished_run_dirs, merge_tarball, write_tarball
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


def stop_at_round_2(out):
    """Make the grid directory's cell FedAvg, seed 1, a run stopped after round 2: no summary, its checkpoints those
    of rounds 1 and 2, its records those of rounds 1-2 (as a time limit leaves it); its run directory."""
    (run,) = out.glob("default/fedavg/seed1/*-*")
    (run / SUMMARY).unlink()
    (run / CKPT_DIR / "round_000003.pt").unlink()
    shutil.copy2(run / CKPT_DIR / "round_000002.pt", run / CKPT_DIR / "round_000001.pt")  # an older one stays behind
    (run / METRICS).write_text("".join(line + "\n" for line in (run / METRICS).read_text().splitlines()[:2]))
    return run


def test_keep_unfinished_keeps_a_stopped_run_with_its_newest_checkpoint_and_compare_continues_it(tiny_grid, tmp_path):
    out = copy_grid(tiny_grid, tmp_path)
    run = stop_at_round_2(out)
    done = archive_grid(out, tmp_path / "kept", keep_unfinished=True)
    assert (done.copied, done.present, done.merged, done.unfinished, done.replaced) == (4, 0, 1, 1, 0)
    kept = tmp_path / "kept" / run.relative_to(out)
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "checkpoints/round_000002.pt", CONFIG, ENVIRONMENT, METRICS]
    assert (kept / METRICS).read_bytes() == (run / METRICS).read_bytes()  # as it is: its resume appends to it
    assert (kept / CKPT_DIR / "round_000002.pt").read_bytes() == (run / CKPT_DIR / "round_000002.pt").read_bytes()
    missing = summarize(load_grid_results(tmp_path / "kept"))["missing"]
    assert missing == [f"default | FedAvg | seed 1: unfinished ({kept})"]
    assert len(list((tmp_path / "kept").rglob("*.pt"))) == 1  # finished runs: no checkpoints
    back = tmp_path / "runs" / "tiny"
    assert archive_grid(tmp_path / "kept", back, keep_unfinished=True).unfinished == 1
    outcomes = run_grid(tiny_spec(), back)
    assert sorted(o.status for o in outcomes) == ["done before"] * 3 + ["resumed"]
    assert records_by_run(back) == records_by_run(tiny_grid)  # every round's numbers; only wall times differ


def records_by_run(out):
    """Every run's round records (gzipped or not) without wall times, by run directory."""
    runs = sorted({p.parent for p in out.glob(f"*/*/seed*/*/{METRICS}*")})
    return {r.relative_to(out): [{k: v for k, v in x.items() if k != "time"} for x in read_records(r / METRICS)[0]]
            for r in runs}


def test_an_unfinished_run_gives_way_only_to_more_of_it(tiny_grid, tmp_path):
    out = copy_grid(tiny_grid, tmp_path)
    run = stop_at_round_2(out)
    kept = tmp_path / "kept"
    archive_grid(out, kept, keep_unfinished=True)
    target = kept / run.relative_to(out)
    (run / CKPT_DIR / "round_000002.pt").unlink()  # the same run, less far along (round 1)
    done = archive_grid(out, kept, keep_unfinished=True)
    assert (done.copied, done.present, done.replaced) == (0, 4, 0)
    assert [p.name for p in (target / CKPT_DIR).iterdir()] == ["round_000002.pt"]
    done = archive_grid(tiny_grid, kept, keep_unfinished=True)  # the run finished
    assert (done.copied, done.present, done.unfinished, done.replaced) == (1, 3, 0, 1)
    assert (target / SUMMARY).is_file() and (target / METRICS_GZ).is_file() and not (target / CKPT_DIR).exists()
    assert not (target / METRICS).exists() and not list(kept.rglob(".*partial")) and not list(kept.rglob(".*replaced"))
    done = archive_grid(out, kept, keep_unfinished=True)  # the stopped copy again: the finished run stays
    assert (done.copied, done.present) == (0, 4) and (target / SUMMARY).is_file()
    assert summarize(load_grid_results(kept))["missing"] == []


def test_a_tarball_of_archives_merges_grid_by_grid_keeping_unfinished_runs(tiny_grid, tmp_path, capsys):
    out = copy_grid(tiny_grid, tmp_path)
    run = stop_at_round_2(out)
    archive_grid(out, tmp_path / "stage" / "tiny", keep_unfinished=True)
    archive_grid(tiny_grid, tmp_path / "stage" / "other")
    write_tarball([tmp_path / "stage" / "tiny", tmp_path / "stage" / "other"], tmp_path / "out" / "all.tar.gz")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["all.tar.gz"]
    merged = merge_tarball(tmp_path / "out" / "all.tar.gz", tmp_path / "results")
    assert {k: (v.copied, v.unfinished) for k, v in merged.items()} == {"other": (4, 0), "tiny": (4, 1)}
    assert (tmp_path / "results" / "tiny" / run.relative_to(out) / CKPT_DIR / "round_000002.pt").is_file()
    assert records_by_run(tmp_path / "results" / "tiny") == records_by_run(tmp_path / "stage" / "tiny")
    assert main(["archive", str(tmp_path / "out" / "all.tar.gz"), str(tmp_path / "results")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path / 'results' / 'other'}: 0 run(s) copied, 4 already there, 0 invocation line(s) merged",
        f"{tmp_path / 'results' / 'tiny'}: 0 run(s) copied, 4 already there, 0 invocation line(s) merged"]


def test_a_tarball_that_is_none_of_ours_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "notes.txt").write_text("not a tarball")
    with pytest.raises(ConfigError, match=r"'.*notes.txt' is neither a grid directory nor a tarball of archived grids"):
        merge_tarball(tmp_path / "notes.txt", tmp_path / "results")
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as tar:
        tar.add(tmp_path / "notes.txt", arcname="notes.txt")
    with pytest.raises(ConfigError, match=r"holds no grid directory \(one with grid.json at the tarball's top level\)"):
        merge_tarball(empty, tmp_path / "results")
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(tmp_path / "notes.txt", arcname="../outside.txt")
    with pytest.raises(ConfigError, match=r"holds a member fedaug does not extract .*not a tarball of archived grids"):
        merge_tarball(evil, tmp_path / "results")
    assert not (tmp_path / "results").exists() and not (tmp_path.parent / "outside.txt").exists()


def test_known_archives_only_what_the_grid_adds_to_an_archive(tiny_grid, tmp_path):
    """A GPU call's tarball holds what it added to results/: runs it finished, unfinished runs it got further."""
    out = copy_grid(tiny_grid, tmp_path)
    run = stop_at_round_2(out)
    archive_grid(out, tmp_path / "results", keep_unfinished=True)
    done = archive_grid(tiny_grid, tmp_path / "delta", keep_unfinished=True, known=tmp_path / "results")
    assert (done.copied, done.present, done.unfinished) == (1, 3, 0)
    assert [p.parent.relative_to(tmp_path / "delta") for p in (tmp_path / "delta").rglob(SUMMARY)] == [
        run.relative_to(out)]
    assert archive_grid(out, tmp_path / "none", keep_unfinished=True, known=tmp_path / "results").copied == 0
    assert archive_grid(tmp_path / "delta", tmp_path / "results").copied == 1  # the merge: results/ complete
    assert summarize(load_grid_results(tmp_path / "results"))["missing"] == []
