"""Feature exposure eps(t) (FLea, KDD 2024, Sec. 4.4, Fig. 9a).

``xi(t)`` is the ``K x K`` feature-exchange matrix: ``xi_ij = 1`` once client ``j`` has received a
buffer holding features of client ``i`` (or vice versa) in some round ``<= t``. In FLea the buffer
received in round ``t`` was contributed by the clients of round ``t - 1`` ("clients in round t-1
share with clients in t"). eps(t) is the fraction of ordered pairs of distinct clients with
``xi_ij = 1``: ``sum_{i != j} xi_ij / (K (K - 1))``, in [0, 1]; methods that broadcast every
client's data to everyone (FedData, FedMix) have eps = 1 once everyone has shared. The paper
divides by ``K^2``; excluding the diagonal makes "everyone with everyone" exactly 1 (the two
differ by the factor ``(K - 1) / K``). A run whose method shares no features or samples (FedAvg,
FedFA: statistics only) exchanges nothing, so its eps is 0 in every round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedaug.core.errors import ConfigError


def exchange_matrices(contributors: Sequence[Sequence[int]], receivers: Sequence[Sequence[int]],
                      num_clients: int) -> list[Tensor]:
    """Cumulative exchange matrices ``xi(t)``, one per round.

    Args:
        contributors: per round t, the clients whose features make up the buffer received in t
            (FLea: the clients queried after round t - 1; empty in round 1).
        receivers: per round t, the clients that received that buffer (the sampled clients).
        num_clients: K.

    Returns:
        ``T`` bool tensors ``(K, K)``, symmetric, with a false diagonal.

    Raises:
        ConfigError: the two schedules differ in length, or a client id is outside ``0..K-1``.
    """
    if len(contributors) != len(receivers):
        raise ConfigError(f"exposure needs one contributor list per receiver list, got {len(contributors)} "
                          f"and {len(receivers)} rounds")
    bad = sorted({c for rnd in (*contributors, *receivers) for c in rnd if not 0 <= c < num_clients})
    if bad:
        raise ConfigError(f"client ids {bad} are outside 0..{num_clients - 1} (num_clients={num_clients})")
    xi = torch.zeros(num_clients, num_clients, dtype=torch.bool)
    out = []
    for src, dst in zip(contributors, receivers):
        if len(src) and len(dst):
            s, d = torch.as_tensor(list(src)), torch.as_tensor(list(dst))
            xi[s.unsqueeze(1), d.unsqueeze(0)] = True
            xi[d.unsqueeze(1), s.unsqueeze(0)] = True
        xi.fill_diagonal_(False)
        out.append(xi.clone())
    return out


def feature_exposure(contributors: Sequence[Sequence[int]], receivers: Sequence[Sequence[int]],
                     num_clients: int) -> list[float]:
    """eps(t) for every round (see the module docstring).

    >>> feature_exposure([[], [0, 1]], [[0, 1], [2]], 4)  # round 2: 0 and 1 share with 2
    [0.0, 0.3333333333333333]
    """
    k = num_clients
    if k < 2:
        raise ConfigError(f"feature exposure needs num_clients >= 2, got {k}")
    return [float(xi.sum()) / (k * (k - 1)) for xi in exchange_matrices(contributors, receivers, k)]


def flea_schedule(sampled: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """FLea's contributors and receivers from the per-round sampled clients (a run's ``rounds.jsonl``):
    the buffer of round t holds the features of round t - 1's clients."""
    receivers = [list(s) for s in sampled]
    return [[], *receivers[:-1]], receivers


def pool_schedule(sampled: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """FedData's and FedMix's contributors and receivers (:mod:`fedaug.methods.aug._sharing`): a
    client adds its share to the pool the first round it is sampled, and a sampled client receives
    every row it lacks, so round t's clients receive the shares of every client sampled before t.

    >>> pool_schedule([[0, 1], [2], [0]])
    ([[], [0, 1], [0, 1, 2]], [[0, 1], [2], [0]])
    """
    receivers = [list(s) for s in sampled]
    contributors, seen = [], set()
    for clients in receivers:
        contributors.append(sorted(seen))
        seen.update(clients)
    return contributors, receivers
