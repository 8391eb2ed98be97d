"""Payload validation and byte accounting."""

from __future__ import annotations

import math

import pytest
import torch

from fedaug.core.errors import PayloadError
from fedaug.core.payload import FUSED_MAX, TensorSpec, message_nbytes, part_nbytes, validate_part, value_extremes

SPEC = {"w": TensorSpec((2, 3), torch.float32), "n": TensorSpec((), torch.int64)}


def good():
    return {"w": torch.ones(2, 3), "n": torch.tensor(4)}


def test_valid_part_passes_unchanged():
    part = good()
    out = validate_part(part, SPEC, "uplink")
    assert out.keys() == part.keys() and out["w"] is part["w"]


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda p: p["w"].__setitem__((0, 1), float("nan")), r"'w' holds 1 non-finite value"),
        (lambda p: p["w"].__setitem__((1, 2), float("inf")), r"'w' holds 1 non-finite value"),
        (lambda p: p.__setitem__("w", torch.ones(3, 2)), r"'w' has shape \(3, 2\), expected \(2, 3\)"),
        (lambda p: p.__setitem__("w", torch.ones(2, 3, dtype=torch.float64)), r"'w' has dtype torch.float64"),
        (lambda p: p.pop("n"), r"missing 'n'"),
        (lambda p: p.__setitem__("extra", torch.ones(1)), r"unexpected 'extra'"),
        (lambda p: p.__setitem__("w", [1.0]), r"'w' must be a tensor, got list"),
    ],
)
def test_bad_parts_are_rejected_with_the_reason(mutate, match):
    part = good()
    mutate(part)
    with pytest.raises(PayloadError, match=r"^client 3: .*" + match):
        validate_part(part, SPEC, "client 3")


def test_all_problems_are_reported_at_once():
    part = {"w": torch.full((2, 2), float("nan"))}
    with pytest.raises(PayloadError) as info:
        validate_part(part, SPEC, "x")
    msg = str(info.value)
    assert "missing 'n'" in msg and "shape (2, 2)" in msg and "non-finite" in msg


def test_wildcard_dimension_accepts_any_size():
    spec = {"f": TensorSpec((None, 4), torch.float32)}
    validate_part({"f": torch.zeros(7, 4)}, spec, "x")
    with pytest.raises(PayloadError, match=r"expected \('\*', 4\)"):
        validate_part({"f": torch.zeros(7, 5)}, spec, "x")


def test_non_dict_part_is_rejected():
    with pytest.raises(PayloadError, match="expected a dict of tensors, got NoneType"):
        validate_part(None, SPEC, "x")


@pytest.mark.parametrize(
    "part, expected",
    [
        ({"a": torch.zeros(10)}, 40),                              # 10 float32
        ({"a": torch.zeros(3, 2, dtype=torch.float64)}, 48),       # 6 float64
        ({"a": torch.zeros(5, dtype=torch.int64), "b": torch.zeros(4, dtype=torch.float16)}, 48),
        ({}, 0),
    ],
)
def test_bytes_are_numel_times_element_size(part, expected):
    assert part_nbytes(part) == expected
    assert message_nbytes({"c": part}) == {"c": expected}


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_batched_extremes_flag_exactly_the_non_finite_tensors_and_bound_the_rest(seed, fused):
    """The extremes read in one batch per part (per tensor, or fused as on CUDA): a tensor is reported
    non-finite iff it holds a NaN or an inf of either sign (with their count), and every other tensor's
    range is its exact min and max."""
    g = torch.Generator().manual_seed(seed)
    part, spec = {}, {}
    for i in range(8):
        dtype = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool)[i % 5]
        t = (torch.randn(3, 4 + FUSED_MAX * (i == 1), generator=g) * 10).to(dtype)  # t1 is read alone, fused or not
        if dtype.is_floating_point and torch.rand((), generator=g) < 0.5:
            for bad in torch.tensor([math.nan, math.inf, -math.inf])[torch.rand(3, generator=g) < 0.5]:
                t.view(-1)[int(torch.randint(t.numel(), (), generator=g))] = bad
        part[f"t{i}"], spec[f"t{i}"] = t, TensorSpec(tuple(t.shape), dtype)
    extremes = value_extremes(part, fused=fused)
    for name, t in part.items():
        finite = bool(torch.isfinite(t).all())
        assert extremes[name] == (float(t.min()), float(t.max())) if finite else math.isnan(extremes[name][0])
    non_finite = {n: int((~torch.isfinite(t)).sum()) for n, t in part.items() if not torch.isfinite(t).all()}
    if not non_finite:
        assert validate_part(part, spec, "uplink") == part
        return
    with pytest.raises(PayloadError) as err:
        validate_part(part, spec, "uplink")
    assert err.value.args[0].count("non-finite") == len(non_finite)
    for name, count in non_finite.items():
        assert f"'{name}' holds {count} non-finite value(s)" in err.value.args[0]
