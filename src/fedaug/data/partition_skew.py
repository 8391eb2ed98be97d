"""Label-skew, size-skew and scarcity partitioners (companions of :mod:`fedaug.data.partition`).

Every function is pure: a function of the labels, the sizes and ``seed`` only, drawing from a fresh
:class:`numpy.random.Generator` (DESIGN.md, invariant 1), and returns disjoint int64 index arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedaug.core.errors import ConfigError
from fedaug.data.checks import check_fraction, require_int
from fedaug.data.partition import _check_clients, dirichlet_partition, iid_partition, stratified_split


def quantity_partition(labels: np.ndarray, num_clients: int, q: int, seed: int) -> list[np.ndarray]:
    """Quantity-based label skew Qua(q): every client holds exactly ``q`` classes.

    Li et al., "Federated Learning on Non-IID Data Silos: An Experimental Study" (NIID-Bench,
    arXiv:2102.02079), as used by FLea (KDD 2024, Sec. 4.1) and FedLC. Clients pick their classes one
    after another among the classes held by the fewest clients so far (ties broken at random), so
    class holder counts differ by at most one and every class is used once ``num_clients * q >= C``.
    Each class's samples are shuffled and split near-equally between its holders.

    Args:
        labels: ``(N,)`` integer labels with ``C`` distinct values.
        num_clients: number of clients, >= 1.
        q: classes per client, ``1 <= q <= C``.
        seed: seeds the class choice and the shuffles.

    Returns:
        ``num_clients`` disjoint, shuffled int64 index arrays; together they cover every sample of
        the classes held by some client (all samples when ``num_clients * q >= C``).

    Raises:
        ConfigError: ``q`` is out of range, or a class has fewer samples than holders.
    """
    labels = np.asarray(labels)
    _check_clients(num_clients, max(len(labels), num_clients))
    classes = np.unique(labels)
    require_int("q", q, 1, len(classes), note=" (the number of classes)", numpy=True)
    rng = np.random.default_rng(seed)
    holders = np.zeros(len(classes), np.int64)
    chosen = []
    for _ in range(num_clients):
        pick = np.argsort(holders + rng.random(len(classes)), kind="stable")[:q]
        holders[pick] += 1
        chosen.append(pick)
    short = [f"class {classes[c]} ({int((labels == classes[c]).sum())} samples, {h} clients)"
             for c, h in enumerate(holders) if h > (labels == classes[c]).sum()]
    if short:
        raise ConfigError(
            f"Qua(q={q}) with {num_clients} clients needs at least as many samples of a class as clients "
            f"holding it: {', '.join(short)}; lower num_clients or q"
        )
    parts: list[list[np.ndarray]] = [[np.zeros(0, np.int64)] for _ in range(num_clients)]
    for c, cls in enumerate(classes):
        owners = [k for k in range(num_clients) if c in chosen[k]]
        if owners:
            chunks = np.array_split(rng.permutation(np.flatnonzero(labels == cls)), len(owners))
            for k, chunk in zip(owners, chunks, strict=True):
                parts[k].append(chunk)
    return [rng.permutation(np.concatenate(p)).astype(np.int64) for p in parts]


def shard_partition(labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int) -> list[np.ndarray]:
    """Pathological label skew by shards: sort by label, cut into shards, deal shards at random.

    McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data"
    (FedAvg, arXiv:1602.05629): ``num_clients * shards_per_client`` near-equal shards of the
    label-sorted (within-class shuffled) indices. When no shard is larger than the smallest class, a
    shard spans at most two classes, so a client holds at most ``2 * shards_per_client`` classes
    (at most ``shards_per_client`` when every class size is a multiple of the shard size).

    Args:
        labels: ``(N,)`` integer labels.
        num_clients: number of clients, >= 1.
        shards_per_client: shards per client, >= 1, with ``num_clients * shards_per_client <= N``.
        seed: seeds the within-class shuffle and the dealing.

    Returns:
        ``num_clients`` disjoint, shuffled int64 index arrays covering ``range(N)``; sizes differ by
        at most ``shards_per_client``.

    Raises:
        ConfigError: an argument is out of range.
    """
    labels = np.asarray(labels)
    _check_clients(num_clients, len(labels))
    require_int("shards_per_client", shards_per_client, 1, len(labels) // num_clients,
                note=f" for {len(labels)} samples and {num_clients} clients", numpy=True)
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(order, num_clients * shards_per_client)
    deal = rng.permutation(len(shards)).reshape(num_clients, shards_per_client)
    return [rng.permutation(np.concatenate([shards[s] for s in row])).astype(np.int64) for row in deal]


def power_law_sizes(num_samples: int, num_clients: int, exponent: float, min_size: int, seed: int) -> np.ndarray:
    """Client sizes following a power law: ``min_size`` each plus the rest in proportion to
    ``rank ** -exponent`` (ranks shuffled between clients), rounded by largest remainder.

    Args:
        num_samples: total ``N``.
        num_clients: number of clients, ``num_clients * min_size <= N``.
        exponent: >= 0; 0 gives equal sizes, larger values a heavier skew.
        min_size: smallest client size, >= 0.
        seed: seeds which client gets which rank.

    Returns:
        ``(num_clients,)`` int64 sizes summing to ``N``.

    Raises:
        ConfigError: an argument is out of range.
    """
    _check_clients(num_clients, max(num_samples, num_clients))
    if not isinstance(exponent, (int, float)) or not exponent >= 0:
        raise ConfigError(f"exponent must be a number >= 0 (0: equal sizes), got {exponent!r}")
    require_int("min_size", min_size, 0, num_samples // num_clients,
                note=f" for {num_samples} samples and {num_clients} clients", numpy=True)
    rng = np.random.default_rng(seed)
    weights = rng.permutation(np.arange(1, num_clients + 1, dtype=np.float64) ** -float(exponent))
    share = weights / weights.sum() * (num_samples - min_size * num_clients)
    sizes = np.floor(share).astype(np.int64)
    rest = num_samples - min_size * num_clients - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:rest]] += 1
    return sizes + min_size


def size_skew_partition(
    labels: np.ndarray, num_clients: int, exponent: float, min_size: int, seed: int
) -> list[np.ndarray]:
    """Quantity (size) skew with IID labels: shuffled indices cut into :func:`power_law_sizes` parts.

    Returns:
        ``num_clients`` disjoint int64 index arrays covering ``range(N)``, sizes as drawn.
    """
    sizes = power_law_sizes(len(labels), num_clients, exponent, min_size, seed)
    order = np.random.default_rng(seed + 1).permutation(len(labels)).astype(np.int64)
    return np.split(order, np.cumsum(sizes)[:-1])


def scarcity_num_clients(num_samples: int, mean_size: int) -> int:
    """FLea's scarcity level (KDD 2024, Sec. 4.1): the client count giving a mean local size.

    Returns:
        ``max(1, round(num_samples / mean_size))``.

    Raises:
        ConfigError: ``mean_size`` is not an integer in ``[1, num_samples]``.
    """
    require_int("mean_size", mean_size, 1, max(num_samples, 1), note=" (samples to share)", numpy=True)
    return max(1, round(num_samples / mean_size))


def scarcity_partition(
    labels: np.ndarray, mean_size: int, seed: int, *, alpha: float | None = None, q: int | None = None
) -> list[np.ndarray]:
    """Data scarcity (FLea): as many clients as give ``mean_size`` samples on average, with label skew
    Dir(``alpha``) (min size 1), Qua(``q``), or IID when neither is given.

    Raises:
        ConfigError: both ``alpha`` and ``q`` are given, or one is out of range.
    """
    labels = np.asarray(labels)
    k = scarcity_num_clients(len(labels), mean_size)
    if alpha is not None and q is not None:
        raise ConfigError(f"give alpha (Dirichlet) or q (quantity) for a scarcity split, not both (got {alpha}, {q})")
    if alpha is not None:
        return dirichlet_partition(labels, k, alpha, 1, seed)
    if q is not None:
        return quantity_partition(labels, k, q, seed)
    return iid_partition(labels, k, seed)


def fraction_subset(labels: np.ndarray, parts: Sequence[np.ndarray], fraction: float, seed: int) -> list[np.ndarray]:
    """Keep a stratified ``fraction`` of every client's indices (FedFA's 1/6 ... 1 training fractions,
    ICLR 2023, Sec. 5.2 / App. C): client k keeps ``round(fraction * n_k)`` samples.

    Raises:
        ConfigError: ``fraction`` is not in (0, 1].
    """
    problems: list[str] = []
    if not check_fraction(problems, "fraction", fraction, interval="(0, 1]", note=" (e.g. 1/6 ... 1)"):
        raise ConfigError(problems[0])
    labels = np.asarray(labels)
    return [p[stratified_split(labels[p], (fraction, 1 - fraction), seed + k)[0]] for k, p in enumerate(parts)]
