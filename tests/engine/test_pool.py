"""Worker processes (``workers > 1``, issue "Throughput", Must show 2): the records equal one worker's
at one thread per worker, bit for bit, for every kind of method; a killed run resumes to the same
numbers; a worker that dies ends the run with the client it ran and leaves it resumable."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedaug.config.load import dump_toml
from fedaug.config.schema import RunConfig, validate
from fedaug.core.errors import ConfigError
from fedaug.core.runtime import torch_threads
from fedaug.data.registry import load_dataset
from fedaug.engine.fleet.processes import WorkerDied, _context, expected_cost, pack
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.run import Simulation, build_simulation, resume_experiment, run_experiment
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import Recipe, build_recipe
from tests.conftest import tiny_raw
from tests.engine.pool_helpers import KillOnce, RaiseIn, UnbuildableInWorkers, exit_with_dynamo_imported
from tests.engine.runs import kill_and_resume, start_run, wait_for_rounds
from tests.engine.test_resume import comparable, summary_numbers

#: method -> (base, augs, options): the issue's list (FedBN as the method and as FedAvg's bn="local";
#: VFDA on 2-D features; DP-FedAvg as FedAvg with clipping and noise).
METHODS: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "fedavg": ("fedavg", [], {}),
    "fedbn": ("fedbn", [], {}),
    "fedavg_bn_local": ("fedavg", [], {"fedavg": {"bn": "local"}}),
    "scaffold": ("scaffold", [], {}),
    "fedprox": ("fedprox", [], {"fedprox": {"mu": 0.1}}),
    "moon": ("moon", [], {}),
    "fedfa": ("fedavg", ["fedfa"], {"fedfa": {"kernel": "off"}}),
    "vfda": ("fedavg", ["vfda"], {"vfda": {"kernel": "off"}}),
    "fedrdn": ("fedavg", ["fedrdn"], {}),
    "flea": ("fedavg", ["flea"], {}),
    "fedmix": ("fedavg", ["fedmix"], {}),
    "krum": ("krum", [], {}),
    "dp_fedavg": ("fedavg", [], {"fedavg": {"weighting": "uniform", "clip_norm": 1.0, "noise_multiplier": 0.5}}),
}


def config(workers: int, method: str = "fedavg", **extra: Any) -> RunConfig:
    base, augs, options = METHODS[method]
    raw = tiny_raw(rounds=2, participation=0.67)
    raw["data"]["options"]["num_clients"] = 5  # krum needs n > 2f + 2 uploads
    raw.update(threads=1, workers=workers, method={"base": base, "augs": augs, "options": options}, **extra)
    return validate(raw)


def records(sim: Simulation, rounds: int) -> str:
    """The round records (times left out) with evaluation, as the JSON text a run writes."""
    out = []
    with torch_threads(sim.cfg.threads), sim:
        for r in range(1, rounds + 1):
            rec = sim.run_round(r)
            rec["eval"] = sim.evaluate()
            rec.pop("time")
            out.append(rec)
    return json.dumps(out, sort_keys=True)


@functools.cache
def one_workers_records(method: str) -> str:
    """:func:`records` of ``config(1, method)``'s two rounds: every fleet's reference (worker processes here,
    Ray actors in tests/engine/test_ray_fleet.py), computed once per session."""
    return records(build_simulation(config(1, method)), 2)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_workers_give_one_workers_records_bit_for_bit(method):
    one = one_workers_records(method)
    two = records(build_simulation(config(2, method)), 2)
    assert two == one
    assert '"rejected": []' in one  # nothing was refused: the comparison is of trained rounds


def test_an_attack_scenario_gives_the_same_records_on_two_workers():
    attack = {"attack": {"kind": "scale", "clients": [1], "scale": 50.0}}
    one = records(build_simulation(config(1, **attack)), 2)
    two = records(build_simulation(config(2, **attack)), 2)
    assert two == one and '"attack": {"clients": [1]' in one


def test_more_workers_than_clients_and_three_workers_agree():
    assert records(build_simulation(config(3)), 2) == one_workers_records("fedavg")


def test_a_sigkilled_run_on_two_workers_resumes_to_the_uninterrupted_numbers(tmp_path):
    raw = config(2).to_dict()
    raw["train"]["rounds"] = 6
    raw.update(out_dir=str(tmp_path / "runs"), checkpoint_every=2, name="killed")
    run_dir = kill_and_resume(raw, tmp_path, 3)
    raw.update(out_dir=str(tmp_path / "ref"), workers=1)
    with torch_threads(1):
        _, ref = run_experiment(validate(raw), quiet=True)
    assert comparable(run_dir) == comparable(ref.path)
    assert summary_numbers(run_dir) == summary_numbers(ref.path)


def test_a_worker_killed_mid_round_names_the_client_and_the_run_resumes(tmp_path):
    raw = config(2).to_dict()
    raw["train"]["rounds"] = 4
    raw.update(out_dir=str(tmp_path / "runs"), checkpoint_every=1, name="worker")
    cfg = validate(raw)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    killer = KillOnce(client=3, round=3, marker=str(tmp_path / "killed"))
    recipe = Recipe(FedAvg(), [killer])
    run_dir = RunDir.start(cfg)
    with run_dir, pytest.raises(WorkerDied, match=r"round 3: worker process fedaug-worker-\d \(pid \d+, cpu\) died "
                                                  r"while it ran client 3 \(train\): killed by signal 9 \(SIGKILL\)\. "
                                                  r"The run stops here; .* 'fedaug resume " + str(run_dir.path)):
        Simulation(cfg, data, recipe).run(run_dir)
    assert [r["round"] for r in run_dir.rounds()] == [1, 2]
    assert not _workers_under(os.getpid())  # none left behind
    with torch_threads(1):  # on one worker now: the numbers do not depend on it
        resume_experiment(str(run_dir.path), quiet=True, recipe=recipe, workers=1)  # the marker: it kills no more
    ref = tmp_path / "ref"
    sim = Simulation(validate({**raw, "workers": 1}), data, recipe)
    with torch_threads(1), RunDir.start(validate({**raw, "out_dir": str(ref)})) as ref_dir:
        sim.run(ref_dir)
    assert comparable(run_dir.path) == comparable(ref_dir.path)
    assert summary_numbers(run_dir.path) == summary_numbers(ref_dir.path)


def test_an_error_in_a_worker_is_raised_in_the_server_process(tmp_path):
    cfg = config(2)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    sim = Simulation(cfg, data, Recipe(FedAvg(), [RaiseIn(client=2)]))
    with sim, pytest.raises(ValueError, match="client 2 refuses"):
        for r in (1, 2):
            sim.run_round(r)


def test_a_recipe_that_cannot_be_pickled_is_refused_with_the_fix():
    class Local(RaiseIn):  # defined in a function: the worker processes cannot import it
        name = "local"

    cfg = config(2)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    with pytest.raises(ConfigError, match=r"workers=2 sends the method to worker processes, which needs a picklable "
                                          r"recipe .*define custom components at a module's top level, or set workers=1"):
        Simulation(cfg, data, Recipe(FedAvg(), [Local(client=0)]))


def test_execution_order_is_refused_with_workers():
    cfg = config(2)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    with pytest.raises(ConfigError, match="set workers=1 to choose the order"):
        Simulation(cfg, data, build_recipe("fedavg"), execution_order=lambda ids: ids[::-1])


def test_a_bad_worker_device_is_a_config_error():
    with pytest.raises(ConfigError, match=r"'devices\[1\]' must be auto, cpu, cuda, cuda:N or mps, got 'gpu0'"):
        validate({**tiny_raw(), "workers": 2, "devices": ["cpu", "gpu0"]})


def test_the_packed_data_are_the_clients_splits_in_shared_memory():
    data = load_dataset("synthetic", 0, num_clients=4, samples_per_client=10, size=8)
    packed = pack(data)
    assert sorted(packed.tensors) == ["test.x", "test.y", "train.x", "train.y", "val.x", "val.y"]
    assert all(t.is_shared() for t in packed.tensors.values())
    for mine, theirs in zip(data.clients, packed.clients()):
        assert (mine.name, mine.group) == (theirs.name, theirs.group)
        for s in ("train", "val", "test"):
            assert torch.equal(getattr(mine, s).x, getattr(theirs, s).x)
            assert torch.equal(getattr(mine, s).y, getattr(theirs, s).y)


def test_clients_are_dispatched_longest_first():
    cfg = validate({**tiny_raw(), "train": {"local_epochs": 2, "batch_size": 4}})
    data = load_dataset("synthetic", 0, num_clients=3, samples_per_client=10, size=8)
    steps = [expected_cost("train", c, cfg.train) for c in data.clients]
    assert steps == [2 * (len(c.train) // 4) for c in data.clients]
    assert expected_cost("evaluate", data.clients[0], cfg.train) == len(data.clients[0].val) + len(data.clients[0].test)


def test_ctrl_c_ends_the_run_and_every_worker(tmp_path):
    raw = config(2).to_dict()
    raw["train"]["rounds"] = 50
    raw.update(out_dir=str(tmp_path / "runs"), name="interrupted")
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(dump_toml(raw))
    proc = start_run(cfg_file, start_new_session=True)  # its own process group, as a terminal's job
    wait_for_rounds(proc, tmp_path / "runs", "interrupted", 2)
    workers = _workers_under(proc.pid)
    assert len(workers) == 2
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    assert proc.wait(timeout=60) == 130
    assert "fedaug: interrupted" in proc.stderr.read().decode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in workers):
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def _workers_under(ancestor: int) -> list[int]:
    """The pids of live worker processes (named ``fedaug-worker-N``) descending from ``ancestor``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not (proc.name.isdigit() and (proc / "comm").read_text().startswith("fedaug-worker")):
                continue
            pid = int(proc.name)
            while pid > 1 and pid != ancestor:
                pid = int((Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()[1])  # the parent
            if pid == ancestor:
                found.append(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return found


def test_a_worker_that_cannot_be_built_raises_its_reason_in_the_server_process():
    cfg = config(2)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    with pytest.raises(ValueError, match="this component cannot be built in a worker process"):
        with Simulation(cfg, data, Recipe(FedAvg(), [UnbuildableInWorkers()])) as sim:
            sim.run_round(1)
    assert not _workers_under(os.getpid())


@pytest.mark.parametrize(("devices", "preloaded"), [(["cpu"], False), (["cpu", "cuda:0"], True)])
def test_a_cpu_fleets_workers_start_without_torch_dynamo_and_a_cuda_fleets_with_it(devices, preloaded):
    """The fork server preloads torch._dynamo only for workers on CUDA, whose torch optimisers import it (3-5
    CPU-seconds each otherwise); the CPU's optimisers do without it, so a CPU fleet's first worker starts that much
    sooner (measured: 6.8-8.0 s -> 1.8-2.5 s to a fork server's first child on one loaded core). In a fresh process,
    where the fork server starts with the preload of its first fleet."""
    code = ("import sys\n"
            f"from {_context.__module__} import _context\n"
            f"from {exit_with_dynamo_imported.__module__} import exit_with_dynamo_imported\n"
            f"p = _context({devices!r}).Process(target=exit_with_dynamo_imported)\n"
            "p.start(); p.join(); sys.exit(p.exitcode)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert done.returncode == int(preloaded), done.stderr
