"""``fedaug compare`` and ``fedaug report`` on the command line: files, output, exit codes, messages."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from fedaug.cli.main import main
from fedaug.report import deadline
from fedaug.report.grid import load_grid, parse_grid
from fedaug.report.table import write_tables
from tests.report.conftest import TickClock, records_by_cell, tiny_grid_raw
from tests.report.test_runner import strip, summaries

TINY = ["data.name=synthetic", "data.options={num_clients=3, samples_per_client=32, num_classes=4, size=8}",
        "model.options.width=8", "train.rounds=2", "train.local_steps=1", "train.batch_size=16", "threads=1"]


def write_grid(tmp_path, seeds=(0, 1)):
    """The tiny test grid (tests/report/conftest.py) as a grid file."""
    path = tmp_path / "tiny.toml"
    path.write_text(GRID.format(seeds=list(seeds)))
    return path


GRID = """# a tiny grid
description = "tiny test grid"
kind = "stand-in"
seeds = {seeds}

[common]
threads = 1
checkpoint_every = 1
data = {{name = "synthetic", options = {{num_clients = 3, samples_per_client = 48, num_classes = 4, size = 8}}}}
model = {{name = "small_cnn", options = {{width = 8}}}}
train = {{rounds = 3, local_steps = 2, batch_size = 16, lr = 0.05}}

[methods.FedAvg]

