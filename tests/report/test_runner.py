"""Running grids: layout, skipping finished cells, exact resume, parallel workers, locks, failures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from pathlib import Path

import pytest
import torch

from fedaug.config.load import dump_toml, parse_config, read_toml
from fedaug.core.errors import ConfigError, FedaugError
from fedaug.core.runtime import available_cores
from fedaug.engine.records.rundir import CONFIG, SUMMARY
from fedaug.report.archive import archive_grid
from fedaug.report.grid import load_grid
from fedaug.report.runner import (
    GRID_FILE, CellError, claim, config_key, config_mismatch, find_run, finished_runs, plan, run_cell, run_grid,
)
from tests.report.conftest import TickClock, records_by_cell, tiny_spec


#: tests that run two jobs or two workers at once: the runner refuses to share fewer cores (docs/engine.md)
two_cores = pytest.mark.skipif(available_cores() < 2, reason="two jobs or workers need two cores: the runner "
                               "refuses to oversubscribe fewer (run without taskset -c N)")


def summaries(out):
    """(setting, method, seed dir) -> summary of every finished cell under ``out``."""
    return {p.relative_to(out).parts[:3]: json.loads(p.read_text()) for p in out.glob(f"*/*/*/*/{SUMMARY}")}


def strip(s):
    return {k: v for k, v in s.items() if k != "run_dir"}


class Heard:
    """A grid watch (``run_grid(watch=...)``) and ``on_done`` that record what they hear, in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def planned(self, cells, scheduler, jobs):
        self.events.append(("planned", len(cells), scheduler, jobs))

    def connected(self, cluster, jobs):
        self.events.append(("connected", cluster, jobs))

    def started(self, label):
        self.events.append(("started", label))

    def round_done(self, label, update):
        self.events.append(("round", label, update.round, update.total))

    def done(self, k, n, outcome):
        self.events.append(("done", outcome.cell.label))

    def of(self, label):
        """The events of one cell, in order."""
        return [e[0] if e[0] != "round" else e[2:] for e in self.events if len(e) > 1 and e[1] == label]


def heard_every_round_before_the_outcome(heard: Heard, outcomes, jobs: int) -> None:
    assert heard.events[0] == ("planned", len(outcomes), f"--jobs {jobs}", jobs)
    for o in outcomes:  # each cell's start, its 3 rounds, then its outcome (from worker processes: via a queue)
        assert heard.of(o.cell.label) == ["started", (1, 3), (2, 3), (3, 3), "done"]


def test_layout_one_run_directory_per_cell(tiny_grid):
    got = summaries(tiny_grid)
    assert sorted(got) == [("default", m, f"seed{s}") for m in ("fedavg", "fedavg-lr-0.2") for s in (0, 1)]
    meta = json.loads((tiny_grid / GRID_FILE).read_text())
    assert meta["methods"] == ["FedAvg", "FedAvg lr 0.2"] and meta["seeds"] == [0, 1] and meta["kind"] == "stand-in"
    run = find_run(tiny_grid / "default" / "fedavg-lr-0.2" / "seed1")
    cfg = (run / "config.toml").read_text()
    assert "seed = 1" in cfg and "lr = 0.2" in cfg and 'name = "fedavg-lr-0.2"' in cfg
    assert run.name.startswith("fedavg-lr-0.2-")


