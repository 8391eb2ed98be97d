"""The FFA layer's compiled kernel (fedaug.layers.kernel): the same function as the pure-PyTorch path
(forward, statistics, exact gradients) for every option; the ``kernel`` option alone chooses the path
(no environment variable); build failure, cache."""

from __future__ import annotations

import itertools

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.core.version import RETIRED_ENV
from fedaug.layers import FFALayer, kernel
from fedaug.layers.functional import StatNoise, restyle
from tests.conftest import requires_kernel

SHAPES = [(5, 3, 7), (4, 2, 9, 9), (3, 4, 3, 2, 70), (1, 3, 10), (6, 2, 1, 1)]  # 1D/2D/3D, long rows, B=1, N=1


def both_paths(x, make_map, unbiased):
    """(y, mu, sigma, dL/dx) through the kernel and through _Restyle, for L = sum(y * w)."""
    out = []
    w = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(9))
    for mode in ("on", "off"):
        xi = x.clone().requires_grad_()
        y, mu, sigma = restyle(xi, make_map(), unbiased=unbiased, kernel=mode)
        (y * w).sum().backward()
        out.append((y.detach(), mu, sigma, xi.grad))
    return out


@requires_kernel
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_equals_pytorch_path_for_every_option(shape):
    g = torch.Generator().manual_seed(0)
    x = 1.0 + 2.0 * torch.randn(shape, dtype=torch.float64, generator=g)
    noise = torch.randn((2, *shape[:2]), dtype=torch.float64, generator=g)
    param = 0.5 + torch.rand((2, shape[1]), dtype=torch.float64, generator=g)
    for fixed, scale, corr, unbiased in itertools.product([True, False], ["std", "variance"], [0, 1], [False, True]):
        def make_map():
            if fixed:
                return StatNoise(noise, scale=param)
            return StatNoise(noise, mult=param, noise_scale=scale, correction=corr, extra=1e-6 * corr)

        (yk, mk, sk, gk), (yp, mp, sp, gp) = both_paths(x, make_map, unbiased)
        for a, b in ((yk, yp), (mk, mp), (sk, sp), (gk, gp)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@requires_kernel
@pytest.mark.parametrize("fixed, scale", [(True, "std"), (False, "std"), (False, "variance")])
def test_kernel_gradients_pass_gradcheck(fixed, scale):
    g = torch.Generator().manual_seed(1)
    x = torch.randn((4, 3, 3, 3), dtype=torch.float64, generator=g, requires_grad=True)
    noise = torch.randn((2, 4, 3), dtype=torch.float64, generator=g)
    param = 0.5 + torch.rand((2, 3), dtype=torch.float64, generator=g)
    sn = StatNoise(noise, scale=param) if fixed else StatNoise(noise, mult=param, noise_scale=scale)
    assert torch.autograd.gradcheck(lambda t: restyle(t, sn, unbiased=True, kernel="on")[0], (x,))
    assert restyle(x, sn, kernel="on")[0].grad_fn.name() != "_RestyleBackward"  # really the C++ node
    assert restyle(x, sn)[0].grad_fn.name() == "_RestyleBackward"  # the default is the PyTorch path


@requires_kernel
def test_layer_results_do_not_depend_on_the_path_or_the_thread_count():
    x = torch.randn(16, 8, 14, 14, generator=torch.Generator().manual_seed(2), requires_grad=True)
    results = []
    threads = torch.get_num_threads()
    try:
        for mode, n in (("on", 1), ("on", 2), ("off", 1)):
            torch.set_num_threads(n)
            layer = FFALayer(8, p=1.0, generator=torch.Generator().manual_seed(3), kernel=mode)
            layer.set_gamma(torch.linspace(0.5, 1.5, 8), torch.ones(8))
            y = layer(x)
            (grad,) = torch.autograd.grad(y.square().sum(), x)
            results.append((y.detach(), grad, layer.running_mean.clone(), layer.running_std.clone()))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))  # rows reduce in a fixed order
    for a, b in zip(results[0], results[2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # float32 rounding only


def spy_on_the_op(monkeypatch):
    """Count the calls of the compiled op (the real one runs)."""
    calls = []
    real = kernel.restyle_op

    def spy():
        op = real()

        def counted(*args):
            calls.append(args[0].shape)
            return op(*args)

        return counted

    monkeypatch.setattr(kernel, "restyle_op", spy)
    return calls


@requires_kernel
@pytest.mark.parametrize("env", [None, "on", "auto", "off", "nonsense"])
def test_the_option_alone_chooses_the_path_whatever_the_environment(monkeypatch, env):
    if env is None:
        monkeypatch.delenv(RETIRED_ENV, raising=False)
    else:
        monkeypatch.setenv(RETIRED_ENV, env)
    calls = spy_on_the_op(monkeypatch)
    x = torch.randn(8, 3, 5, 5, generator=torch.Generator().manual_seed(0))
    out = {}
    for mode in ("off", "on"):
        layer = FFALayer(3, p=1.0, generator=torch.Generator().manual_seed(1), kernel=mode)
        out[mode] = layer(x)
        assert len(calls) == (mode == "on")  # "off" never calls the compiled op, "on" does
    # the numbers are the default path's, bit for bit, whatever the environment says
    assert torch.equal(out["off"], FFALayer(3, p=1.0, generator=torch.Generator().manual_seed(1))(x))
    torch.testing.assert_close(out["on"], out["off"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda: FFALayer(3, kernel="auto"),
    lambda: restyle(torch.randn(2, 3, 4), StatNoise(torch.randn(2, 2, 3), scale=torch.ones(2, 3)), kernel="yes"),
])
def test_bad_mode_is_named_with_the_choices(make):
    with pytest.raises(ConfigError, match=r"kernel must be one of off, on, triton, got '(auto|yes)': \"off\" is the "
                                          r"pure-PyTorch"):
        make()


def test_failed_build_raises_only_when_the_kernel_is_asked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setenv(kernel.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(kernel._STATE, "op", None)
    monkeypatch.setitem(kernel._STATE, "error", None)
    x = torch.randn(4, 3, 5, 5)
    FFALayer(3, p=1.0)(x)  # "off" never builds
    assert kernel._STATE["error"] is None
    with pytest.raises(kernel.KernelBuildError, match=r"(?s)compiling ffa_restyle.cpp with false failed.*set the FFA "
                                                      r"layers' kernel option to \"off\""):
        FFALayer(3, p=1.0, kernel="on")(x)
    with pytest.raises(kernel.KernelBuildError):  # the same error again, without a second compile
        FFALayer(3, p=1.0, kernel="on")(x)
    assert list(tmp_path.glob("*.so")) == []  # nothing half-written is left in the cache


@requires_kernel
def test_build_is_cached():
    first = kernel.build()  # compiles only if no earlier test or `fedaug kernel` did
    stamp = first.stat().st_mtime_ns
    assert kernel.build() == first and first.stat().st_mtime_ns == stamp  # no second compile
    assert first.parent == kernel.cache_dir() and first.name.startswith("ffa_restyle-")
