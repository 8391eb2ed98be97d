"""Distributional agreement of the skewed partitioners with independent reference draws.

flwr-datasets would pull HF ``datasets``, ``pyarrow``, ``huggingface_hub`` and ``aiohttp`` (about 25
packages) into the test environment, so the references are written here instead, directly from the
papers' definitions, with their own random streams; two-sample KS tests compare the statistics.
Seeds are fixed, so the tests are deterministic; thresholds are p > 0.01.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from fedaug.data.partition import dirichlet_partition
from fedaug.data.partition_skew import quantity_partition, shard_partition

LABELS = np.arange(10 * 400) % 10  # (4000,), 10 classes x 400


def class_shares(parts: list[np.ndarray], labels: np.ndarray) -> np.ndarray:
    """(K, C) share of each class held by each client."""
    counts = np.stack([np.bincount(labels[p], minlength=10) for p in parts])
    return counts / np.bincount(labels, minlength=10)


def test_dirichlet_shares_match_direct_dirichlet_draws() -> None:
    k, alpha, n_c = 5, 0.5, 400
    ours = np.concatenate([class_shares(dirichlet_partition(LABELS, k, alpha, 0, s), LABELS)[0] for s in range(300)])
    rng = np.random.default_rng(12345)

    def direct(a: float) -> np.ndarray:  # client 0's share of a class, rounded to whole samples as ours is
        return np.round(rng.dirichlet(np.full(k, a), size=len(ours))[:, 0] * n_c) / n_c

    assert stats.ks_2samp(ours, direct(alpha)).pvalue > 0.01
    assert stats.ks_2samp(ours, direct(2 * alpha)).pvalue < 1e-6  # a wrong concentration is detected
    # moments of the Beta(alpha, (K - 1) alpha) marginal
    var = (k - 1) * alpha**2 / ((k * alpha) ** 2 * (k * alpha + 1))
    assert abs(ours.mean() - 1 / k) < 4 * np.sqrt(var / len(ours)) and abs(ours.var() / var - 1) < 0.1


def reference_shards(labels: np.ndarray, num_clients: int, spc: int, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.'s recipe: sort by label, equal shards, each client draws spc shards without replacement."""
    order = np.lexsort((rng.random(len(labels)), labels))
    shards = list(np.array_split(order, num_clients * spc))
    free = list(range(len(shards)))
    out = []
    for _ in range(num_clients):
        take = rng.choice(free, spc, replace=False)
        free = [s for s in free if s not in take]
        out.append(np.concatenate([shards[s] for s in take]))
    return out


def test_shards_match_reference_recipe() -> None:
    labels = np.arange(1000) % 10
    rng = np.random.default_rng(7)

    def stat(parts: list[np.ndarray]) -> list[float]:  # per client: classes held, largest class share
        return [len(np.unique(labels[p])) + np.bincount(labels[p]).max() / len(p) for p in parts]

    ours = np.concatenate([stat(shard_partition(labels, 10, 3, s)) for s in range(200)])
    ref = np.concatenate([stat(reference_shards(labels, 10, 3, rng)) for _ in range(200)])
    assert stats.ks_2samp(ours, ref).pvalue > 0.01


def test_quantity_class_inclusion_is_uniform() -> None:
    k, q = 7, 3  # 21 class slots over 10 classes: holders 2 or 3
    held = np.zeros(10)
    for s in range(300):
        for p in quantity_partition(LABELS, k, q, s):
            held[np.unique(LABELS[p])] += 1
    expected = np.full(10, 300 * k * q / 10)  # every class equally likely to be held
    assert stats.chisquare(held, expected).pvalue > 0.01
