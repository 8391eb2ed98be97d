"""A grid's cells on Ray (``fedaug compare GRID --ray ADDRESS``, issue 49, Must show 1), on the session's
loopback cluster (tests/ray_cluster.py): every cell equals the local grid's cell record for record, finished
cells are kept and interrupted ones resumed as the local runner does, the same tables are printed, and run
directories shipped back from a node that does not share the output directory equal them too. ``--ray local``
runs the cells on a Ray of the command's own, beside a cluster that ``ray start`` left running (issue 61)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedaug.cli.main import main
from fedaug.core.errors import ConfigError
from fedaug.engine.records.rundir import SUMMARY, RunDir
from fedaug.report.grid import GridSpec, parse_grid, select
from fedaug.report.ray_cells import RayCells, cell_resources, pack_dir, receive, unpack_dir
from fedaug.report.runner import CellOutcome, cell_dir, find_run, plan, run_grid
from tests.cli.test_compare_cmd import write_grid
from tests.engine.test_resume import comparable, summary_numbers
from tests.ray_cluster import WORKER_CPUS, StartedCluster
from tests.report.conftest import tiny_grid_raw, tiny_spec
from tests.report.test_runner import Heard

CELLS = [("FedAvg", 0), ("FedAvg lr 0.2", 0), ("FedAvg", 1), ("FedAvg lr 0.2", 1)]


def interrupt(run: Path, after_round: int) -> None:
    """Make the finished run ``run`` one interrupted after ``after_round`` (its later checkpoints and
    records gone, no summary), as a killed cell leaves it."""
    with RunDir.open(run, write=True) as rd:
        rd.rewind(after_round)
    (run / SUMMARY).unlink()


def copy_cell(src: Path, dst: Path, method: str, seed: int) -> Path:
    """Copy a cell's directory from grid ``src`` to grid ``dst``; the copied run directory."""
    shutil.copytree(cell_dir(src, "default", method, seed), cell_dir(dst, "default", method, seed))
    return find_run(cell_dir(dst, "default", method, seed))


def assert_cells_equal(got: Path, want: Path, cells=CELLS) -> None:
    for method, seed in cells:
        a, b = (find_run(cell_dir(g, "default", method, seed)) for g in (got, want))
        assert comparable(a) == comparable(b), (method, seed)
        assert summary_numbers(a) == summary_numbers(b), (method, seed)


def test_a_grid_on_ray_equals_the_local_grid_cell_by_cell_and_prints_the_same_tables(on_ray, tiny_grid, tmp_path,
                                                                                      capsys):
    grid = write_grid(tmp_path)  # the grid of tiny_grid, as a file
    out = tmp_path / "on_ray"
    done = copy_cell(tiny_grid, out, "FedAvg", 0)  # finished before: kept
    interrupt(copy_cell(tiny_grid, out, "FedAvg lr 0.2", 0), 2)  # interrupted after round 2: resumed
    assert main(["compare", str(grid), "--ray", on_ray.address, "--out", str(out), "-q"]) == 0
    on_ray_tables = capsys.readouterr().out
    assert_cells_equal(out, tiny_grid)
    assert find_run(cell_dir(out, "default", "FedAvg", 0)) == done
    assert len(RunDir(find_run(cell_dir(out, "default", "FedAvg lr 0.2", 0))).rounds()) == 3
    assert json.loads((out / "invocations.jsonl").read_text())["cells"] == {"done before": 1, "ran": 2,
                                                                             "resumed": 1}
    assert not list(out.rglob(".lock")) and not list(out.glob(".ray-token-*"))
    local = tmp_path / "local"
    shutil.copytree(tiny_grid, local)
    assert main(["compare", str(grid), "--out", str(local), "--table-only"]) == 0
    assert without_times(capsys.readouterr().out, local) == without_times(on_ray_tables, out)


def without_times(tables: str, out: Path) -> str:
    """Printed tables with the output directory and the wall-clock column (``time (s/run)``, each table
    row's last cell) left out."""
    assert "| time (s/run) |" in tables
    return re.sub(r"\| [^|]* \|$", "|", tables.replace(str(out), "OUT"), flags=re.M)


def test_run_directories_shipped_back_from_the_nodes_equal_the_local_cells(on_ray, tiny_grid, tmp_path):
    spec = select(tiny_spec(), ["FedAvg"], [])
    out = tmp_path / "shipped"
    interrupt(copy_cell(tiny_grid, out, "FedAvg", 1), 2)
    heard = Heard()
    outcomes = run_grid(spec, out, on_done=heard.done, watch=heard, ray=RayCells(on_ray.address, "shipped"))
    assert sorted((o.cell.seed, o.status) for o in outcomes) == [(0, "ran"), (1, "resumed")]
    # each cell's start and rounds, from its node through Ray's queue, before its outcome; as many cells at once
    # as the cluster's CPUs hold
    # the plan before connecting, then the cluster reached: this process's (connected by on_ray: kept)
    assert heard.events[:2] == [("planned", 2, f"--ray {on_ray.address}", None),
                                ("connected", f"the Ray cluster at {on_ray.address} (CPUs: {WORKER_CPUS}, GPUs: 0)",
                                 WORKER_CPUS)]  # a cell reserves its threads = 1
    ran, resumed = (next(o.cell.label for o in outcomes if o.cell.seed == seed) for seed in (0, 1))
    assert heard.of(ran) == ["started", (1, 3), (2, 3), (3, 3), "done"]
    assert heard.of(resumed) == ["started", (3, 3), "done"]
    assert all(Path(o.run_dir) == find_run(o.cell.dir) for o in outcomes)
    assert_cells_equal(out, tiny_grid, [("FedAvg", 0), ("FedAvg", 1)])
    assert not list(out.rglob(".incoming"))


