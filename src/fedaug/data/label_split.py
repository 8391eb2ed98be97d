"""One entry point for the label partitioners, shared by datasets with a ``partition`` option.

Fashion-MNIST, CIFAR-10, EMNIST, UCI-HAR and UrbanSound8K accept ``partition`` = ``dirichlet`` |
``dirichlet_balanced`` (NIID-Bench / PFLlib: clients capped at ``N / K``, see
:func:`~fedaug.data.partition.dirichlet_partition`) | ``iid`` | ``quantity`` | ``shards`` | ``scarcity``
and the parameters below; options are checked
together and every problem is reported at once (option, value, allowed values).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, get_args

import numpy as np

from fedaug.core.errors import ConfigError
from fedaug.data.checks import check_int, raise_problems
from fedaug.data.partition import dirichlet_partition, iid_partition
from fedaug.data.partition_skew import quantity_partition, scarcity_partition, shard_partition

#: the label partitions (option ``partition`` of the label-skew datasets)
Partition = Literal["dirichlet", "dirichlet_balanced", "iid", "quantity", "shards", "scarcity"]
PARTITIONS: tuple[str, ...] = get_args(Partition)
#: option -> the partitions that use it (``num_clients`` is unused by ``scarcity``).
USES = {
    "num_clients": ("dirichlet", "dirichlet_balanced", "iid", "quantity", "shards"),
    "alpha": ("dirichlet", "dirichlet_balanced", "scarcity"),
    "q": ("quantity",),
    "shards_per_client": ("shards",),
    "mean_size": ("scarcity",),
}
DEFAULTS: dict[str, Any] = {"num_clients": 10, "alpha": 0.5, "q": 2, "shards_per_client": 2, "mean_size": 100}


def check_partition_options(dataset: str, partition: Any, opts: dict[str, Any]) -> None:
    """Raise one ConfigError listing every bad option; warn about options the partition ignores.

    Args:
        dataset: registry name, used as the message prefix.
        partition: the requested partition name.
        opts: ``num_clients``, ``alpha``, ``q``, ``shards_per_client``, ``mean_size`` values.
    """
    problems: list[str] = []
    if partition not in PARTITIONS:
        problems.append(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    for name in ("num_clients", "q", "shards_per_client", "mean_size"):
        check_int(problems, name, opts[name], 1)
    alpha = opts["alpha"]
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
        problems.append(f"alpha must be > 0, got {alpha!r}; e.g. 0.1 (very skewed) to 100 (near IID)")
    raise_problems(dataset, problems)
    for name, users in USES.items():
        if partition not in users and opts[name] != DEFAULTS[name]:
            warnings.warn(f"{dataset}: {name}={opts[name]!r} has no effect with partition={partition!r}", stacklevel=3)


def partition_labels(labels: np.ndarray, partition: str, seed: int, min_size: int, **opts: Any) -> list[np.ndarray]:
    """Split ``labels``' indices between clients with the named partitioner.

    Args:
        labels: ``(N,)`` integer labels.
        partition: one of :data:`PARTITIONS`.
        seed: seeds the partitioner.
        min_size: smallest client for ``dirichlet`` and ``dirichlet_balanced`` (redrawn until it holds).
        **opts: ``num_clients``, ``alpha``, ``q``, ``shards_per_client``, ``mean_size``.

    Returns:
        Disjoint int64 index arrays, one per client.
    """
    k = opts["num_clients"]
    if partition in ("dirichlet", "dirichlet_balanced"):
        return dirichlet_partition(labels, k, opts["alpha"], min_size, seed, balanced=partition == "dirichlet_balanced")
    if partition == "iid":
        return iid_partition(labels, k, seed)
    if partition == "quantity":
        return quantity_partition(labels, k, opts["q"], seed)
    if partition == "shards":
        return shard_partition(labels, k, opts["shards_per_client"], seed)
    if partition == "scarcity":
        return scarcity_partition(labels, opts["mean_size"], seed, alpha=opts["alpha"])
    raise ConfigError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
