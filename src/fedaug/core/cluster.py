"""Reaching a Ray cluster (the ``ray`` extra, docs/cluster.md): Ray imported where it is installed, this
process connected once, and a node's software compared with this process's before it computes anything.

Ray is imported here and nowhere at module level, so that fedaug imports without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fedaug.core.errors import ConfigError
from fedaug.core.version import __version__

#: the extra that brings Ray, and what its error says to install
RAY_EXTRA = "pip install 'fedaug[ray]'"


def ray_installed() -> bool:
    """Whether Ray is importable here."""
    return importlib.util.find_spec("ray") is not None


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ConfigError: Ray is not installed (naming the extra to install).
    """
    if not ray_installed():
        raise ConfigError(f"fleet = 'ray' and fedaug compare --ray need Ray, which is not installed: {RAY_EXTRA}")
    return importlib.import_module("ray")


def ray_target(address: str) -> str:
    """The cluster an ``address`` names: itself, or where it is empty ``RAY_ADDRESS``, else ``local``.

    >>> ray_target("head:6379")
    'head:6379'
    """
    return address or os.environ.get("RAY_ADDRESS") or "local"


def connect(address: str) -> Any:
    """This process connected to the Ray cluster at ``address`` (once; a process that is already
    connected, e.g. a Ray task, keeps its connection); the ``ray`` module.

    Args:
        address: the head's ``host:port``, ``ray://host:port`` (Ray Client), ``auto`` (``RAY_ADDRESS``,
            else the cluster this machine joined with ``ray start``) or ``local`` (a Ray of this process's own,
            started here even where another Ray runs on this machine or ``RAY_ADDRESS`` names one; Ray stops it
            when the process disconnects or ends); empty: :func:`ray_target`.

    Raises:
        ConfigError: Ray is not installed, or no cluster answers at ``address`` (naming it).
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target = ray_target(address)
    fix = ("start one (ray start --head) and give its address (ray.address, --ray ADDRESS or RAY_ADDRESS), or use "
           "'local' for a Ray on this machine")
    if target not in ("local", "auto") and "://" not in target:
        _check_reachable(target, fix)  # Ray itself retries a silent address for minutes
    try:
        with warnings.catch_warnings():  # Ray's notice of a change of its own defaults, which fedaug does not meet
            warnings.simplefilter("ignore", FutureWarning)
            if target == "local":  # "local", not None: Ray would join the cluster of RAY_ADDRESS or of 'ray start'
                ray.init(address="local", logging_level="WARNING", log_to_driver=False, include_dashboard=False)
            else:
                ray.init(address=target, logging_level="WARNING", log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"no Ray cluster answers at {target!r} ({exc}); {fix}") from None
    return ray


@contextmanager
def session(address: str) -> Iterator[tuple[Any, str]]:
    """:func:`connect` for a ``with`` block: the ``ray`` module and the cluster as a progress line names it
    (:func:`cluster_text`). A process that was not connected before is disconnected after, however the block
    ends, which stops a Ray that ``local`` started for it; one that was (a Ray task, a test's cluster) keeps
    its connection."""
    ray = import_ray()
    before = ray.is_initialized()
    ray = connect(address)
    try:
        yield ray, cluster_text(ray, started=not before and ray_target(address) == "local")
    finally:
        if not before:
            ray.shutdown()


def cluster_text(ray: Any, started: bool) -> str:
    """The cluster this process is connected to: who started it, its GCS address, its CPUs and GPUs.

    Args:
        started: whether this process started it (``local``).

    Returns:
        e.g. ``"a Ray started for this command at 127.0.0.1:6379 (CPUs: 2, GPUs: 0)"``.
    """
    resources = ray.cluster_resources()
    who = "a Ray started for this command" if started else "the Ray cluster"
    return (f"{who} at {ray.get_runtime_context().gcs_address} "
            f"(CPUs: {resources.get('CPU', 0.0):g}, GPUs: {resources.get('GPU', 0.0):g})")


def _check_reachable(address: str, fix: str, timeout_s: float = 5.0) -> None:
    """Raise unless something accepts a TCP connection at ``address`` (``host:port``)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"Ray address {address!r} is not host:port, ray://host:port, auto or local; {fix}")
    problem = unreachable(host.strip("[]"), int(port), timeout_s)
    if problem is not None:
        raise ConfigError(f"no Ray cluster answers at {address!r} ({problem}); {fix}")


def unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why nothing accepts a TCP connection at ``host:port`` within ``timeout_s`` (the error), or ``None``
    where something does."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return str(exc)
    return None


def node_gone(ray: Any, node_id: str, timeout_s: float = 2.0) -> bool:
    """Whether the Ray node ``node_id`` is gone: the cluster says so, or its raylet accepts no connection.
    The cluster marks a lost node dead only after its health check has failed several times (seconds to
    half a minute), while the node's actors are known dead at once; the raylet's port tells sooner."""
    node = next((n for n in ray.nodes() if n["NodeID"] == node_id), None)
    if node is None or not node["Alive"]:
        return True
    return unreachable(node["NodeManagerAddress"], int(node["NodeManagerPort"]), timeout_s) is not None


def software() -> dict[str, str]:
    """What must be equal on every node for equal numbers: the versions of Python, fedaug and torch."""
    import torch

    return {"python": platform.python_version(), "fedaug": __version__, "torch": torch.__version__}


def check_software(node: str, theirs: dict[str, str], ours: dict[str, str] | None = None) -> None:
    """Raise unless ``theirs`` (:func:`software` on a node) equals the driver's (``ours``; default: this
    process's :func:`software`).

    Raises:
        ConfigError: naming the node and each version that differs, with the fix.
    """
    ours = software() if ours is None else ours
    differ = [f"{k} {theirs.get(k)} there, {v} here" for k, v in ours.items() if theirs.get(k) != v]
    if differ:
        raise ConfigError(f"Ray node {node} runs other software than the driver ({'; '.join(differ)}): the numbers "
                          "would differ; install the same versions on every node, or run with a Ray runtime "
                          "environment that does (docs/cluster.md)")