def with_common(**common) -> GridSpec:
    """The tiny grid with ``common`` added to its common config."""
    raw = tiny_grid_raw()
    raw["common"].update(common)
    return parse_grid(raw, "tiny")


def test_a_cell_reserves_its_threads_or_what_its_ray_table_says(tmp_path):
    cell = plan(tiny_spec(), tmp_path, local=False)[0]
    assert cell.raw["threads"] == 1 and cell_resources(cell) == {"num_cpus": 1, "num_gpus": 0.0}
    wide = plan(with_common(threads=3, workers=2), tmp_path, local=False)[0]
    assert wide.raw["threads"] == 3  # not capped by this machine's cores: Ray reserves them on a node
    assert cell_resources(wide) == {"num_cpus": 6, "num_gpus": 0.0}
    gpu = plan(with_common(ray={"num_cpus": 0.5, "num_gpus": 0.25}), tmp_path, local=False)[0]
    assert cell_resources(gpu) == {"num_cpus": 0.5, "num_gpus": 0.25}
    actors = plan(with_common(fleet="ray", ray={"num_gpus": 1.0}), tmp_path, local=False)[0]
    assert cell_resources(actors) == {"num_cpus": 1, "num_gpus": 0.0}  # its actors reserve the GPUs


def test_a_shipped_run_directory_replaces_the_drivers_copy(tmp_path):
    run = tmp_path / "node" / "fedavg-20260101-000000"
    (run / "ckpt").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("new\n")
    (run / "ckpt" / "round_2.pt").write_bytes(b"\x00\x01")
    (run / "lock").write_text("{}")  # the writer lock stays behind
    cell = plan(tiny_spec(), tmp_path / "grid")[0]
    old = cell.dir / run.name
    old.mkdir(parents=True)
    (old / "metrics.jsonl").write_text("old\n")
    receive(cell, CellOutcome(cell, "resumed", str(old), 1.0), pack_dir(run))
    assert sorted(p.relative_to(old).as_posix() for p in old.rglob("*")) == ["ckpt", "ckpt/round_2.pt", "metrics.jsonl"]
    assert (old / "metrics.jsonl").read_text() == "new\n" and (old / "ckpt" / "round_2.pt").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in cell.dir.iterdir()) == [run.name]


def test_an_archive_cannot_write_outside_its_directory(tmp_path):
    import io
    import tarfile

    blob = io.BytesIO()
    with tarfile.open(fileobj=blob, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(tarfile.OutsideDestinationError):
        unpack_dir(blob.getvalue(), tmp_path / "run")
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--ray", "127.0.0.1:1", "--jobs", "2"], "fedaug: error: --jobs 2 runs cells in processes of this machine; with "
                                              "--ray the cluster runs as many cells at once as its resources allow: "
                                              "drop --jobs\n"),
    (["--ray-files", "shipped"], "fedaug: error: --ray-files shipped says where cells on a Ray cluster write; add "
                                 "--ray [ADDRESS]\n"),
])
def test_ray_options_that_do_not_fit_are_refused(tmp_path, capsys, argv, message):
    assert main(["compare", str(write_grid(tmp_path)), "--out", str(tmp_path / "out"), "-q", *argv]) == 2
    assert capsys.readouterr().err.endswith(message)


def test_an_unknown_way_of_writing_files_is_refused():
    with pytest.raises(ConfigError, match=r"--ray-files must be one of auto, shared, shipped, got 'nfs'"):
        RayCells("auto", "nfs")


def processes_naming(text: str) -> list[int]:
    """The ids of the running processes whose command line contains ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # the process ended meanwhile
            continue
    return found


@pytest.mark.slow
def test_ray_local_starts_a_ray_of_its_own_beside_one_that_ray_start_left_running_and_stops_it(tmp_path):
    pytest.importorskip("ray", reason="needs the ray extra: pip install 'fedaug[ray]' (make setup installs it)")
    grid = write_grid(tmp_path, seeds=[0])  # 2 cells of 3 rounds
    with StartedCluster() as outside:  # where ray.init() without an address finds it (RAY_TMPDIR)
        proc = subprocess.Popen([sys.executable, "-m", "fedaug", "compare", str(grid), "--ray", "local", "--out",
                                 str(tmp_path / "out")], env=outside.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=900)
        finally:
            proc.kill()  # where it ran out of time (it has ended otherwise)
        joined = sorted(p.name for p in (outside.session / "logs").glob(f"*_{proc.pid}.log"))  # its driver's log
        own = [p for p in (outside.root / "ray").glob("session_2*") if p != outside.session]
        deadline = time.monotonic() + 30.0
        while own and processes_naming(own[0].name) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = processes_naming(own[0].name) if own else []
    assert proc.returncode == 0, err
    assert joined == []  # the cluster of 'ray start' saw no driver of the command
    assert len(own) == 1 and left == []  # the command's own Ray: its session here, its processes gone
    lines = err.splitlines()
    assert re.fullmatch(r"compare tiny: 2 cells \(1 setting x 2 methods x 1 seed\), device auto \(\S+ here\), "
                        r"--ray local", lines[0]), lines[:2]
    reached = re.fullmatch(r"compare tiny: --ray local: a Ray started for this command at (\S+) \(CPUs: \d+, GPUs: "
                           r"0\), [12] cells? at once", lines[1])
    assert reached and reached[1] != outside.address, (lines[1], outside.address)
    assert any(line.endswith("(estimated from the rounds so far; --ray local)") for line in lines), lines
    assert "| FedAvg | 1 |" in out