def test_finished_cells_are_not_run_again(tiny_grid, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(tiny_grid, out)
    before = summaries(out)
    seen = []
    run_grid(tiny_spec(), out, on_done=lambda k, n, o: seen.append((k, n, o.status)))
    assert seen == [(k, 4, "done before") for k in range(1, 5)]
    assert summaries(out) == before and len(list(out.glob("*/*/seed*/*-*"))) == 4


def test_an_interrupted_cell_resumes_to_the_uninterrupted_numbers(tiny_grid, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(tiny_grid, out)
    run = find_run(out / "default" / "fedavg" / "seed0")
    want = json.loads((run / SUMMARY).read_text())
    # what a kill after round 2 leaves: no summary, no round-3 checkpoint or record
    (run / SUMMARY).unlink()
    (run / "checkpoints" / "round_000003.pt").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:2]))
    statuses = [o.status for o in run_grid(tiny_spec(), out)]
    assert statuses.count("resumed") == 1 and statuses.count("done before") == 3
    assert strip(json.loads((run / SUMMARY).read_text())) == strip(want)
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_an_edited_grid_does_not_mix_with_stale_cells(tiny_grid, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(tiny_grid, out)
    edited = tiny_spec(common={**tiny_spec().common, "train": {"rounds": 3, "local_steps": 2, "batch_size": 16,
                                                                "lr": 0.07}})
    with pytest.raises(FedaugError, match=r"cell default \| FedAvg \| seed 0 failed: '.*seed0/fedavg-.*' was run with a "
                                          r"different config \(train.lr differ\); delete that directory"):
        run_grid(edited, out)


def test_reuse_copies_finished_runs_with_equal_configs_and_trains_the_rest(tiny_grid, tmp_path):
    # another grid with one method in common (same config under another label) and one new method
    other = tiny_spec(methods={"Baseline": {}, "FedAvg lr 0.1": {"train": {"lr": 0.1}}})
    out = tmp_path / "other"
    outcomes = {(o.cell.method, o.cell.seed): o for o in run_grid(other, out, reuse=tiny_grid)}
    assert {k: o.status for k, o in outcomes.items()} == {("Baseline", 0): "reused", ("Baseline", 1): "reused",
                                                           ("FedAvg lr 0.1", 0): "ran", ("FedAvg lr 0.1", 1): "ran"}
    for seed in (0, 1):
        source = find_run(tiny_grid / "default" / "fedavg" / f"seed{seed}")
        copy = find_run(out / "default" / "baseline" / f"seed{seed}")
        assert copy.name == source.name and str(copy) == outcomes[("Baseline", seed)].run_dir
        assert (copy / "metrics.jsonl").read_bytes() == (source / "metrics.jsonl").read_bytes()
    assert not list(out.rglob("*.partial"))
    # a second pass finds every cell finished; the names differ but the configs agree
    assert {o.status for o in run_grid(other, out, reuse=tiny_grid)} == {"done before"}


def test_config_key_ignores_name_threads_and_out_dir_only(tiny_grid):
    runs = finished_runs(tiny_grid)
    assert len(runs) == 4  # 2 methods x 2 seeds, all different
    raw = tiny_spec().raw("default", "FedAvg", 0)
    same = {**raw, "name": "x", "threads": 2, "out_dir": "elsewhere"}
    assert config_key(same) == config_key(raw) in runs
    assert config_key({**raw, "seed": 5}) != config_key(raw)


def aug_spec(aug: str, **options):
    """The tiny grid with one method, FedAvg + ``aug`` with ``options``, at seed 0."""
    return tiny_spec(seeds=[0], methods={aug: {"method": {"augs": [aug], "options": {aug: options}}}})


def fedfa_spec(**fedfa_options):
    return aug_spec("fedfa", **fedfa_options)


def reused(spec, out, root):
    return [c.reuse for c in plan(spec, out, reuse=finished_runs(root))]


def test_reuse_matches_the_kernel_mode_and_never_guesses_an_unrecorded_one(tmp_path):
    source = tmp_path / "source"
    run_grid(fedfa_spec(), source)  # the default mode, "off", recorded in its config.toml
    (run,) = finished_runs(source).values()
    assert read_toml(run / CONFIG)["method"]["options"]["fedfa"] == {"kernel": "off"}
    out = tmp_path / "out"
    assert reused(fedfa_spec(), out, source) == [run]
    assert reused(fedfa_spec(kernel="off"), out, source) == [run]  # the same mode, written out
    assert reused(fedfa_spec(kernel="on"), out, source) == [None]  # another path: trained again
    # a run from before the option: it took the kernel if one built, which cannot be known
    raw = read_toml(run / CONFIG)
    del raw["method"]["options"]["fedfa"]["kernel"]
    (run / CONFIG).write_text(dump_toml(raw))
    assert reused(fedfa_spec(), out, source) == reused(fedfa_spec(kernel="on"), out, source) == [None]
    raw["method"]["options"]["fedfa"]["kernel"] = "on"  # its owner says how it ran
    (run / CONFIG).write_text(dump_toml(raw))
    assert reused(fedfa_spec(kernel="on"), out, source) == [run] and reused(fedfa_spec(), out, source) == [None]


def test_a_run_from_before_vfdas_default_changed_is_reused_as_the_variance_reading(tmp_path):
    source = tmp_path / "source"
    run_grid(aug_spec("vfda", noise_scale="variance"), source)
    (run,) = finished_runs(source).values()
    raw = read_toml(run / CONFIG)
    del raw["method"]["options"]["vfda"]["noise_scale"]  # as a run made before the option was recorded
    (run / CONFIG).write_text(dump_toml(raw))
    out = tmp_path / "out"
    assert reused(aug_spec("vfda", noise_scale="variance"), out, source) == [run]  # what it ran with, known
    assert reused(aug_spec("vfda"), out, source) == reused(aug_spec("vfda", noise_scale="std"), out, source) == [None]


def test_a_grid_cell_from_before_the_kernel_option_asks_for_its_mode(tmp_path):
    out = tmp_path / "g"
    run_grid(fedfa_spec(), out)
    (outcome,) = run_grid(fedfa_spec(), out)
    assert outcome.status == "done before"
    run = find_run(out / "default" / "fedfa" / "seed0")
    raw = read_toml(run / CONFIG)
    del raw["method"]["options"]["fedfa"]["kernel"]
    (run / CONFIG).write_text(dump_toml(raw))
    with pytest.raises(FedaugError, match=r"was run with a different config \(method\.options\.fedfa\.kernel differ; "
                                          r"method\.options\.fedfa\.kernel is not recorded \(the run predates it; it "
                                          r"ran with kernel = 'auto': .*\); write the value it ran with into its "
                                          r"config\.toml, or delete that directory"):
        run_grid(fedfa_spec(), out)


@two_cores
def test_parallel_workers_give_the_same_numbers(tiny_grid, tmp_path):
    spec = tiny_spec(seeds=[1])
    heard = Heard()
    outcomes = run_grid(spec, tmp_path / "par", jobs=2, watch=heard, on_done=heard.done)
    assert sorted(o.status for o in outcomes) == ["ran", "ran"]
    heard_every_round_before_the_outcome(heard, outcomes, jobs=2)
    par = summaries(tmp_path / "par")
    seq = {k: v for k, v in summaries(tiny_grid).items() if k[2] == "seed1"}
    assert len(par) == len(seq) == 2
    assert {k: strip(v) for k, v in par.items()} == {k: strip(v) for k, v in seq.items()}


def test_threads_are_capped_so_that_jobs_times_threads_fit_the_cores(tmp_path):
    spec = tiny_spec(common={**tiny_spec().common, "threads": 4})
    assert {c.raw["threads"] for c in plan(spec, tmp_path, jobs=2, cores=8)} == {4}
    assert {c.raw["threads"] for c in plan(spec, tmp_path, jobs=2, cores=2)} == {1}
    assert {c.raw["threads"] for c in plan(spec, tmp_path, jobs=1, cores=3)} == {3}
    cells = plan(spec, tmp_path, jobs=1, cores=2)
    assert [(c.seed, c.method) for c in cells] == [(0, "FedAvg"), (0, "FedAvg lr 0.2"), (1, "FedAvg"), (1, "FedAvg lr 0.2")]
    with pytest.raises(ConfigError, match="--jobs must be between 1 and the 2 available cores, got 3"):
        plan(spec, tmp_path, jobs=3, cores=2)


def test_jobs_workers_and_threads_share_the_cores_without_oversubscribing(tmp_path):
    """The rule of docs/engine.md, "Workers": jobs x workers x threads <= cores, threads capped first."""
    spec = tiny_spec(common={**tiny_spec().common, "threads": 4, "workers": 2})
    assert {c.raw["threads"] for c in plan(spec, tmp_path, jobs=2, cores=8)} == {2}
    assert {c.raw["threads"] for c in plan(spec, tmp_path, jobs=1, cores=8)} == {4}
    assert {c.raw["threads"] for c in plan(spec, tmp_path, jobs=1, cores=2)} == {1}
    for jobs, cores in ((2, 8), (1, 8), (1, 2), (3, 6)):
        for c in plan(spec, tmp_path, jobs=jobs, cores=cores):
            assert jobs * c.raw["workers"] * c.raw["threads"] <= cores
    with pytest.raises(ConfigError, match=r"--jobs 2 x workers 2 = 4 processes would share 2 cores; lower --jobs, "
                                          r"or workers \(--set workers=1\)"):
        plan(spec, tmp_path, jobs=2, cores=2)


@two_cores
def test_a_grid_on_two_workers_equals_the_grid_on_one(tmp_path, tiny_grid):
    """Each cell's worker processes start from the grid's own process (one job: no daemonic parent)."""
    spec = tiny_spec(seeds=[1], common={**tiny_spec().common, "workers": 2, "threads": 1})
    heard = Heard()
    outcomes = run_grid(spec, tmp_path / "two", watch=heard, on_done=heard.done)
    assert sorted(o.status for o in outcomes) == ["ran", "ran"]
    heard_every_round_before_the_outcome(heard, outcomes, jobs=1)
    two = summaries(tmp_path / "two")
    one = {k: v for k, v in summaries(tiny_grid).items() if k[2] == "seed1"}
    assert all(v["environment"].pop("workers") == 2 for v in two.values())  # recorded where it ran, and how
    assert {k: strip(v) for k, v in two.items()} == {k: strip(v) for k, v in one.items()}


def test_locks(tmp_path):
    lock = tmp_path / "seed0.lock"
    assert claim(lock) and not claim(lock)  # held by this live process
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(dead.stdout.strip())
    assert claim(lock) and lock.read_text() == str(os.getpid())  # a dead holder's lock is taken over
    cell = plan(tiny_spec(), tmp_path / "g", cores=2)[0]
    cell.dir.mkdir(parents=True)
    (cell.dir / ".lock").write_text(str(os.getppid()))
    assert run_cell(cell).status == "busy" and find_run(cell.dir) is None


def test_a_failing_cell_stops_the_grid_with_its_message(tmp_path):
    common = tiny_spec().common
    spec = tiny_spec(common={**common, "data": {"name": "synthetic", "options": {"num_clients": 0}}})
    seen = []
    with pytest.raises(FedaugError, match=r"cell default \| FedAvg \| seed 0 failed: synthetic.num_clients must be >= 1"):
        run_grid(spec, tmp_path / "g", on_done=lambda k, n, o: seen.append(o.status))
    assert seen == ["failed"]
    assert not list((tmp_path / "g").glob("*/*/*/.lock"))


def test_keep_going_runs_the_other_cells_then_names_every_failure(tmp_path):
    bad = {"data": {"options": {"num_clients": 0}}}
    spec = tiny_spec(methods={"Bad": bad, "FedAvg": {}, "Worse": bad}, seeds=[0])
    seen = []
    with pytest.raises(CellError, match=r"^2 cells failed: default \| Bad \| seed 0: synthetic.num_clients must be >= 1, got 0; "
                                        r"default \| Worse \| seed 0: synthetic.num_clients") as info:
        run_grid(spec, tmp_path / "g", on_done=lambda k, n, o: seen.append(o.status), keep_going=True)
    assert seen == ["failed", "ran", "failed"]
    assert [o.status for o in info.value.outcomes] == seen
    assert find_run(tmp_path / "g" / "default" / "fedavg" / "seed0") is not None


def test_a_cell_whose_first_round_would_pass_the_time_limit_is_not_started(tmp_path):
    """The clock's readings (:class:`TickClock`): 1 sets the reserve (10 s: the limit less it is 7), 2 lets the first
    cell start, 3 starts its watch, 4 and 5 end its rounds 1 and 2 (each 1 s, 1.5 s with the margin: it finishes);
    at 6 the next cell's start-up and first round, estimated by the first cell's (1 s), would end at 7.5: past 7."""
    seen = []
    outcomes = run_grid(tiny_spec(seeds=[0]), tmp_path / "g", deadline=17.0, clock=TickClock(),
                        on_done=lambda k, n, o: seen.append((k, n, o.status)))
    assert seen == [(1, 2, "ran"), (2, 2, "not started")]
    assert outcomes[0].first_round_s == 1.0 and outcomes[1].round is None
    assert not (tmp_path / "g" / "default" / "fedavg-lr-0.2" / "seed0").exists()  # not started: nothing written


def test_past_the_limit_no_cell_starts_and_each_is_told_as_it_stands(tiny_grid, tmp_path):
    """The deadline less its reserve is already past (readings 1, 2: 5 - 10 < 2): nothing trains or is written;
    finished cells are "done before", an interrupted one is "not started" at its newest checkpoint."""
    out = tmp_path / "g"
    shutil.copytree(tiny_grid, out)
    run = find_run(out / "default" / "fedavg" / "seed1")
    (run / SUMMARY).unlink()
    (run / "checkpoints" / "round_000003.pt").unlink()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    outcomes = run_grid(tiny_spec(), out, deadline=5.0, clock=TickClock())
    assert [(o.cell.label, o.status, o.round, o.detail()) for o in outcomes] == [
        ("default | FedAvg | seed 0", "done before", None, ""),
        ("default | FedAvg lr 0.2 | seed 0", "done before", None, ""),
        ("default | FedAvg | seed 1", "not started", 2, " (saved at round 2 of 3)"),
        ("default | FedAvg lr 0.2 | seed 1", "done before", None, "")]
    assert outcomes[2].run_dir == str(run)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != GRID_FILE} == {
        p: t for p, t in before.items() if p.name != GRID_FILE}


