"""Values against annotations: golden tables of what fits and how the allowed values are worded."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from fedaug.core.typecheck import allowed, annotations_of, fits, is_numeric

if TYPE_CHECKING:
    from decimal import Decimal


@pytest.mark.parametrize("value, tp, ok", [
    (3, int, True), (np.int64(3), int, True), (2.5, int, False), (3.0, int, False), (True, int, False),
    (2, float, True), (0.5, float, True), (np.float32(0.5), float, True), (math.nan, float, False),
    (math.inf, float, False), (-math.inf, float, False), (False, float, False), ("0.5", float, False),
    (True, bool, True), (1, bool, False), (np.bool_(True), bool, False),
    ("a", str, True), (Path("a"), str, False), (Path("a"), str | os.PathLike[str], True),
    (None, float | None, True), (None, float, False), (0.5, float | None, True),
    ([1, 2], list[int], True), ((1, 2), tuple[int, ...], True), ([1, 2.5], list[int], False), ("ab", Sequence[str], False),
    (["a"], Sequence[str] | None, True), (0.5, Sequence[float] | float, True), ([0.5, math.nan], Sequence[float] | float, False),
    ({"a": {}}, dict[str, dict[str, Any]], True), ({"a": 1}, dict[str, dict[str, Any]], False), ({"a": 1}, dict[str, Any], True),
    (object(), Any, True), ((1, "a"), tuple[int, str], True),
])  # fmt: skip
def test_fits(value, tp, ok):
    assert fits(value, tp) is ok


@pytest.mark.parametrize("tp, text", [
    (int, "an integer"), (float, "a finite number"), (bool, "true or false"), (str, "a string"),
    (float | None, "a finite number"), (str | os.PathLike[str], "a string or a path"),
    (list[int] | tuple[int, ...], "a list of integers"), (Sequence[float] | float, "a list of finite numbers or a finite number"),
    (dict[str, Any], "a table"), (dict[str, dict[str, Any]], "a table of tables"), (list[Any], "a list"),
])  # fmt: skip
def test_allowed(tp, text):
    assert allowed(tp) == text


def test_unchecked_annotations_have_no_wording():
    with pytest.raises(TypeError, match="is not an annotation that fits"):
        allowed(Any)


@pytest.mark.parametrize("tp, numeric", [
    (int, True), (float | None, True), (Sequence[float] | float, True), (list[int], True), (bool, True),
    (str, False), (Sequence[str] | None, False), (Any, False),
])  # fmt: skip
def test_is_numeric(tp, numeric):
    assert is_numeric(tp) is numeric


def test_annotations_that_cannot_be_resolved_leave_the_values_unchecked():
    def fn(*, a: Decimal = 1) -> None:
        """A builder whose annotation names a type imported only for type checkers."""

    def typed(*, a: int = 1) -> None:
        """A builder with a plain annotation."""

    assert annotations_of(fn) == {} and annotations_of(typed) == {"a": int, "return": type(None)}
