"""A real Ray cluster on loopback for the tests (issue 49): a head node and a worker node, each its own
raylet, object store and agents, started with Ray's cluster utilities once per test session
(``ray_cluster`` in tests/conftest.py) and stopped after it. Only 127.0.0.1 is used (the repository's
conftest.py sets Ray to it before Ray is imported).

The head reserves no CPU for tasks (as on a cluster whose head runs the driver only), so every actor and
every cell runs on the worker node: 2 CPUs, the cores of CI. A test that kills the worker node runs after
the other Ray tests (``breakable_ray``), and a test after it gets a new one (``on_ray``); Ray's health
check is set to notice a killed node in seconds (:data:`HEALTH_CHECK`).
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
#: what the head starts that the tests do not use: the dashboard's modules, the autoscaler's monitor, the log
#: monitor (drivers here do not print workers' logs); its dashboard agent on a port of the system's choosing (Ray's
#: fixed default would clash with a second test session on the machine)
HEAD_TRIMMED = {"include_dashboard": False, "no_monitor": True, "include_log_monitor": False,
                "dashboard_agent_listen_port": None}
#: Ray's health check on the test cluster (the head's setting, read when it starts): every second, a node given up
#: after 3 missed answers, so that a killed node is noticed in seconds (Ray's defaults take about 30 s)
HEALTH_CHECK = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "1000",
                "RAY_health_check_timeout_ms": "2000", "RAY_health_check_failure_threshold": "3"}


@dataclass
class LoopbackCluster:
    """The session's cluster: ``address`` (the head's GCS), the utilities' ``cluster`` and its worker node."""

    cluster: Any
    worker: Any  # None once it is killed
    lost: list[Any] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_worker(self) -> Any:
        """A worker node of :data:`WORKER_CPUS` CPUs, now the cluster's worker, once it has joined."""
        self.worker = self.cluster.add_node(num_cpus=WORKER_CPUS, node_ip_address=LOOPBACK,
                                            object_store_memory=OBJECT_STORE)
        self.cluster.wait_for_nodes()
        return self.worker

    def kill_worker(self) -> str:
        """SIGKILL every process of the worker node (raylet, object store, agents; its workers follow); its id."""
        node, node_id = self.worker, self.worker.node_id
        self.cluster.remove_node(node, allow_graceful=False)
        self.lost.append(node)
        self.worker = None
        return node_id

    def connect(self) -> None:
        """Connect this process to the cluster, unless it is (Flower's simulation disconnects it when it ends),
        a worker node added where the last one was killed."""
        from fedaug.core.cluster import connect

        if self.worker is None:
            self.add_worker()
        connect(self.address)


def start() -> Iterator[LoopbackCluster]:
    """The cluster, this process connected to it; everything stopped after the ``yield``."""
    os.environ.update(HEALTH_CHECK)
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": LOOPBACK, "object_store_memory": OBJECT_STORE, **HEAD_TRIMMED})
    try:
        loop = LoopbackCluster(cluster, None)
        loop.add_worker()
        loop.connect()
        yield loop
    finally:
        ray.shutdown()
        cluster.shutdown()