@two_cores
def test_a_time_limited_grid_in_worker_processes_continues_to_the_uninterrupted_records(tiny_grid, tmp_path):
    """Both cells start (readings 1-3 in this process: the reserve, two starts, all before 13 - 10 = 3); each worker
    reads its copy of the clock (at 3 or later) to start its watch and after round 1, when the next round, x 1.5,
    would pass 3: both stop at round 1 of 3, checkpointed, and the same call without a limit continues them."""
    spec, out = tiny_spec(seeds=[1]), tmp_path / "par"
    outcomes = run_grid(spec, out, jobs=2, deadline=13.0, clock=TickClock())
    assert sorted((o.status, o.round, o.rounds) for o in outcomes) == [("stopped", 1, 3)] * 2
    assert all((find_run(o.cell.dir) / "checkpoints" / "round_000001.pt").is_file() for o in outcomes)
    assert not summaries(out)
    assert sorted(o.status for o in run_grid(spec, out, jobs=2)) == ["resumed", "resumed"]
    want = {k: v for k, v in records_by_cell(tiny_grid).items() if k[2] == "seed1"}
    assert records_by_cell(out) == want and len(want) == 2
    seq = {k: strip(v) for k, v in summaries(tiny_grid).items() if k[2] == "seed1"}
    assert {k: strip(v) for k, v in summaries(out).items()} == seq


