"""Flower's simulation runtime (Ray) gives the in-process engine's numbers, its virtual SuperNodes on the
session's loopback Ray cluster (tests/ray_cluster.py). ``make test`` installs Ray (the ``ray`` extra, the
release ``flwr[simulation]`` pins); where it is not installed, this module is skipped, saying so."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")
pytest.importorskip("ray", reason="Flower simulation needs Ray: pip install 'fedaug[flower,ray]'")

from fedaug.engine.flower.simulation import run_flower_simulation  # noqa: E402
from fedaug.engine.run import run_experiment  # noqa: E402
from tests.engine.flower.conftest import records  # noqa: E402
from tests.ray_cluster import WORKER_CPUS  # noqa: E402

pytestmark = pytest.mark.slow


def test_flower_simulation_gives_the_in_process_engines_numbers(on_ray, tmp_cfg, tmp_path):
    cfg = tmp_cfg("flea", participation=0.67)
    expected, run_dir = run_experiment(cfg, quiet=True)
    # one ClientApp actor: one torch import, not two; on a loaded machine its start can pass the default 120 s
    got = run_flower_simulation(cfg, 3, cpus_per_client=WORKER_CPUS, connect_timeout=600)
    assert records(got["run_dir"]) == records(run_dir.path)
    assert (got["final"], got["best"], got["comm_total"]) == (expected["final"], expected["best"], expected["comm_total"])
