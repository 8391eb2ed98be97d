"""Index partitioners: split sample indices between clients or between train/val/test.

Every function here is pure: a function of the labels, the sizes and ``seed`` only, drawing from a
fresh :class:`numpy.random.Generator` seeded with ``seed`` (DESIGN.md, invariant 1). Each returns a
list of disjoint ``int64`` index arrays into ``labels``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedaug.core.errors import ConfigError
from fedaug.data.checks import require_int

#: how many Dirichlet draws :func:`dirichlet_partition` tries before giving up.
MAX_DIRICHLET_ATTEMPTS = 1000


def _check_clients(num_clients: int, num_samples: int) -> None:
    require_int("num_clients", num_clients, 1)
    if num_clients > num_samples:
        raise ConfigError(
            f"num_clients={num_clients} exceeds the {num_samples} samples to partition; "
            "use fewer clients or more samples"
        )


def _class_groups(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of each class present in ``labels`` (sorted class order), each group shuffled."""
    labels = np.asarray(labels)
    return [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]


def iid_partition(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Split indices into ``num_clients`` near-equal parts with the same label distribution.

    Each class is shuffled and the class-sorted indices are dealt out round-robin, so client sizes
    differ by at most one and every client's label histogram matches the pool's up to one sample
    per class.

    Args:
        labels: ``(N,)`` integer labels.
        num_clients: number of parts, >= 1; when it exceeds ``N`` the last parts are empty.
        seed: seeds the shuffle.

    Returns:
        ``num_clients`` disjoint, shuffled ``(N_k,)`` int64 index arrays covering ``range(N)``.

    Raises:
        ConfigError: ``num_clients`` is not an integer >= 1.
    """
    labels = np.asarray(labels)
    _check_clients(num_clients, max(len(labels), num_clients))
    rng = np.random.default_rng(seed)
    order = np.concatenate([np.zeros(0, np.int64), *_class_groups(labels, rng)])
    # Dealing the class-sorted order round-robin gives each client every class in proportion.
    owner = np.arange(len(order)) % num_clients
    return [rng.permutation(order[owner == k]).astype(np.int64) for k in range(num_clients)]


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, seed: int, *, balanced: bool = False
) -> list[np.ndarray]:
    """Label-skewed split: each class is divided between clients by proportions ~ Dir(alpha).

    Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
    Classification", arXiv:1909.06335. Small ``alpha`` gives each client few classes; large
    ``alpha`` approaches an IID split. The whole draw is repeated (from the same generator) until
    every client holds at least ``min_size`` samples.

    ``balanced=True`` is the "balanced" Dirichlet of NIID-Bench (Li et al., arXiv:2102.02079) and
    PFLlib: classes are dealt in ascending order, and a client that already holds ``>= N / K``
    samples gets proportion 0 of the next classes (the others' proportions renormalised). Client
    sizes stay near ``N / K`` and the classes dealt late fall to the few clients still below the
    cap, which concentrates them: a stronger label skew than the plain draw at the same ``alpha``.
    Invariant: a client's size before the last class it received was below ``N / K``, so every
    client holds fewer than ``N / K + n_c`` samples, ``n_c`` the size of that last class (fewer
    than ``N / K + max_c n_c``). Some client is always below the cap while a class remains (the
    dealt samples number fewer than ``N``), so the renormalisation never divides by zero.

    Args:
        labels: ``(N,)`` integer labels.
        num_clients: number of parts, ``1 <= num_clients <= N``.
        alpha: Dirichlet concentration, > 0.
        min_size: smallest acceptable client, ``0 <= min_size <= N / num_clients``.
        seed: seeds every draw.
        balanced: cap clients at ``N / num_clients`` as above (NIID-Bench / PFLlib).

    Returns:
        ``num_clients`` disjoint, shuffled ``(N_k,)`` int64 index arrays covering ``range(N)``.

    Raises:
        ConfigError: an argument is out of range, or no draw in :data:`MAX_DIRICHLET_ATTEMPTS`
            gave every client ``min_size`` samples.
    """
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(num_clients, n)
    if not alpha > 0:
        raise ConfigError(f"alpha must be > 0, got {alpha!r}; e.g. 0.1 (very skewed) to 100 (near IID)")
    require_int("min_size", min_size, 0, n // num_clients, note=f" for {n} samples and {num_clients} clients")
    rng = np.random.default_rng(seed)
    for _ in range(MAX_DIRICHLET_ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in _class_groups(labels, rng):
            props = rng.dirichlet(np.full(num_clients, float(alpha)))
            if balanced:
                full = np.array([sum(len(c) for c in p) >= n / num_clients for p in parts])
                while not props[~full].sum() > 0:  # tiny alpha: all the mass on full clients (underflow)
                    props = rng.dirichlet(np.full(num_clients, float(alpha)))
                props = np.where(full, 0.0, props) / props[~full].sum()
            cuts = np.round(np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        sizes = [sum(len(c) for c in p) for p in parts]
        if min(sizes) >= min_size:
            return [rng.permutation(np.concatenate(p)).astype(np.int64) for p in parts]
    raise ConfigError(
        f"no {'balanced ' if balanced else ''}Dirichlet(alpha={alpha}) split of {n} samples gave each of "
        f"{num_clients} clients >= {min_size} samples in {MAX_DIRICHLET_ATTEMPTS} draws; lower min_size or "
        "num_clients, raise alpha, or use more samples"
    )


def stratified_split(labels: np.ndarray, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Split indices into parts of the given fractions, keeping each part's label distribution.

    Part sizes are exactly ``diff(round(cumsum(fractions) * N))``. The indices are ordered class
    by class (each class shuffled, classes in random order) and the parts' slots are spread evenly
    along that order (slot j of part k sits at ``(j + 1/2) / N_k``), so every class is divided in
    the given fractions up to about one sample per part, with no rounding bias towards any part.

    Args:
        labels: ``(N,)`` integer labels.
        fractions: non-negative fractions summing to 1 (e.g. ``(0.7, 0.1, 0.2)`` for
            train/val/test).
        seed: seeds the shuffle.

    Returns:
        ``len(fractions)`` disjoint, shuffled int64 index arrays covering ``range(N)``.

    Raises:
        ConfigError: a fraction is negative or they do not sum to 1.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if (fr < 0).any() or not np.isclose(fr.sum(), 1.0):
        raise ConfigError(f"split fractions must be >= 0 and sum to 1, got {list(fractions)}")
    rng = np.random.default_rng(seed)
    groups = _class_groups(labels, rng)
    order = np.concatenate([np.zeros(0, np.int64), *(groups[i] for i in rng.permutation(len(groups)))])
    sizes = np.diff(np.round(np.concatenate([[0.0], np.cumsum(fr)]) * len(order))).astype(np.int64)
    slots = np.concatenate([np.zeros(0), *((np.arange(k) + 0.5) / k for k in sizes if k)])
    owner = np.repeat(np.arange(len(fr)), sizes)[np.argsort(slots, kind="stable")]
    return [rng.permutation(order[owner == k]).astype(np.int64) for k in range(len(fr))]


def natural_partition(
    groups: Sequence[str] | np.ndarray,
    clients_per_group: int = 1,
    seed: int = 0,
    labels: np.ndarray | None = None,
) -> tuple[list[str], list[np.ndarray]]:
    """One client per natural group (domain, site, subject), optionally split into several clients.

    Groups come in sorted order. A group split into ``clients_per_group`` clients is divided with
    :func:`iid_partition` (stratified by ``labels`` when given), so its clients differ in size by
    at most one and share its label distribution.

    Args:
        groups: ``(N,)`` group name (or id) of every sample.
        clients_per_group: clients per group, >= 1, at most the smallest group's size.
        seed: seeds the within-group split (unused when ``clients_per_group == 1``).
        labels: ``(N,)`` integer labels to stratify the within-group split by; None: unstratified.

    Returns:
        ``(names, parts)``: client names (the group, or ``"<group>#<j>"`` when split) and their
        disjoint, sorted-within-group int64 index arrays, together covering ``range(N)``.

    Raises:
        ConfigError: ``clients_per_group`` is not an integer in ``[1, smallest group size]``.
    """
    groups = np.asarray(groups)
    names_u, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    smallest = int(counts.min()) if len(counts) else 0
    require_int("clients_per_group", clients_per_group, 1, max(smallest, 1), note=" (the smallest group's size)")
    lab = np.zeros(len(groups), np.int64) if labels is None else np.asarray(labels)
    names: list[str] = []
    parts: list[np.ndarray] = []
    for g, name in enumerate(names_u):
        idx = np.flatnonzero(inverse == g)
        if clients_per_group == 1:
            names.append(str(name))
            parts.append(idx.astype(np.int64))
            continue
        for j, sub in enumerate(iid_partition(lab[idx], clients_per_group, seed + g)):
            names.append(f"{name}#{j}")
            parts.append(np.sort(idx[sub]).astype(np.int64))
    return names, parts


def client_splits(
    labels: np.ndarray, parts: Sequence[np.ndarray], fractions: Sequence[float], seed: int
) -> list[list[np.ndarray]]:
    """Split every client's indices into stratified parts (train/val/test) with :func:`stratified_split`.

    Args:
        labels: ``(N,)`` integer labels.
        parts: each client's int64 indices into ``labels``.
        fractions: e.g. ``(0.7, 0.1, 0.2)``; non-negative, summing to 1.
        seed: client k's split is seeded with ``seed + k``.

    Returns:
        Per client, ``len(fractions)`` disjoint int64 index arrays (into ``labels``) covering its part.
    """
    labels = np.asarray(labels)
    return [[p[s] for s in stratified_split(labels[p], fractions, seed + k)] for k, p in enumerate(parts)]


def leave_one_group_out(
    groups: Sequence[str] | np.ndarray, held_out: str
) -> tuple[list[str], list[np.ndarray], np.ndarray]:
    """Leave-one-domain-out: train on the other M-1 groups, test on ``held_out``.

    Args:
        groups: ``(N,)`` group (domain) name of every sample.
        held_out: the domain whose samples form the test set.

    Returns:
        ``(train_names, train_parts, test)``: the training groups in sorted order, their int64
        index arrays, and the held-out group's int64 indices.

    Raises:
        ConfigError: ``held_out`` is not a group, or it is the only one.
    """
    groups = np.asarray(groups).astype(str)
    names = sorted(set(groups.tolist()))
    if held_out not in names or len(names) < 2:
        raise ConfigError(
            f"held_out must be one of {', '.join(names)} (and at least 2 groups are needed), got {held_out!r}"
        )
    train = [n for n in names if n != held_out]
    return train, [np.flatnonzero(groups == n).astype(np.int64) for n in train], np.flatnonzero(groups == held_out)