def test_a_time_limit_is_refused_with_ray(tmp_path):
    from fedaug.report.ray_cells import RayCells

    with pytest.raises(ConfigError, match=r"--time-limit stops cells by this machine's clock.*with --ray the cluster "
                                          r"runs them: drop --time-limit .*or run the grid here with --jobs N"):
        run_grid(tiny_spec(), tmp_path / "g", ray=RayCells(), deadline=1e12)
    assert not (tmp_path / "g").exists()


# --- train.cuda_graph and data.on_device default to "auto" (issue 63): what a grid compares ----------------------

#: the key of tiny_spec's default | FedAvg | seed 0 cell as fedaug computed it before train.cuda_graph and
#: data.on_device defaulted to "auto" (main at 2d0371d): on a CPU the keys of every grid stay as they were
KEY_BEFORE_AUTO = "78435ecec444ce098b3eca5a3a4a208dd5a1829ea1114a4f4adb26bc4c5cac68"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cpu_here(monkeypatch):
    """This machine as one without CUDA, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def cuda_here(monkeypatch):
    """This machine as one with CUDA (nothing runs on it: the comparisons only ask where "auto" resolves)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def stored_as(raw, cuda_graph, on_device=False):
    """``raw`` as a run directory's config.toml holds it, with these values (``None``: the key absent, as in a run
    written before it existed)."""
    out = {**raw, "train": {**raw.get("train", {})}, "data": {**raw.get("data", {})}}
    for table, key, value in (("train", "cuda_graph", cuda_graph), ("data", "on_device", on_device)):
        if value is not None:
            out[table][key] = value
    return out


