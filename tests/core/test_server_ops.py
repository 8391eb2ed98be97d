"""The compiled server library (fedaug.core.server_ops): the same bits as its PyTorch path, used only
where it is built."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedaug.core import native, server_ops
from fedaug.methods.base.fedavg import weighted_average


def _uploads(dtype: torch.dtype, n: int, k: int, seed: int) -> list[torch.Tensor]:
    """``k`` tensors of ``n`` values over many magnitudes, with signed zeros and subnormals."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(k):
        t = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-40, 36, (n,), generator=g)
        t = t.to(dtype)
        t[:: 7] = -0.0
        t[3:: 11] = torch.finfo(dtype).tiny / 8  # subnormal
        out.append(t)
    return out


@pytest.mark.usefixtures("server_library")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "k"), [(1, 9), (1023, 9), (1024, 9), (1025, 9), (5000, 9), (16383, 8), (16384, 1),
                                      (16385, 7), (40000, 17), (300, 16)])
def test_weighted_sum_gives_the_bits_of_the_pytorch_path(dtype, n, k, monkeypatch):
    """Every length about the library's chunk (16,384 values), and every client count about its blocks of
    eight clients a pass (fewer, exact multiples, a tail)."""
    tensors = _uploads(dtype, n, k, seed=n)
    g = torch.Generator().manual_seed(1)
    w = torch.rand(k, generator=g, dtype=torch.float64)
    weights = (w / w.sum()).tolist()
    compiled = server_ops.weighted_sum(tensors, weights)
    monkeypatch.setitem(server_ops._STATE, "ops", None)
    reference = server_ops.weighted_sum(tensors, weights)
    assert compiled.dtype == torch.float64 and compiled.shape == (n,)
    assert torch.equal(compiled.view(torch.int64), reference.view(torch.int64))  # every bit, signed zeros too


@pytest.mark.usefixtures("server_library")
def test_weighted_sum_keeps_non_finite_values_as_pytorch_does(monkeypatch):
    tensors = [torch.tensor([1.0, math.inf, 0.0]), torch.tensor([-math.inf, 1.0, math.nan])]
    compiled = server_ops.weighted_sum(tensors, [0.25, 0.75])
    monkeypatch.setitem(server_ops._STATE, "ops", None)
    reference = server_ops.weighted_sum(tensors, [0.25, 0.75])
    assert torch.equal(compiled.isnan(), reference.isnan())
    assert torch.equal(compiled.nan_to_num(0.0), reference.nan_to_num(0.0))


@pytest.mark.usefixtures("server_library")
def test_weighted_average_is_fedavgs_float64_mean_on_both_paths(monkeypatch):
    """Golden values computed by hand: (1*2 + 3*6) / (1 + 3) = 5 and (1*0.5 + 3*(-1.5)) / 4 = -1."""
    tensors = [torch.tensor([2.0, 0.5]), torch.tensor([6.0, -1.5])]
    assert weighted_average(tensors, [1.0, 3.0]).tolist() == [5.0, -1.0]
    monkeypatch.setitem(server_ops._STATE, "ops", None)
    assert weighted_average(tensors, [1.0, 3.0]).tolist() == [5.0, -1.0]


@pytest.mark.usefixtures("server_library")
def test_tensors_the_library_does_not_take_use_the_pytorch_path():
    half = [torch.tensor([1.0, 2.0], dtype=torch.float16), torch.tensor([3.0, 4.0], dtype=torch.float16)]
    assert server_ops.weighted_sum(half, [0.5, 0.5]).tolist() == [2.0, 3.0]
    strided = [torch.arange(6.0).view(2, 3).t(), torch.ones(3, 2)]
    assert server_ops.weighted_sum(strided, [1.0, 1.0]).tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]


@pytest.mark.usefixtures("server_library")
def test_upload_stats_reads_the_distance_and_the_extremes_in_one_pass():
    ops = server_ops.loaded()
    g = torch.Generator().manual_seed(0)
    for n in (1, 15, 16, 17, 1000, 40_001):
        t = torch.randn(n, generator=g) * 3
        r = t + 0.01 * torch.randn(n, generator=g)
        squares, lo, hi = ops.upload_stats([t], [r]).tolist()[0]
        exact = float(((t - r).double() ** 2).sum())  # float32 differences, exact float64 squares
        assert math.isclose(squares, exact, rel_tol=1e-13)
        assert (lo, hi) == (float(t.min()), float(t.max()))
    for bad in (math.nan, math.inf, -math.inf):
        t = torch.randn(37, generator=g)
        t[20] = bad
        assert all(math.isnan(v) for v in ops.upload_stats([t], [torch.zeros(37)]).tolist()[0])
    with pytest.raises(RuntimeError, match="non-empty contiguous float32 CPU pairs of equal size"):
        ops.upload_stats([torch.zeros(3, dtype=torch.float64)], [torch.zeros(3, dtype=torch.float64)])


def _squares_in_order(t: torch.Tensor, r: torch.Tensor) -> float:
    """The library's stated order, in numpy float64: element i's exact square (of the float32 difference) into
    lane i % 16 of the whole blocks of 16, each lane a serial sum; the tail into lane 0; then lane j += lane
    j + w/2 for w = 16, 8, 4, 2."""
    sq = ((t - r).double() ** 2).numpy()
    body = len(sq) - len(sq) % 16
    lanes = np.zeros(16)
    for i in range(0, body, 16):
        lanes = lanes + sq[i:i + 16]
    for v in sq[body:]:
        lanes[0] = lanes[0] + v
    width = 16
    while width > 1:
        lanes[: width // 2] = lanes[: width // 2] + lanes[width // 2 : width]
        width //= 2
    return float(lanes[0])


@pytest.mark.usefixtures("server_library")
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 4099])
def test_upload_stats_sums_the_squares_in_its_stated_order_bit_for_bit(n):
    """The recorded update norms depend on the float64 sum's last bits: the library keeps one order on every CPU."""
    g = torch.Generator().manual_seed(n)
    t = torch.randn(n, generator=g) * 10.0 ** torch.randint(-6, 6, (n,), generator=g)
    r = t + torch.randn(n, generator=g)
    squares = server_ops.loaded().upload_stats([t], [r]).tolist()[0][0]
    assert squares == _squares_in_order(t, r)


def test_the_library_is_used_only_where_built_and_never_compiled_by_a_run(tmp_path, monkeypatch):
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(server_ops, "_STATE", {})
    assert server_ops.loaded() is None  # nothing in this cache: the PyTorch path
    assert weighted_average([torch.tensor([1.0]), torch.tensor([3.0])], [1.0, 1.0]).tolist() == [2.0]
    assert list(tmp_path.iterdir()) == []  # and nothing was built


def test_a_failed_build_names_the_compiler_and_says_runs_do_not_need_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    with pytest.raises(native.KernelBuildError, match=r"(?s)compiling server_ops.cpp with false failed.*the server "
                                                      r"then uses its PyTorch path, which gives the same results"):
        server_ops.build()
    assert list(tmp_path.glob("*.so")) == []
