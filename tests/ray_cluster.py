"""A real Ray cluster on loopback for the tests (issue 49): a head node and a worker node, each its own
raylet, object store and agents, started with Ray's cluster utilities once per test session
(``ray_cluster`` in tests/conftest.py) and stopped after it. Only 127.0.0.1 is used (the repository's
conftest.py sets Ray to it before Ray is imported).

The head reserves no CPU for tasks (as on a cluster whose head runs the driver only), so every actor and
every cell runs on the worker node: 2 CPUs, the cores of CI. Ray's health check runs every second and
gives a node up after 3 missed answers, so that a killed node is noticed in seconds (Ray's defaults take
about 30 s); that is the head's setting, read when it starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

LOOPBACK = "127.0.0.1"
#: CPUs of the worker node (the head has none)
WORKER_CPUS = 2
#: each node's object store (Ray's least is 75 MB; its default, 30 % of the memory, is far more than tests need)
OBJECT_STORE = 100 * 1024**2
HEALTH_CHECK = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "1000",
                "RAY_health_check_timeout_ms": "2000", "RAY_health_check_failure_threshold": "3"}


@dataclass
class LoopbackCluster:
    """The session's cluster: ``address`` (the head's GCS), the utilities' ``cluster`` and its worker node."""

    cluster: Any
    worker: Any
    lost: list[Any] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_worker(self) -> Any:
        """A fresh worker node of :data:`WORKER_CPUS` CPUs (after one was killed), now the cluster's worker."""
        self.worker = self.cluster.add_node(num_cpus=WORKER_CPUS, node_ip_address=LOOPBACK,
                                            object_store_memory=OBJECT_STORE)
        self.cluster.wait_for_nodes()
        return self.worker

    def kill_worker(self) -> str:
        """SIGKILL every process of the worker node (raylet, object store, agents; its workers follow); its id."""
        node, node_id = self.worker, self.worker.node_id
        self.cluster.remove_node(node, allow_graceful=False)
        self.lost.append(node)
        return node_id

    def connect(self) -> None:
        """Connect this process to the cluster, unless it is (Flower's simulation disconnects it when it ends)."""
        from fedaug.core.cluster import connect

        connect(self.address)


def start() -> Iterator[LoopbackCluster]:
    """The cluster, this process connected to it; everything stopped after the ``yield``."""
    os.environ.update(HEALTH_CHECK)
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False, "object_store_memory": OBJECT_STORE})
    try:
        loop = LoopbackCluster(cluster, None)
        loop.add_worker()
        loop.connect()
        yield loop
    finally:
        ray.shutdown()
        cluster.shutdown()
