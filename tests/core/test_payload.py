"""Payload validation and byte accounting."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from fedaug.core.errors import PayloadError
from fedaug.core.payload import (
    FUSED_MAX,
    Against,
    PassedParts,
    TensorSpec,
    counterpart,
    distance,
    host_values,
    message_nbytes,
    norm_bounded,
    part_nbytes,
    validate_part,
    value_extremes,
)

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


def _exact_problems(part, spec, max_abs):
    """validate_part's verdict the slow way: every tensor's extremes read (no norm shortcut)."""
    problems = []
    sizes: dict[str, int] = {}
    for name in sorted(spec):
        t = part[name]
        lo_hi = (float(t.min()), float(t.max())) if torch.isfinite(t).all() else (math.nan, math.nan)
        problems += spec[name].problems(name, t, max_abs, sizes, lo_hi)
    return problems


@pytest.mark.parametrize("seed", range(40))
def test_the_norm_shortcut_never_passes_what_reading_the_extremes_refuses(seed):
    """norm_bounded is one-sided: a tensor it passes holds finite values within the bound, so
    validate_part's verdict and message equal those of reading every tensor's extremes."""
    g = torch.Generator().manual_seed(seed)
    bound = float(10 ** torch.randint(-1, 7, (), generator=g))
    part, spec = {}, {}
    for i in range(6):
        dtype = (torch.float32, torch.float64)[i % 2]
        scale = bound * float(torch.rand((), generator=g)) * (0.3 if i % 3 else 3.0)  # some near or over it
        t = (torch.randn(int(torch.randint(1, 300, (), generator=g)), generator=g) * scale).to(dtype)
        if torch.rand((), generator=g) < 0.3:
            t[int(torch.randint(t.numel(), (), generator=g))] = (math.nan, math.inf, -math.inf, bound * 1.0001)[i % 4]
        part[f"t{i}"], spec[f"t{i}"] = t, TensorSpec(tuple(t.shape), dtype)
    want = _exact_problems(part, spec, bound)
    if want:
        with pytest.raises(PayloadError) as err:
            validate_part(part, spec, "up", bound)
        assert err.value.args[0] == "up: " + "; ".join(want)
    else:
        assert validate_part(part, spec, "up", bound) == part


def test_norm_bounded_takes_only_what_its_norm_proves():
    big = torch.full((4,), 0.6)  # norm 1.2: every |value| <= 1.2 <= 2.5, the half of 5
    assert norm_bounded({"a": big, "b": big.double()}, 5.0) == {"a", "b"}
    assert norm_bounded({"a": big}, 2.0) == set()  # 1.2 > 1.0: not proven (it would pass; the extremes decide)
    assert norm_bounded({"nan": torch.tensor([1.0, math.nan]), "inf": torch.tensor([math.inf])}, None) == set()
    assert norm_bounded({"huge": torch.tensor([3e38, 3e38])}, None) == set()  # the square overflows: not proven
    assert norm_bounded({"half": big.half(), "int": torch.ones(3, dtype=torch.int64),
                         "strided": torch.ones(4, 4)[:, 0], "empty": torch.ones(0)}, 10.0) == set()
    assert norm_bounded({"free": big}, None) == {"free"}


def test_a_spec_with_a_range_reads_the_extremes_however_small_the_norm():
    spec = {"var": TensorSpec((2,), torch.float32, low=0.0)}
    with pytest.raises(PayloadError, match=r"'var' holds -0\.001, below its smallest allowed value 0"):
        validate_part({"var": torch.tensor([0.5, -0.001])}, spec, "up", 1e6)


def test_passed_parts_reads_the_same_unchanged_tensors_once():
    spec = {"w": TensorSpec((2, 3), torch.float32)}
    w = torch.ones(2, 3)
    checked = PassedParts()
    checked.validate({"w": w}, spec, "down", "train")
    w.view(-1)[0] = math.nan  # an in-place write bumps the version: read again, refused
    with pytest.raises(PayloadError, match="'w' holds 1 non-finite"):
        checked.validate({"w": w}, spec, "down", "train")
    v = torch.ones(2, 3)
    checked.validate({"w": v}, spec, "down", "train")
    with torch.no_grad():
        v.mul_(math.inf)
    with pytest.raises(PayloadError, match="non-finite"):
        checked.validate({"w": v}, spec, "down", "train")
    u = torch.ones(2, 3)
    checked.validate({"w": u}, spec, "down", "train")
    with pytest.raises(PayloadError, match="has shape"):  # another key's spec is checked, not assumed
        checked.validate({"w": u}, {"w": TensorSpec((3, 2), torch.float32)}, "down", "query")
    with pytest.raises(PayloadError, match="missing 'x'"):
        checked.validate({"w": u}, {**spec, "x": TensorSpec((), torch.float32)}, "down", "train")


def test_passed_parts_skips_the_read_for_a_tensor_that_passed(monkeypatch):
    from fedaug.core import payload

    spec = {"w": TensorSpec((2, 3), torch.float32)}
    w = torch.ones(2, 3)
    checked = PassedParts()
    checked.validate({"w": w}, spec, "down", "train")
    calls = []
    monkeypatch.setattr(payload, "validate_part", lambda *a, **k: calls.append(a))
    checked.validate({"w": w}, spec, "down", "train")
    checked.validate({"w": w}, spec, "down", "evaluate")  # another key: checked
    assert len(calls) == 1


@pytest.mark.parametrize("seed", range(40))
def test_the_distance_shortcut_never_passes_what_reading_the_extremes_refuses(seed, server_path):
    """Against (an upload checked against what was sent) is one-sided too, on both of the server's
    paths: the verdict and message are those of reading every extreme, and each measured distance is
    ||t - r|| (float32 entries: the float32 rounding of the norm of the float32 differences), ||t|| for
    an entry without a counterpart; a counterpart of another dtype is left to the screen (not measured)."""
    g = torch.Generator().manual_seed(seed)
    bound = float(10 ** torch.randint(0, 7, (), generator=g))
    part, spec, sent = {}, {}, {}
    for i in range(6):
        dtype = (torch.float32, torch.float64)[i % 2]
        n = int(torch.randint(1, 300, (), generator=g))
        r = (torch.randn(n, generator=g) * bound * float(torch.rand((), generator=g)) * 0.4).to(dtype)
        t = r + (torch.randn(n, generator=g) * bound * float(torch.rand((), generator=g)) * (0.05 if i % 3 else 2.0)).to(dtype)
        if torch.rand((), generator=g) < 0.3:
            t[int(torch.randint(n, (), generator=g))] = (math.nan, math.inf, -math.inf, bound * 1.0001)[i % 4]
        if i == 5 and torch.rand((), generator=g) < 0.5:
            r = r[:-1] if n > 1 else r.double()  # no counterpart: its own norm; another dtype: not measured
        part[f"t{i}"], spec[f"t{i}"], sent[f"t{i}"] = t, TensorSpec(tuple(t.shape), dtype), r
    against = Against(sent, {})
    want = _exact_problems(part, spec, bound)
    validate_ok = not want
    if want:
        with pytest.raises(PayloadError) as err:
            validate_part(part, spec, "up", bound, against)
        assert err.value.args[0] == "up: " + "; ".join(want)
    else:
        assert validate_part(part, spec, "up", bound, against) == part
    assert set(against.distances) == {n for n in part if sent[n].dtype == part[n].dtype or not counterpart(part[n], sent[n])}
    for name, d in against.distances.items():
        t, r = part[name], sent[name]
        diff = t - r if counterpart(t, r) else t
        exact = float(diff.double().norm()) if t.dtype == torch.float32 else float(diff.norm())
        if t.dtype == torch.float32:
            exact = float(torch.tensor(exact, dtype=torch.float32))
        assert d == exact or (math.isnan(d) and math.isnan(exact)) or (not math.isfinite(exact) and not validate_ok)


def test_a_ranged_entry_is_measured_but_its_range_is_still_read(server_path):
    spec = {"var": TensorSpec((2,), torch.float32, low=0.0)}
    against = Against({"var": torch.tensor([0.5, 0.0])}, {})
    with pytest.raises(PayloadError, match=r"'var' holds -0\.001, below its smallest allowed value 0"):
        validate_part({"var": torch.tensor([0.5, -0.001])}, spec, "up", 1e6, against)
    assert against.distances == {"var": pytest.approx(0.001)}


def test_distances_of_accelerator_style_pairs_follow_the_same_rule_without_the_library(no_server_library):
    """The buffer path (every device; on accelerators one synchronisation per part) records what
    :func:`distance` gives: float32 entries the float32 rounding of the float64 norm of the float32
    differences, float64 entries their float64 norm; an entry without a counterpart, its own norm."""
    g = torch.Generator().manual_seed(3)
    part = {"a": torch.randn(50, generator=g), "b": torch.randn(4, 5, generator=g, dtype=torch.float64),
            "c": torch.randn(3, generator=g)}
    sent = {"a": torch.randn(50, generator=g), "b": torch.randn(4, 5, generator=g, dtype=torch.float64)}
    against = Against(sent, {})
    spec = {n: TensorSpec(tuple(t.shape), t.dtype) for n, t in part.items()}
    validate_part(part, spec, "up", 1e6, against)
    assert set(against.distances) == {"a", "b", "c"}
    assert against.distances["a"] == float(torch.tensor(float((part["a"] - sent["a"]).double().norm()), dtype=torch.float32))
    assert against.distances["b"] == float((part["b"] - sent["b"]).norm())
    assert against.distances["c"] == float(torch.tensor(float(part["c"].double().norm()), dtype=torch.float32))
    assert against.distances == {"a": distance(part["a"], sent["a"]), "b": distance(part["b"], sent["b"]),
                                 "c": distance(part["c"])}


def test_host_values_are_exact_and_read_once(monkeypatch):
    """Every value comes back exactly (float64 bit patterns, int64 beyond 2**53, float32, booleans, NaN, -0.0,
    subnormals), 0-d tensors as numbers and the others as flat lists, with one ``tolist`` for the device."""
    tensors = {
        "f64": torch.tensor([0.1, -0.0, 5e-324, math.inf, 1.7976931348623157e308], dtype=torch.float64),
        "nan": torch.tensor(math.nan, dtype=torch.float64),
        "i64": torch.tensor([2**62 + 1, -(2**53) - 1, 0]),
        "f32": torch.tensor([[1 / 3, -2.5]], dtype=torch.float32),
        "flag": torch.tensor(True),
        "empty": torch.zeros(0),
    }
    want = tensors["f64"].tolist()
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or original(t))
    got = host_values(tensors)
    assert len(reads) == 1
    assert [struct.pack("<d", x) for x in got["f64"]] == [struct.pack("<d", x) for x in want]  # -0.0 kept
    assert math.isnan(got["nan"])
    assert got["i64"] == [2**62 + 1, -(2**53) - 1, 0] and all(type(x) is int for x in got["i64"])
    assert got["f32"] == [float(torch.tensor(1 / 3, dtype=torch.float32)), -2.5]
    assert got["flag"] == 1 and got["empty"] == []
