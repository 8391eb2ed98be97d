"""benchmarks/paper_scale_gpu.sh and experiments/paper_scale.py on the CPU (issue 60): a grid's paper-scale variant
run in pieces, each call on a fresh machine (no runs/ left) that gets only results/ and the data bundle, its
tarball merged into results/ after each call (``fedaug archive TARBALL results``); the continued records equal
the uninterrupted packed grid's bit for bit, and the finished archive holds no checkpoint. Also: what ``plan``
counts, and which grids a call skips and why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from fedaug.cli.main import main
from fedaug.data.bundle import ENV, export_bundle
from fedaug.data.registry import build_dataset, load_dataset
from fedaug.engine.records.rundir import CKPT_DIR, CONFIG, METRICS, read_records
from fedaug.report import paper_scale as paper_scale_module
from fedaug.report.grid import cell_federations, load_grid
from fedaug.report.paper_scale import paper_scale
from fedaug.report.runner import run_grid
from tests.cli.test_compare_cmd import write_grid
from tests.experiments.scripts import load_script
from tests.report.conftest import declared_spec

ROOT = Path(__file__).resolve().parents[2]
driver = load_script("paper_scale")
#: a call's time (the shim's clock): the grid starts, and its pack stops after two or three rounds
SECONDS = 60
#: one method on five seeds: one pack of five cells, checkpointed only where the time limit stops it
GRID = """# a tiny grid
description = "tiny test grid"
kind = "stand-in"
paper_rounds = 5
paper_local_epochs = 1
paper_datasets = []
[common]
threads = 1
checkpoint_every = 100
data = {name = "synthetic", options = {num_clients = 3, samples_per_client = 48, num_classes = 4, size = 8}}
model = {name = "small_cnn", options = {width = 8}}
train = {rounds = 3, local_steps = 2, batch_size = 8, lr = 0.05}
[methods.FedAvg]
"""


def records(grid_dir: Path) -> dict[tuple[str, ...], list[dict]]:
    """Every run's round records under a grid or archive directory (gzipped or not), without wall times, by cell."""
    runs = sorted({p.parent for p in grid_dir.glob(f"*/*/seed*/*/{METRICS}*")})
    return {run.relative_to(grid_dir).parts[:3]: [{k: v for k, v in r.items() if k != "time"}
                                                  for r in read_records(run / METRICS)[0]] for run in runs}


def call(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One call of the script, on a fresh machine: no runs/, an empty $OUT."""
    for d in ("runs", "out"):
        shutil.rmtree(tmp_path / d, ignore_errors=True)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "paper_scale_gpu.sh"), str(SECONDS)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_script_runs_pieces_that_continue_to_the_uninterrupted_grid(tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(GRID)
    spec = paper_scale(replace(load_grid(str(grid)), overrides=list(driver.SETTINGS["cpu"])))
    export_bundle(cell_federations(spec), tmp_path / "bundle", build_dataset)
    python = tmp_path / "python"  # the shim: a clock of readings
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT}/tests/experiments/paper_scale_shim.py" "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "PYTHONPATH": str(ROOT), "DEVICE": "cpu", "GRIDS": str(grid),
           "RESULTS": "results", "RUNS": "runs/compare", "OUT": "out", ENV: str(tmp_path / "bundle")}
    statuses, checkpoints = [], []
    while len(statuses) < 8 and (not statuses or statuses[-1] == 75):
        done = call(tmp_path, env)
        statuses.append(done.returncode)
        assert done.returncode in (0, 75), done.stdout[-3000:] + done.stderr[-3000:]
        assert [p.name for p in (tmp_path / "out").iterdir()] == ["paper_scale.tar.gz"]
        with tarfile.open(tmp_path / "out" / "paper_scale.tar.gz") as tar:
            assert {Path(m.name).parts[0] for m in tar.getmembers()} == {"tiny-paper-scale"}
        assert main(["archive", str(tmp_path / "out" / "paper_scale.tar.gz"), str(tmp_path / "results")]) == 0
        checkpoints.append(len(list((tmp_path / "results").rglob(f"{CKPT_DIR}/*.pt"))))
    assert statuses[0] == 75 and statuses[-1] == 0, statuses
    assert checkpoints[0] == 5 and checkpoints[-1] == 0, checkpoints  # one per stopped cell; none once finished
    archive = tmp_path / "results" / "tiny-paper-scale"
    run_grid(spec, tmp_path / "uninterrupted", pack=True)
    want = records(tmp_path / "uninterrupted")
    assert len(want) == 5 and {len(v) for v in want.values()} == {5}  # the grid file's paper_rounds
    assert records(archive) == want
    assert not list(archive.rglob(METRICS)) and len(list(archive.rglob(CONFIG))) == 5  # finished: gzipped records


def test_plan_counts_each_cells_client_steps(monkeypatch):
    monkeypatch.setattr(paper_scale_module, "paper_counts", lambda spec: (8, 2))
    spec = paper_scale(declared_spec(8, 2))
    sizes = [len(c.train) for c in load_dataset("synthetic", 0, num_clients=3, samples_per_client=48, num_classes=4,
                                                   size=8).clients]
    per_round = sum(2 * (n // 16) for n in sizes)  # 2 local epochs of full batches of 16 (the last one dropped)
    assert driver.client_steps(spec) == 10 * 8 * per_round  # 10 cells, all clients every round
    assert driver.scale_text(spec) == "8 x 2"


def test_a_call_skips_finished_grids_and_grids_the_bundle_lacks(tmp_path, monkeypatch, capsys, tiny_grid):
    monkeypatch.setattr(paper_scale_module, "paper_counts", lambda spec: (3, 1))
    grid = write_grid(tmp_path)
    spec = paper_scale(declared_spec(3, 1))
    export_bundle(cell_federations(spec)[:1], tmp_path / "bundle", build_dataset)
    code = driver.run_slot(200, tmp_path / "out", [str(grid)], "cpu", tmp_path / "results", tmp_path / "runs",
                           str(tmp_path / "bundle"))
    out = capsys.readouterr().out
    assert code == 2 and "paper_scale: tiny-paper-scale: skipped: the data bundle" in out
    assert "lacks 4 federation(s) it loads" in out and "fedaug data export" in out
    with tarfile.open(tmp_path / "out" / "paper_scale.tar.gz") as tar:
        assert tar.getmembers() == []  # nothing touched
    results = tmp_path / "results" / "tiny-paper-scale"
    shutil.copytree(tiny_grid, results)  # stand-in runs where the variant's cells would be: not the variant's
    for seed in (2, 3, 4):
        for method in ("fedavg", "fedavg-lr-0.2"):
            shutil.copytree(next((tiny_grid / "default" / method / "seed0").iterdir()).parent,
                            results / "default" / method / f"seed{seed}")
    assert driver.finished(spec, results) == (10, 10)
    assert driver.run_slot(200, tmp_path / "out", [str(grid)], "cpu", tmp_path / "results", tmp_path / "runs",
                           None) == 0
    assert "paper_scale: tiny-paper-scale: finished in" in capsys.readouterr().out
