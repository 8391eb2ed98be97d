"""A real Ray cluster on loopback for the tests (issue 49): a head node and a worker node, each its own
raylet, object store and agents, started with Ray's cluster utilities by the first test that needs it
(``on_ray`` in tests/conftest.py) and stopped when the test process has no more tests for it. Only
127.0.0.1 is used (the repository's conftest.py sets Ray to it before Ray is imported).

The head reserves no CPU for tasks (as on a cluster whose head runs the driver only), so every actor and
every cell runs on the worker node: 2 CPUs, the cores of CI. A test that kills the worker node runs after
the other Ray tests (``breakable_ray``), and a test after it gets a new one; Ray's health check is set to
notice a killed node in seconds (:data:`HEALTH_CHECK`). Where pytest-xdist spreads the Ray tests over
several processes (only where they are most of a run), each process starts a cluster of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

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
#: after 5 failed checks in a row. A killed node refuses each check at once, so it is given up in about 5 s (Ray's
#: defaults take about 30 s); a live node that a loaded machine slows (CI downloads torch builds beside the suite)
#: has 10 s per answer, about 50 s in all, before Ray gives it up and ends what runs on it (the tests' own
#: process, the driver, among them where it is connected through that node)
HEALTH_CHECK = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "1000",
                "RAY_health_check_timeout_ms": "10000", "RAY_health_check_failure_threshold": "5"}


class LoopbackCluster:
    """The tests' cluster: started by the first test that needs it (:meth:`up`), stopped (:meth:`down`) when
    this process has no more tests for it (tests/conftest.py), started again if one comes later."""

    def __init__(self) -> None:
        self.cluster: Any = None  # Ray's cluster utilities' Cluster, while it runs
        self.worker: Any = None  # its worker node (None once it is killed)
        self.lost: list[Any] = []  # the killed nodes

    @property
    def address(self) -> str:
        """The head's GCS address (``host:port``)."""
        return self.cluster.address

    def up(self) -> LoopbackCluster:
        """The cluster running (started where it is not, a worker node added where the last one was killed),
        this process connected to it (again, where Flower's simulation disconnected it when it ended)."""
        from fedaug.core.cluster import connect

        if self.cluster is None:
            os.environ.update(HEALTH_CHECK)
            from ray.cluster_utils import Cluster

            self.cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 0, "node_ip_address": LOOPBACK, "object_store_memory": OBJECT_STORE, **HEAD_TRIMMED})
        if self.worker is None:
            self.add_worker()
        connect(self.address)
        return self

    def down(self) -> None:
        """Every node stopped and this process disconnected (nothing to do where it is not running)."""
        if self.cluster is None:
            return
        import ray

        try:
            ray.shutdown()
        finally:
            self.cluster.shutdown()
            self.cluster = self.worker = None

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


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


#: the ports ``ray start --head`` opens beside its own that default to fixed numbers (which another Ray on the machine
#: may hold) or to ports the raylet waits to read from its agents' files, at most 15 s, which a loaded machine
#: exceeds (ray-project/ray#65983): given here, each free a moment before
PORTS = ("ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
         "runtime-env-agent-port")


class StartedCluster:
    """A head node as ``ray start --head`` leaves one running on a machine (issue 61): its own processes, and
    its address in ``ray_current_cluster`` under ``RAY_TMPDIR``, where ``ray.init()`` without an address finds
    it. Its ``RAY_TMPDIR`` is a short directory of its own (Ray's socket paths must stay short), which a command
    started with :attr:`env` shares, as a user's commands share ``/tmp`` with the ``ray start`` they left running;
    its ports are free ones (:data:`PORTS`), so that it clashes with no other Ray on the machine.
    A context manager: started (once its address is written), then stopped (SIGTERM to ``ray start --block``, which
    ends the node's processes) and its directory removed."""

    def __init__(self, timeout_s: float = 240.0) -> None:
        self.timeout_s = timeout_s
        self.root = Path(tempfile.mkdtemp(prefix="fedaug-ray-"))
        self.env = {**os.environ, "RAY_TMPDIR": str(self.root), "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.address = ""  # the head's GCS address, once it runs
        self.session = Path()  # its session directory (its logs: logs/), once it runs
        self.proc: subprocess.Popen[bytes] | None = None
        self.output: BinaryIO | None = None  # what ray start prints

    def __enter__(self) -> StartedCluster:
        port, log = free_port(), self.root / "ray-start.log"
        self.output = log.open("wb")
        ports = {f"--{k}": str(free_port()) for k in PORTS}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(port),
             *[x for kv in ports.items() for x in kv], "--num-cpus", "1", "--node-ip-address", LOOPBACK,
             "--object-store-memory", str(OBJECT_STORE), "--include-dashboard", "false",
             "--include-log-monitor", "false", "--disable-usage-stats"],
            env=self.env, stdin=subprocess.DEVNULL, stdout=self.output, stderr=subprocess.STDOUT)
        written = self.root / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + self.timeout_s
        while not written.is_file() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not written.is_file():
            raylet = next((self.root / "ray").glob("session_2*/logs/raylet.out"), None)
            said = log.read_text(errors="replace")[-1000:]
            said += raylet.read_text(errors="replace")[-3000:] if raylet is not None else ""
            self.__exit__()
            raise RuntimeError(f"ray start --head did not come up (exit status {self.proc.poll()}, "
                               f"{self.timeout_s:.0f} s allowed); it and its raylet said:\n{said}")
        self.address = written.read_text().strip()
        self.session = (self.root / "ray" / "session_latest").resolve()  # before another Ray here moves the link
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)
        if self.output is not None:
            self.output.close()
        shutil.rmtree(self.root, ignore_errors=True)