[methods."FedAvg lr 0.2"]
train.lr = 0.2
"""


def test_the_grid_file_is_the_test_grid(tmp_path):
    assert load_grid(str(write_grid(tmp_path))).methods == parse_grid(tiny_grid_raw(), "tiny").methods
    assert load_grid(str(write_grid(tmp_path))).common == parse_grid(tiny_grid_raw(), "tiny").common


def test_compare_grid_file_writes_the_tables_and_reruns_nothing(tmp_path, capsys):
    grid = write_grid(tmp_path, seeds=[0])
    out = tmp_path / "out"
    assert main(["compare", str(grid), "--out", str(out), "--set", "train.rounds=2"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(": ran in ") == 2 and "[2/2] default | FedAvg lr 0.2 | seed 0: ran" in captured.err
    assert "| FedAvg | 1 |" in captured.out and "| FedAvg lr 0.2 | 1 |" in captured.out and "n/a (n=1)" in captured.out
    assert captured.out.rstrip().endswith(f"{out / 'table.json'}")
    rows = list(csv.DictReader((out / "table.csv").open()))
    summary = json.loads((out / "table.json").read_text())
    assert float(rows[0]["final_mean"]) == summary["settings"]["default"]["methods"]["FedAvg"]["final"]["mean"]
    assert summary["grid"]["overrides"] == ["train.rounds=2"]
    assert main(["compare", str(grid), "--out", str(out), "--set", "train.rounds=2", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("done before") == 2 and json.loads(captured.out) == summary
    log = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert [entry["cells"] for entry in log] == [{"ran": 2}, {"done before": 2}]
    assert log[0]["command"] == f"fedaug compare {grid} --jobs 1 --set train.rounds=2" and not log[0]["failed"]
    assert log[0]["wall_s"] > 0


def test_compare_from_the_command_line_then_report(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["compare", "--method", "A", "--method", "B", "train.lr=0.2", "--seeds", "0", "1", "--set", *TINY,
            "--baseline", "B", "--out", str(out), "-q"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "| A | 2 |" in captured.out and "Δ final vs B" in captured.out
    assert sorted(p.relative_to(out).as_posix().rsplit("-", 2)[0] for p in out.glob("default/*/seed*/*-*")) == [
        "default/a/seed0/a", "default/a/seed1/a", "default/b/seed0/b", "default/b/seed1/b"]
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"html: {out / 'report' / 'report.html'}", f"markdown: {out / 'report' / 'report.md'}",
                       f"json: {out / 'report' / 'report.json'}"]
    assert "| B | 2 |" in (out / "report" / "report.md").read_text()
    runs = sorted(out.glob("default/*/seed*/*-*"))
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "loose")]) == 0
    assert "| a | 2 |" in (tmp_path / "loose" / "report.md").read_text()


def test_table_only_runs_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", str(write_grid(tmp_path)), "--out", str(out), "--table-only"]) == 0
    assert "| FedAvg | 0 | not run |" in capsys.readouterr().out
    assert not list(out.glob("default/*/seed*/*"))
    assert "Not included (4 cells not finished)" in (out / "table.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["compare"], "give a grid file (fedaug list grids) or at least one --method LABEL"),
    (["compare", "GRID", "--method", "A"], "give a grid file or --method on the command line, not both"),
    (["compare", "--method", "A", "--base", "digit4"], "'base' = 'digit4' is neither a preset nor a TOML file"),
    (["compare", "--method", "A", "method.augs=[fedfaa]"], "method 'A': unknown method 'fedfaa'"),
    (["compare", "--method", "A", "--jobs", "99"], "--jobs must be between 1 and the"),
    (["compare", "nogrid"], "'nogrid' is neither a shipped grid nor a grid file"),
    (["compare", "GRID", "--only-methods", "FedAvg lr 0.3"],
     "--only-methods: 'FedAvg lr 0.3' is not a method of grid 'tiny'; choose from 'FedAvg', 'FedAvg lr 0.2'"),
    (["compare", "GRID", "--only-settings", "half"], "--only-settings: 'half' is not a setting of grid 'tiny'"),
    (["compare", "--method", "A", "--only-methods", "A"], "--only-methods and --only-settings pick from a grid file"),
    (["compare", "GRID", "--time-limit", "9x"], "--time-limit '9x' is not a duration; write whole hours, minutes "
                                                "and seconds with their units in that order, e.g. 90s, 9m, 2h or 1h30m"),
    (["compare", "GRID", "--time-limit", "5s"], "--time-limit '5s' leaves no time to train"),
    (["compare", "GRID", "--time-limit", "9m", "--table-only"], "--time-limit limits the cells' training, and "
                                                                "--table-only trains none: drop one of them"),
    (["compare", "GRID", "--time-limit", "9m", "--ray", "local"], "with --ray the cluster runs them: drop --time-limit"),
    (["report", "a", "b"], "give --out when reporting on several run directories"),
    (["report", "nowhere"], "'nowhere' is neither a run directory"),
])
def test_errors_exit_2_with_the_message(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "GRID" in args:
        args[args.index("GRID")] = str(write_grid(tmp_path))
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_only_methods_adds_seeds_to_part_of_a_grid_and_reuses_the_whole_grids_runs(tmp_path, capsys):
    grid = write_grid(tmp_path, seeds=[0])
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["compare", str(grid), "--out", str(whole), "-q"]) == 0
    args = ["compare", str(grid), "--only-methods", "FedAvg", "--seeds", "0", "1", "--out", str(part),
            "--reuse", str(whole)]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "default | FedAvg | seed 0: reused" in err and "default | FedAvg | seed 1: ran" in err
    assert "FedAvg lr 0.2" not in err
    summary = json.loads((part / "table.json").read_text())
    assert list(summary["settings"]["default"]["methods"]) == ["FedAvg"]
    logged = json.loads((part / "invocations.jsonl").read_text().splitlines()[-1])["command"]
    assert "--seeds 0 1 --only-methods 'FedAvg'" in logged


def test_a_failing_cell_exits_2_after_writing_the_table(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["compare", "--method", "A", "train.participation=0.01", "--set", *TINY, "--out", str(out), "-q"]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "cell default | A | seed 0 failed: train.participation=0.01 samples 0 of 3 clients" in captured.err
    assert "| A | 0 | not run |" in captured.out and (out / "table.md").is_file()


def test_list_grids_and_help(capsys):
    assert main(["list", "grids"]) == 0
    assert capsys.readouterr().out.startswith("grids:\n")
    for sub in ("compare", "report"):
        with pytest.raises(SystemExit) as info:
            main([sub, "--help"])
        assert info.value.code == 0 and f"usage: fedaug {sub}" in capsys.readouterr().out


def test_keep_going_logs_every_cell_of_the_failed_invocation(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["compare", "--method", "A", "train.participation=0.01", "--method", "B", "--set", *TINY,
            "--out", str(out), "-q", "--keep-going"]
    assert main(args) == 2
    assert "cell default | A | seed 0 failed: train.participation=0.01 samples 0 of 3 clients" in capsys.readouterr().err
    (log,) = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert log["failed"] and log["cells"] == {"failed": 1, "ran": 1} and log["command"].endswith("--keep-going")


def numbers_of(value):
    """``value`` (a table.json's nest) without its wall times (``seconds``: no two runs take the same) and the
    paths of its runs (``run_dirs``)."""
    if isinstance(value, dict):
        return {k: numbers_of(v) for k, v in value.items() if k not in ("seconds", "run_dirs")}
    return [numbers_of(v) for v in value] if isinstance(value, list) else value


def uninterrupted_table(tiny_grid, tmp_path):
    """The ``settings`` of the table of the uninterrupted tiny grid (tabulated in a copy): :func:`numbers_of`."""
    shutil.copytree(tiny_grid, tmp_path / "ref")
    return numbers_of(json.loads(write_tables(tmp_path / "ref")["json"].read_text())["settings"])


def test_a_time_limited_grid_exits_75_and_the_same_command_continues_to_the_uninterrupted_grid(
        tiny_grid, tmp_path, capsys, monkeypatch):
    """A scheduler's loop: the same command until it exits 0. The clock's readings (:class:`TickClock`) make it
    independent of speed: the command reads 1 (the limit: 19 s, so the deadline less its 10 s reserve is 10), the
    first cell starts at 3 and ends its rounds at 5 and 6, the second starts at 7 (its estimate, 1 s x 1.5, fits)
    and, after its round 1 at 9, would end round 2 past 10: it stops there; the others are not started."""
    monkeypatch.setattr(deadline, "time", SimpleNamespace(time=TickClock()))
    grid, out = write_grid(tmp_path), tmp_path / "out"
    args = ["compare", str(grid), "--out", str(out), "-q", "--time-limit", "19s"]
    assert main(args) == 75
    captured = capsys.readouterr()
    assert captured.err == (
        "fedaug compare: stopped at the time limit (--time-limit 19s): 1 of 4 cells finished, 1 stopped (default | "
        "FedAvg lr 0.2 | seed 0 at round 1 of 3), 2 not started; their checkpoints are saved. Exit status 75: "
        f"continue with the same command, in the same directory ({os.getcwd()}):\n"
        f"  fedaug compare {grid} --out {out} -q --time-limit 19s\n")
    assert "Not included (3 cells not finished): " in captured.out  # the stopped cell is not finished
    missing = json.loads((out / "table.json").read_text())["missing"]
    assert [m.split(" (")[0] for m in missing] == ["default | FedAvg lr 0.2 | seed 0: unfinished",
                                                   "default | FedAvg | seed 1: not started",
                                                   "default | FedAvg lr 0.2 | seed 1: not started"]
    (log,) = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert log["cells"] == {"not started": 2, "ran": 1, "stopped": 1} and log["time_limit"] == "19s"
    assert log["stopped"] == [{"cell": "default | FedAvg lr 0.2 | seed 0", "round": 1, "rounds": 3}]
    assert log["command"].endswith("--jobs 1 --time-limit 19s") and not log["failed"]
    statuses = [75]
    while statuses[-1] == 75 and len(statuses) < 10:
        statuses.append(main(args))
    assert statuses == [75] * 5 + [0]  # each invocation trains what fits
    logged = [json.loads(line)["cells"] for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert logged[1:] == [{"done before": 1, "not started": 1, "resumed": 1, "stopped": 1},
                          {"done before": 2, "not started": 1, "stopped": 1},
                          {"done before": 2, "resumed": 1, "stopped": 1}, {"done before": 3, "stopped": 1},
                          {"done before": 3, "resumed": 1}]
    assert records_by_cell(out) == records_by_cell(tiny_grid) and len(records_by_cell(out)) == 4
    assert {k: strip(v) for k, v in summaries(out).items()} == {k: strip(v) for k, v in summaries(tiny_grid).items()}
    assert numbers_of(json.loads((out / "table.json").read_text())["settings"]) == uninterrupted_table(
        tiny_grid, tmp_path)


@pytest.mark.filterwarnings("ignore:run directory .* ended without releasing it:UserWarning")  # the killed cell's
def kill_at_first_checkpoint(args: list[str], out) -> None:
    """Run ``fedaug ARGS`` in a process and SIGKILL it (no handler runs) once a cell under ``out`` has a checkpoint."""
    proc = subprocess.Popen([sys.executable, "-m", "fedaug", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    give_up = time.monotonic() + 300
    while not list(out.glob("*/*/seed*/*/checkpoints/round_*.pt")) and proc.poll() is None:
        assert time.monotonic() < give_up, "no checkpoint within 300 s"
        time.sleep(0.05)
    proc.kill()
    assert proc.wait() == -9, proc.stderr.read()


def test_a_killed_compare_then_the_same_command_equals_the_uninterrupted_grid(tiny_grid, tmp_path, capsys):
    grid, out = write_grid(tmp_path), tmp_path / "out"
    args = ["compare", str(grid), "--out", str(out), "-q"]
    kill_at_first_checkpoint(args, out)
    assert len(summaries(out)) < 4
    assert main(args) == 0
    assert records_by_cell(out) == records_by_cell(tiny_grid) and len(records_by_cell(out)) == 4
    assert {k: strip(v) for k, v in summaries(out).items()} == {k: strip(v) for k, v in summaries(tiny_grid).items()}
    assert numbers_of(json.loads((out / "table.json").read_text())["settings"]) == uninterrupted_table(
        tiny_grid, tmp_path)
