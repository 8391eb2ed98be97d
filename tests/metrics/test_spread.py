"""The spread of a metric across clients: golden values computed with numpy, and its invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedaug.metrics.spread import client_spread, worst_count


@pytest.mark.parametrize("values, worst", [
    ([0.9], [0.9]),                                   # 1 client: it is its own worst 10 %
    ([0.9, 0.5, 0.7, 0.8], [0.5]),                    # 4 clients: ceil(0.4) = 1
    ([0.1 * k for k in range(10)], [0.0]),            # 10 clients: exactly 1
    ([0.05 * k for k in range(11)], [0.0, 0.05]),     # 11 clients: ceil(1.1) = 2
    ([1.0, 0.2, 0.6, 0.3] * 5, [0.2, 0.2]),           # 20 clients: 2, ties kept
])
def test_spread_equals_numpy(values, worst):
    out = client_spread(values)
    assert out["std"] == pytest.approx(np.std(values, ddof=0), abs=1e-15)
    assert out["min"] == np.min(values)
    assert out["worst10"] == pytest.approx(np.mean(worst), abs=1e-15)


def test_no_clients_gives_none_and_a_nan_client_is_the_worst():
    assert client_spread([]) == {"std": None, "min": None, "worst10": None}
    out = client_spread([0.8, math.nan, 0.6])
    assert math.isnan(out["min"]) and math.isnan(out["worst10"]) and math.isnan(out["std"])


def test_worst_count_is_ceil_of_a_tenth_and_at_least_one():
    assert [worst_count(n) for n in (1, 9, 10, 11, 19, 20, 21, 100, 101)] == [1, 1, 1, 2, 2, 2, 3, 10, 11]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_order_min_worst10_mean(values):
    out = client_spread(values)
    mean = sum(values) / len(values)
    assert out["min"] <= out["worst10"] + 1e-12 and out["worst10"] <= mean + 1e-12
    assert out == client_spread(list(reversed(values)))
    assert out["std"] >= 0