def test_on_a_cpu_the_auto_defaults_are_the_experiment_of_runs_stored_before_them(cpu_here):
    cell = tiny_spec().raw("default", "FedAvg", 0)
    cfg = parse_config(cell)
    assert (cfg.train.cuda_graph, cfg.data.on_device) == ("auto", "auto")
    for stored in (stored_as(cell, False), stored_as(cell, None, None), stored_as(cell, "auto", True)):
        assert config_key(stored, stored=True) == config_key(cell) == KEY_BEFORE_AUTO
        assert config_mismatch(stored, cell) == []
    assert config_key(stored_as(cell, True), stored=True) != KEY_BEFORE_AUTO  # true asks for captured steps


@pytest.mark.parametrize(("method", "stored", "same"), [
    ({}, False, False),  # the cell's "auto" captures here, the run stepped eagerly
    ({}, None, False),  # a run written before the key existed stepped eagerly too
    ({}, "auto", True),
    ({}, True, True),  # both capture
    ({"method": {"base": "moon"}}, False, True),  # MOON cannot be captured: "auto" steps eagerly, as false
])
def test_on_a_cuda_machine_train_cuda_graph_counts_as_the_execution_it_resolves_to(cuda_here, method, stored, same):
    cell = {**tiny_spec().raw("default", "FedAvg", 0), **method}
    run = stored_as(cell, stored, on_device=True)  # data.on_device is placement: never a difference
    assert (config_key(run, stored=True) == config_key(cell)) is same
    assert config_mismatch(run, cell) == ([] if same else ["train.cuda_graph"])


