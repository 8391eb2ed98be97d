"""Golden messages of the shared option checks (fedaug.data.checks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedaug.core.errors import ConfigError
from fedaug.data.checks import check_fraction, check_fractions, check_int, is_int, raise_problems, require_int


def test_is_int() -> None:
    assert is_int(3) and is_int(-1) and is_int(0)
    assert not is_int(True) and not is_int(3.0) and not is_int("3") and not is_int(None)
    assert not is_int(np.int64(3)) and is_int(np.int64(3), numpy=True) and not is_int(np.bool_(True), numpy=True)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("size", 4, 8), {}, "size must be an integer >= 8, got 4"),
        (("size", 8.0, 8), {}, "size must be an integer >= 8, got 8.0"),
        (("window", True, 1), {}, "window must be an integer >= 1, got True"),
        (("size", 300, 8, 256), {}, "size must be an integer in [8, 256], got 300"),
        (("n", 5, 10, math.inf), {"note": " for ('mnist',)"}, "n must be an integer in [10, inf] for ('mnist',), got 5"),
        (("q", 6, 1, 5), {"note": " (the number of classes)"}, "q must be an integer in [1, 5] (the number of classes), got 6"),
        (("q", np.int64(6), 1, 5), {}, "q must be an integer in [1, 5], got np.int64(6)"),
        (("x", "3", 0), {}, "x must be an integer >= 0, got '3'"),
    ],
)
def test_check_int_messages(args: tuple, kwargs: dict, message: str) -> None:
    problems = ["earlier"]
    assert check_int(problems, *args, **kwargs) is False
    assert problems == ["earlier", message]


def test_check_int_accepts() -> None:
    problems: list[str] = []
    assert check_int(problems, "size", 8, 8) and check_int(problems, "size", 256, 8, 256)
    assert check_int(problems, "q", np.int64(2), 1, 5, numpy=True) and check_int(problems, "n", 10**9, 10, math.inf)
    assert problems == []


def test_require_int() -> None:
    require_int("num_clients", 1, 1)
    with pytest.raises(ConfigError) as e:
        require_int("min_size", 6, 0, 5, note=" for 10 samples and 2 clients")
    assert str(e.value) == "min_size must be an integer in [0, 5] for 10 samples and 2 clients, got 6"


@pytest.mark.parametrize(
    ("v", "kwargs", "message"),
    [
        (1.0, {}, "val_fraction must be in [0, 1), got 1.0"),
        (-0.1, {}, "val_fraction must be in [0, 1), got -0.1"),
        ("0.1", {}, "val_fraction must be in [0, 1), got '0.1'"),
        (0.0, {"interval": "(0, 1]"}, "val_fraction must be in (0, 1], got 0.0"),
        (2, {"interval": "(0, 1]", "note": " (e.g. 1/6 ... 1)"}, "val_fraction must be in (0, 1] (e.g. 1/6 ... 1), got 2"),
    ],
)
def test_check_fraction_messages(v: object, kwargs: dict, message: str) -> None:
    problems: list[str] = []
    assert check_fraction(problems, "val_fraction", v, **kwargs) is False
    assert problems == [message]


def test_check_fraction_accepts_and_rejects_unknown_interval() -> None:
    problems: list[str] = []
    assert check_fraction(problems, "f", 0, interval="[0, 1)") and check_fraction(problems, "f", 1, interval="(0, 1]")
    assert problems == []
    with pytest.raises(ValueError, match=r"interval must be"):
        check_fraction(problems, "f", 0.5, interval="[0, 1]")


@pytest.mark.parametrize(
    ("val", "test", "messages"),
    [
        (0.1, 0.2, []),
        (0.9, 0.0, []),
        (0.5, 0.5, ["val_fraction + test_fraction must be < 1 (the rest is the train share), got 0.5 + 0.5; "
                    "lower one of them"]),
        (1.5, 0.2, ["val_fraction must be in [0, 1), got 1.5"]),
        (0.1, -1, ["test_fraction must be in [0, 1), got -1"]),
        (None, 1.0, ["val_fraction must be in [0, 1), got None", "test_fraction must be in [0, 1), got 1.0"]),
    ],
)
def test_check_fractions_messages(val: object, test: object, messages: list[str]) -> None:
    problems: list[str] = []
    assert check_fractions(problems, val, test) is (not messages)
    assert problems == messages


def test_check_fractions_test_defaults_to_zero() -> None:
    problems: list[str] = []
    assert check_fractions(problems, 0.99) and not check_fractions(problems, 1.0)
    assert problems == ["val_fraction must be in [0, 1), got 1.0"]


def test_raise_problems() -> None:
    raise_problems("digits4", [])
    with pytest.raises(ConfigError) as e:
        raise_problems("digits4", ["channels must be 1 or 3, got 2", "size must be an integer >= 8, got 4"])
    assert str(e.value) == "digits4: channels must be 1 or 3, got 2; size must be an integer >= 8, got 4"
