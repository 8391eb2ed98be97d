"""Properties of the label-skew, size-skew and scarcity partitioners, and the group partitioners."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedaug.core.errors import ConfigError
from fedaug.data.partition import client_splits, leave_one_group_out, natural_partition
from fedaug.data.partition_skew import (
    fraction_subset,
    power_law_sizes,
    quantity_partition,
    scarcity_num_clients,
    scarcity_partition,
    shard_partition,
    size_skew_partition,
)

seed_st = st.integers(0, 2**32 - 1)
# (N,) labels with every class 0..C-1 present at least `per` times
balanced_st = st.tuples(st.integers(2, 10), st.integers(4, 40)).map(lambda t: np.arange(t[0] * t[1]) % t[0])


def assert_disjoint(parts: list[np.ndarray], n: int, cover: bool = True) -> None:
    joined = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts) and len(joined) == len(np.unique(joined))
    assert joined.min(initial=0) >= 0 and joined.max(initial=0) < max(n, 1)
    if cover:
        assert len(joined) == n


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@settings(max_examples=50, deadline=None)
@given(labels=balanced_st, num_clients=st.integers(1, 12), q=st.integers(1, 10), seed=seed_st)
def test_quantity_exactly_q_classes(labels: np.ndarray, num_clients: int, q: int, seed: int) -> None:
    c = len(np.unique(labels))
    q = min(q, c)
    num_clients = min(num_clients, (len(labels) // c) * c // q)  # enough samples per holder
    parts = quantity_partition(labels, num_clients, q, seed)
    assert len(parts) == num_clients
    assert_disjoint(parts, len(labels), cover=num_clients * q >= c)
    assert all(len(np.unique(labels[p])) == q for p in parts)
    holders = np.bincount(np.concatenate([np.unique(labels[p]) for p in parts]), minlength=c)
    assert holders.max() - holders.min() <= 1  # balanced class holders
    assert same(parts, quantity_partition(labels, num_clients, q, seed))


@settings(max_examples=50, deadline=None)
@given(labels=balanced_st, num_clients=st.integers(1, 10), spc=st.integers(1, 4), seed=seed_st)
def test_shards_properties(labels: np.ndarray, num_clients: int, spc: int, seed: int) -> None:
    num_clients = min(num_clients, len(labels) // spc)
    parts = shard_partition(labels, num_clients, spc, seed)
    assert_disjoint(parts, len(labels))
    if -(-len(labels) // (num_clients * spc)) <= np.bincount(labels).min():  # shards within class size
        assert all(len(np.unique(labels[p])) <= 2 * spc for p in parts)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= spc
    assert same(parts, shard_partition(labels, num_clients, spc, seed))


def test_shards_whole_class_shards_give_at_most_spc_classes() -> None:
    labels = np.arange(1000) % 10  # 100 per class, 20 shards of 50
    for seed in range(5):
        parts = shard_partition(labels, 10, 2, seed)
        assert all(len(np.unique(labels[p])) <= 2 for p in parts)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 2000), num_clients=st.integers(1, 30), exponent=st.floats(0, 3), seed=seed_st)
def test_power_law_sizes(n: int, num_clients: int, exponent: float, seed: int) -> None:
    num_clients = min(num_clients, n)
    min_size = n // num_clients // 2
    sizes = power_law_sizes(n, num_clients, exponent, min_size, seed)
    assert sizes.sum() == n and sizes.min() >= min_size and len(sizes) == num_clients
    parts = size_skew_partition(np.zeros(n, np.int64), num_clients, exponent, min_size, seed)
    assert_disjoint(parts, n)
    assert sorted(len(p) for p in parts) == sorted(sizes.tolist())


def test_power_law_is_skewed_and_exponent_zero_is_equal() -> None:
    assert power_law_sizes(100, 4, 0.0, 0, 0).tolist() == [25] * 4
    sizes = np.sort(power_law_sizes(10_000, 10, 1.5, 0, 0))[::-1]
    assert sizes[0] > 10 * sizes[-1]
    expected = np.arange(1, 11) ** -1.5 / (np.arange(1, 11) ** -1.5).sum() * 10_000
    assert np.abs(sizes - expected).max() < 1  # largest-remainder rounding


@settings(max_examples=30, deadline=None)
@given(labels=balanced_st, mean_size=st.integers(5, 60), seed=seed_st)
def test_scarcity_client_count(labels: np.ndarray, mean_size: int, seed: int) -> None:
    mean_size = min(mean_size, len(labels))
    k = scarcity_num_clients(len(labels), mean_size)
    assert k == max(1, round(len(labels) / mean_size))
    for kwargs in ({}, {"alpha": 1.0}):
        parts = scarcity_partition(labels, mean_size, seed, **kwargs)
        assert len(parts) == k
        assert_disjoint(parts, len(labels))


def test_scarcity_flea_levels() -> None:
    assert [scarcity_num_clients(50_000, m) for m in (5000, 500, 100)] == [10, 100, 500]  # FLea App. C
    labels = np.arange(1000) % 10
    parts = scarcity_partition(labels, 100, 0, q=3)
    assert len(parts) == 10 and all(len(np.unique(labels[p])) == 3 for p in parts)
    with pytest.raises(ConfigError, match=r"not both"):
        scarcity_partition(labels, 100, 0, alpha=1.0, q=3)


@settings(max_examples=40, deadline=None)
@given(labels=balanced_st, fraction=st.sampled_from([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0]), seed=seed_st)
def test_fraction_subset(labels: np.ndarray, fraction: float, seed: int) -> None:
    parts = np.array_split(np.random.default_rng(seed).permutation(len(labels)), 3)
    kept = fraction_subset(labels, parts, fraction, seed)
    for p, k in zip(parts, kept, strict=True):
        assert set(k.tolist()) <= set(p.tolist()) and len(k) == round(fraction * len(p))
    assert same(kept, fraction_subset(labels, parts, fraction, seed))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(2, 30), min_size=1, max_size=6), cpg=st.integers(1, 2), seed=seed_st)
def test_natural_partition(sizes: list[int], cpg: int, seed: int) -> None:
    groups = np.repeat([f"g{i}" for i in range(len(sizes))], sizes)
    labels = np.arange(len(groups)) % 3
    names, parts = natural_partition(groups, cpg, seed, labels)
    assert len(names) == len(parts) == len(sizes) * cpg
    assert_disjoint(parts, len(groups))
    for name, p in zip(names, parts, strict=True):
        assert set(groups[p].tolist()) == {name.split("#")[0]}
    assert same(parts, natural_partition(groups, cpg, seed, labels)[1])


def test_natural_partition_names_and_errors() -> None:
    groups = np.array(["b", "a", "b", "a", "b"])
    assert natural_partition(groups)[0] == ["a", "b"]
    assert natural_partition(groups, 2, 0)[0] == ["a#0", "a#1", "b#0", "b#1"]
    with pytest.raises(ConfigError, match=r"clients_per_group must be an integer in \[1, 2\].*got 3"):
        natural_partition(groups, 3)


def test_client_splits_and_leave_one_out() -> None:
    labels = np.arange(200) % 4
    parts = [np.arange(0, 100), np.arange(100, 200)]
    splits = client_splits(labels, parts, (0.7, 0.1, 0.2), seed=0)
    for p, (tr, va, te) in zip(parts, splits, strict=True):
        assert (len(tr), len(va), len(te)) == (70, 10, 20)
        assert sorted(np.concatenate([tr, va, te]).tolist()) == p.tolist()
    groups = np.array(["x", "y", "z", "y", "x"])
    names, train, test = leave_one_group_out(groups, "y")
    assert names == ["x", "z"] and [t.tolist() for t in train] == [[0, 4], [2]] and test.tolist() == [1, 3]
    with pytest.raises(ConfigError, match=r"held_out must be one of x, y, z.*got 'w'"):
        leave_one_group_out(groups, "w")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: quantity_partition(np.arange(10) % 5, 2, 6, 0), r"q must be an integer in \[1, 5\]"),
        (lambda: quantity_partition(np.arange(10) % 5, 10, 5, 0), r"class 0 \(2 samples, 10 clients\)"),
        (lambda: shard_partition(np.arange(10), 3, 4, 0), r"shards_per_client must be an integer in \[1, 3\]"),
        (lambda: power_law_sizes(10, 2, -1.0, 0, 0), r"exponent must be a number >= 0"),
        (lambda: power_law_sizes(10, 2, 1.0, 6, 0), r"min_size must be an integer in \[0, 5\]"),
        (lambda: scarcity_num_clients(10, 0), r"mean_size must be an integer in \[1, 10\]"),
        (lambda: fraction_subset(np.zeros(3), [np.arange(3)], 0.0, 0), r"fraction must be in \(0, 1\]"),
    ],
)
def test_errors_name_value_and_range(call, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


def test_other_seed_gives_other_split() -> None:
    labels = np.arange(600) % 10
    for fn in (
        lambda s: quantity_partition(labels, 10, 3, s),
        lambda s: shard_partition(labels, 10, 2, s),
        lambda s: size_skew_partition(labels, 10, 1.0, 5, s),
        lambda s: scarcity_partition(labels, 60, s, alpha=0.5),
        lambda s: natural_partition(labels.astype(str), 2, s, labels)[1],
    ):
        assert not same(fn(1), fn(2))
