"""Payload validation and byte accounting."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import PayloadError
from fedaug.core.payload import TensorSpec, message_nbytes, part_nbytes, validate_part

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