def test_a_cuda_machine_tells_how_to_take_runs_that_stepped_eagerly(cuda_here, tiny_grid, tmp_path):
    out = tmp_path / "g"
    shutil.copytree(tiny_grid, out)
    for config in out.rglob(CONFIG):  # as runs written before "auto" on a CPU hold them
        config.write_text(dump_toml(stored_as(read_toml(config), False)))
    with pytest.raises(FedaugError, match=r"was run with a different config \(train\.cuda_graph differ; "
                                          r"train\.cuda_graph counts as the execution it resolves to on this machine: "
                                          r"the run's false gives eager steps, the cell's auto captured steps \(--set "
                                          r"train\.cuda_graph=false takes the run as it is\)\); delete that directory"):
        run_grid(tiny_spec(), out)
    eager = tiny_spec(common={**tiny_spec().common, "train": {**tiny_spec().common["train"], "cuda_graph": False}})
    assert {o.status for o in run_grid(eager, out)} == {"done before"}


def test_an_archived_grid_of_the_repository_is_done_before_under_the_auto_defaults(cpu_here, tmp_path):
    """results/fedfa_table7_digits4 as `fedaug archive` brings it back: its runs store data.on_device = false and
    no train.cuda_graph; `fedaug compare` finds every cell done and trains nothing."""
    archive_grid(ROOT / "results" / "fedfa_table7_digits4", tmp_path / "g")
    outcomes = run_grid(load_grid("fedfa_table7_digits4"), tmp_path / "g")
    assert [o.status for o in outcomes] == ["done before"] * 9
