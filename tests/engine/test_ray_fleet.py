"""Clients on Ray actors (``fleet = "ray"``, issue 49, Must show 1 and 3), on the session's loopback cluster
(tests/ray_cluster.py: a head and a worker node): the records equal one worker's at one thread per worker, bit
for bit; a worker node killed mid-round ends the run with one message naming the client and the node, and the
run resumes to the uninterrupted run's numbers."""

from __future__ import annotations

import re
import threading
import time

import pytest

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.core.runtime import torch_threads
from fedaug.data.registry import load_dataset
from fedaug.engine.fleet.tasks import WorkerDied
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.run import Simulation, build_simulation, resume_experiment
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.base.scaffold import SCAFFOLD
from fedaug.methods.recipe import Recipe
from tests.conftest import tiny_raw
from tests.engine.pool_helpers import StallOnce, UnbuildableInWorkers
from tests.engine.test_pool import config, one_workers_records, records
from tests.engine.test_resume import comparable, summary_numbers


def ray_config(workers: int, method: str, address: str, **extra):
    return validate({**config(workers, method).to_dict(), "fleet": "ray", "ray": {"address": address}, **extra})


def test_two_ray_actors_give_one_workers_records_bit_for_bit(on_ray):
    one = one_workers_records("fedfa")
    two = records(build_simulation(ray_config(2, "fedfa", on_ray.address)), 2)
    assert two == one
    assert '"rejected": []' in one  # nothing was refused: the comparison is of trained rounds


def test_a_worker_node_killed_mid_round_names_client_and_node_and_the_run_resumes(breakable_ray, tmp_path):
    on_ray = breakable_ray
    raw = ray_config(1, "scaffold", on_ray.address).to_dict()  # per-client state to and from the actor
    raw.update(out_dir=str(tmp_path / "runs"), checkpoint_every=1, name="killed")
    cfg = validate(raw)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    marker = tmp_path / "stalled"
    recipe = Recipe(SCAFFOLD(), [StallOnce(round=2, marker=str(marker))])
    killed: list[str] = []

    def kill_when_stalled() -> None:  # as an operator, or a preempted cloud machine, would
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (marker.exists() and marker.read_text()):
            time.sleep(0.05)
        killed.append(on_ray.kill_worker())

    killer = threading.Thread(target=kill_when_stalled)
    run_dir = RunDir.start(cfg)
    killer.start()
    try:
        with run_dir, torch_threads(1), pytest.raises(WorkerDied) as died:
            Simulation(cfg, data, recipe).run(run_dir)
    finally:
        killer.join()
    assert re.fullmatch(  # the one actor's client: the one that stalled
        rf"round 2: Ray worker actor fedaug-worker-0 \(node {killed[0][:12]} at 127\.0\.0\.1, pid \d+\) died while it "
        rf"ran client {marker.read_text()} \(train\): its node is gone\. The run stops here; its records and "
        rf"checkpoints so far are intact: continue it with 'fedaug resume {re.escape(str(run_dir.path))}' \(on the "
        r"cluster, or on this machine with --fleet local\)", str(died.value)), str(died.value)
    assert [r["round"] for r in run_dir.rounds()] == [1]
    with torch_threads(1):  # as fedaug resume --fleet local --workers 1 does; the marker: it stalls no more
        resume_experiment(str(run_dir.path), quiet=True, recipe=recipe, fleet="local", workers=1)
        ref = Simulation(validate({**raw, "fleet": "local", "workers": 1}), data, recipe)
        with RunDir.start(validate({**raw, "out_dir": str(tmp_path / "ref")})) as ref_dir:
            ref.run(ref_dir)
    assert comparable(run_dir.path) == comparable(ref_dir.path)
    assert summary_numbers(run_dir.path) == summary_numbers(ref_dir.path)


def test_an_actor_that_cannot_build_its_worker_raises_the_error_in_the_server_process(on_ray):
    """The actor's own path (its worker built when it starts, the failure answered to the first task); an error
    while a client trains takes the path the worker processes share (tests/engine/test_pool.py)."""
    cfg = ray_config(1, "fedavg", on_ray.address)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    with pytest.raises(ValueError, match="^this component cannot be built in a worker process$"):
        with Simulation(cfg, data, Recipe(FedAvg(), [UnbuildableInWorkers()])) as sim:
            sim.run_round(1)


def test_actors_that_fit_no_node_are_refused_naming_what_each_node_has(on_ray):
    cfg = ray_config(2, "fedavg", on_ray.address, ray={"address": on_ray.address, "num_gpus": 1.0})
    sim = build_simulation(cfg)
    with sim, pytest.raises(ConfigError, match=r"fleet = 'ray': each worker actor reserves 1 CPU and 1 GPU, but no "
                                               r"node of the cluster has that much \(127\.0\.0\.1: 0 CPU, 0 GPU; "
                                               r"127\.0\.0\.1: 2 CPU, 0 GPU\); lower threads, ray\.num_cpus or "
                                               r"ray\.num_gpus, or add a node that has them"):
        sim.run_round(1)


@pytest.mark.parametrize(("extra", "message"), [
    ({"devices": ["cpu"]}, r"'devices' places worker processes on this machine's devices, but fleet = 'ray' places "
                           r"each worker actor where Ray gives it the GPUs it reserves: remove devices and set "
                           r"ray\.num_gpus"),
    ({"train": {**tiny_raw()["train"], "group_clients": 2}},
     r"'train\.group_clients' = 2 trains groups on one worker model in this process, but fleet = 'ray' trains each "
     r"client on a Ray actor: set train\.group_clients = 1 or fleet = 'local'"),
    ({"device": "cuda"}, r"device = 'cuda' with fleet = 'ray' needs ray\.num_gpus > 0 \(Ray hides the GPUs from an "
                         r"actor that reserves none\): set ray\.num_gpus \(1, or 0\.5 to share a GPU\) or device = "
                         r"'auto'"),
    ({"fleet": "slurm"}, r"'fleet' must be one of local, ray, got 'slurm'"),
])
def test_what_fleet_ray_cannot_be_combined_with_is_refused(extra, message):
    with pytest.raises(ConfigError, match=message):
        validate({**tiny_raw(), "fleet": "ray", **extra})


def test_execution_order_is_refused_on_ray():
    cfg = validate({**tiny_raw(), "fleet": "ray"})
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    with pytest.raises(ConfigError, match="with fleet = 'ray' they run as actors become free: set fleet='local' and workers=1 to choose the order"):
        Simulation(cfg, data, Recipe(FedAvg(), []), execution_order=lambda ids: ids[::-1])
