"""Flower's simulation runtime (Ray): every client a virtual SuperNode, in worker processes.

Needs Ray (``pip install 'fedaug[flower,ray]'``: the release Flower's ``simulation`` extra pins); fedaug's
in-process engine stays the default and gives the same numbers. Flower sets each virtual SuperNode's ``partition-id`` and
``num-partitions``, so the dataset's clients map onto the nodes as in a deployment.
"""

from __future__ import annotations

from typing import Any

from flwr.simulation import run_simulation

from fedaug.config.schema import RunConfig
from fedaug.core.cluster import RAY_EXTRA, ray_installed
from fedaug.core.errors import FedaugError
from fedaug.engine.flower.client_app import make_client_app
from fedaug.engine.flower.server_app import make_server_app
from fedaug.engine.flower.settings import run_config_for


def run_flower_simulation(cfg: RunConfig, num_clients: int, *, cpus_per_client: float = 1.0, quiet: bool = False,
                          **settings: Any) -> dict[str, Any]:
    """Run ``cfg`` in Flower's simulation runtime with one virtual SuperNode per client.

    Args:
        cfg: the fedaug config.
        num_clients: the dataset's number of clients.
        cpus_per_client: CPUs Ray reserves for one ClientApp (how many run at once).
        quiet: print no progress of fedaug's own (Flower and Ray still log).
        settings: Flower run config settings (``round_timeout``, ``connect_timeout``, ``out_dir``).

    Returns:
        The run's summary (its run directory is written as for ``fedaug run``).

    Raises:
        FedaugError: Ray is not installed, or the run failed (Flower logs the cause).
    """
    if not ray_installed():
        raise FedaugError(f"Flower simulation needs Ray: {RAY_EXTRA.replace('fedaug[ray]', 'fedaug[flower,ray]')}")
    run_config = run_config_for(cfg, **settings)
    done: list[dict[str, Any]] = []
    run_simulation(make_server_app(run_config, on_summary=done.append, quiet=quiet), make_client_app(run_config),
                   num_supernodes=num_clients,
                   backend_config={"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}})
    if not done:
        raise FedaugError("the Flower simulation ended without a result; see Flower's log above for the cause")
    return done[0]
