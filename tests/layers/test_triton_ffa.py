"""The FFA layer's Triton kernels (fedaug.layers.triton_ffa) with given noise, as ``restyle`` runs them
(fedaug.layers.triton_op.ffa_restyle): the same function as the pure-PyTorch path (forward, statistics,
exact input gradients) for every option, 1D/2D/3D; how the kernel is chosen and what happens without
triton; every kernel compiles for GPUs. The layer's own path (in-kernel draws, running statistics,
grouped, traced) is tested in tests/layers/test_triton_op.py.

Without a GPU (CI) the kernel runs on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
set by the repository's conftest.py before triton is imported), in place of the compiled C++ kernel
that ``kernel="on"`` takes on the CPU; with a GPU the same tests run it compiled, on CUDA tensors.
Tolerances: float64 to 1e-10 (both paths compute the same formulas; only the summation order
differs); float32 to 1e-5 relative and absolute (inputs ~N(1, 2^2): a few float32 ulps), as for the
compiled CPU kernel.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import fedaug.layers
from fedaug.layers import FFALayer, kernel
from fedaug.layers.functional import StatNoise, restyle
from tests.layers.test_ffa import X, draws, np_ffa, np_stats

pytest.importorskip("triton", reason="the Triton kernel's tests need triton: pip install -e '.[gpu]' "
                                     "(scripts/setup.sh installs it)")
from fedaug.layers import triton_ffa, triton_op  # noqa: E402  (needs triton)

#: where the kernel runs: compiled on a GPU, else interpreted on the CPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: (B, C, *spatial): 1D, 2D, 3D, a batch of one, 1x1 maps, a row longer than one block (loops)
SHAPES = [(4, 3, 6), (3, 2, 4, 5), (2, 2, 3, 2, 4), (1, 3, 10), (5, 2, 1, 1), (1, 2, triton_ffa.TILE + 52)]
#: (fixed, noise_scale, correction, unbiased): every option of the map and the spatial estimator
OPTIONS = list(itertools.product([True, False], ["std", "variance"], [0, 1], [False, True]))


@pytest.fixture
def triton_calls(monkeypatch) -> list[tuple[int, ...]]:
    """Make ``kernel="on"`` run the Triton kernel on :data:`DEVICE` (on the CPU, in place of the compiled
    C++ kernel); returns the shapes it ran on."""
    calls = []

    def op(*args):
        calls.append(tuple(args[0].shape))
        return triton_op.ffa_restyle(*args)

    monkeypatch.setattr(kernel, "fused_op", lambda device_type: op)
    return calls


def make_map(noise, param, fixed, scale, corr):
    if fixed:
        return StatNoise(noise, scale=param)
    return StatNoise(noise, mult=param, noise_scale=scale, correction=corr, extra=1e-6 * corr)


def graph_nodes(y, depth):
    """Names of the autograd nodes within ``depth`` steps of ``y``'s."""
    names, level = [], [y.grad_fn]
    for _ in range(depth):
        names += [fn.name() for fn in level]
        level = [nxt for fn in level for nxt, _ in fn.next_functions if nxt is not None]
    return names


def paths(x, sn, unbiased):
    """``[(y, mu, sigma, dL/dx)]`` of :func:`restyle` with ``kernel="on"`` (routed to the Triton kernel by
    :func:`triton_calls`), then with ``kernel="off"`` (the pure-PyTorch path), for L = sum(y w)."""
    w = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(9))
    out = []
    for mode in ("on", "off"):
        xi = x.clone().requires_grad_()
        y, mu, sigma = restyle(xi, sn, unbiased=unbiased, kernel=mode)
        assert ("_FFABackward" in graph_nodes(y, depth=2)) == (mode == "on")
        (y * w).sum().backward()
        out.append((y.detach(), mu, sigma, xi.grad))
    return out


def data(shape, dtype=torch.float64, seed=0):
    """``x`` ``shape``, noise ``(2, B, C)`` and multipliers ``(2, C)`` on :data:`DEVICE`."""
    g = torch.Generator().manual_seed(seed)
    x = 1.0 + 2.0 * torch.randn(shape, dtype=dtype, generator=g)
    noise = torch.randn((2, *shape[:2]), dtype=dtype, generator=g)
    param = 0.5 + torch.rand((2, shape[1]), dtype=dtype, generator=g)
    return x.to(DEVICE), noise.to(DEVICE), param.to(DEVICE)


@pytest.mark.usefixtures("triton_calls")
@pytest.mark.parametrize("fixed, scale, corr, unbiased", OPTIONS)
def test_triton_kernel_equals_pytorch_path_for_every_option(fixed, scale, corr, unbiased):
    x, noise, param = data((3, 2, 5))
    (yt, mt, st, gt), (yp, mp, sp, gp) = paths(x, make_map(noise, param, fixed, scale, corr), unbiased)
    for a, b in ((yt, yp), (mt, mp), (st, sp), (gt, gp)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.usefixtures("triton_calls")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("official", [False, True], ids=["paper", "official"])
def test_triton_kernel_equals_pytorch_path_1d_2d_3d(shape, official):
    x, noise, param = data(shape, seed=1)
    sn = make_map(noise, param, False, "std", int(official))
    for a, b in zip(*paths(x, sn, official), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(1, 2, 3), (3, 2, 1)])  # zero batch variance; zero spatial variance
def test_constant_inputs_give_the_pytorch_paths_finite_numbers(shape, triton_calls):
    _, noise, param = data(shape)
    for x in (torch.zeros(shape, dtype=torch.float64, device=DEVICE),
              torch.full(shape, 3.0, dtype=torch.float64, device=DEVICE)):
        for scale in ("std", "variance"):
            triton, pytorch = paths(x, make_map(noise, param, False, scale, 0), False)
            assert all(bool(torch.isfinite(t).all()) for t in triton)
            for a, b in zip(triton, pytorch, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fixed, scale", [(True, "std"), (False, "std"), (False, "variance")])
def test_triton_kernel_float32_within_tolerance(fixed, scale, triton_calls):
    x, noise, param = data((4, 3, 5, 5), dtype=torch.float32, seed=2)
    triton, pytorch = paths(x, make_map(noise, param, fixed, scale, 0), False)
    for a, b in zip(triton, pytorch, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_triton_kernel_gradients_pass_gradcheck(triton_calls):
    x, noise, param = data((2, 2, 2), seed=3)
    sn = make_map(noise, param, False, "std", 1)
    assert torch.autograd.gradcheck(lambda t: restyle(t, sn, unbiased=True, kernel="on")[0], (x.requires_grad_(),))
    assert triton_calls


def test_second_derivative_is_refused(triton_calls):
    """Like the compiled CPU kernel, the gradient is not differentiable (FedMix + FFA needs kernel off)."""
    x, noise, param = data((2, 2, 3))
    x.requires_grad_()
    y, _, _ = restyle(x, make_map(noise, param, False, "std", 0), kernel="on")
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        gx.sum().backward()


@pytest.mark.parametrize("variance, noise_scale, estimator", [
    ("fused", "std", "paper"), ("fused", "std", "official"), ("direct", "std", "paper"),
    ("product", "variance", "paper"), ("product", "std", "official"), ("client", "std", "paper"),
    ("fixed", "std", "paper"), ("fixed", "variance", "official"),
])  # fmt: skip  FedFA (fused, direct, FedFA-C, FedFA-R), VFDA (product; Eq. 7 as printed or Eq. 9)
def test_layer_on_the_triton_kernel_equals_the_pytorch_layer(variance, noise_scale, estimator, triton_calls):
    """Output, input gradient and running statistics (Eq. 4) over two forwards of FFALayer(kernel="on")."""
    results = []
    for mode in ("on", "off"):
        layer = FFALayer(3, p=1.0, momentum=0.9, variance=variance, noise_scale=noise_scale, estimator=estimator,
                         generator=torch.Generator().manual_seed(5), kernel=mode).double().to(DEVICE)
        if variance in ("fused", "direct", "product"):
            layer._set_shared(torch.tensor([0.5, 1.0, 1.5]), torch.tensor([1.2, 0.3, 0.8]))
        out = []
        for step in range(2):
            x = data((3, 3, 4), seed=10 + step)[0].requires_grad_()
            y = layer(x)
            y.square().sum().backward()
            out += [y.detach(), x.grad, layer.running_mean.clone(), layer.running_std.clone()]
        results.append(out)
    assert triton_calls == [(3, 3, 4)] * 2  # "on" ran the Triton kernel, "off" did not
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fusion, scale", [("fused", "std"), ("product", "variance"), ("client", "std")])
def test_layer_on_the_triton_kernel_golden(fusion, scale, triton_calls):
    """FedFA Eq. 2-9 and VFDA Eq. 7 computed with numpy (tests/layers/test_ffa.py), through the Triton kernel."""
    shared_mu, shared_sigma = np.array([0.4, 1.6]), np.array([1.5, 0.5])
    layer = FFALayer(2, kernel="on", p=1.0, momentum=0.99, variance=fusion, noise_scale=scale,
                     generator=torch.Generator().manual_seed(3)).double().to(DEVICE)
    if fusion == "fused":
        layer.set_gamma(torch.tensor(shared_mu), torch.tensor(shared_sigma))
    elif fusion == "product":
        layer.set_server_variances(torch.tensor(shared_mu), torch.tensor(shared_sigma))
    y = layer(torch.tensor(X, device=DEVICE)).detach().cpu()
    assert triton_calls == [X.shape]
    want, _, _ = np_ffa(X, shared_mu, shared_sigma, draws(3, 3, 2, p=1.0)[1], fusion, scale)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-12)
    mu, sig = np_stats(X)
    np.testing.assert_allclose(layer.running_mean.cpu().numpy(), 0.01 * mu.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(layer.running_std.cpu().numpy(), 0.99 + 0.01 * sig.mean(axis=0), rtol=1e-10)


def test_each_device_type_gets_its_kernel():
    assert kernel.fused_op("cuda") is triton_op.ffa_restyle
    with pytest.raises(ValueError, match=r"no fused FFA kernel for device type 'mps'; the fused kernels run on cpu "
                                         r"and cuda"):
        kernel.fused_op("mps")


def test_without_triton_only_the_cuda_kernel_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    for name in ("triton_ffa", "triton_op"):
        monkeypatch.delitem(sys.modules, f"fedaug.layers.{name}")
        monkeypatch.delattr(fedaug.layers, name)  # else `from fedaug.layers import ...` finds it
    with pytest.raises(kernel.KernelBuildError, match=r"the CUDA FFA kernel is written in Triton, which cannot be "
                                                      r"imported .*pip install 'fedaug\[gpu\]'.* kernel option to "
                                                      r"\"off\""):
        kernel.triton_op()
    x = torch.randn(4, 3, 5)
    assert FFALayer(3, p=1.0, generator=torch.Generator().manual_seed(0))(x).shape == x.shape  # "off" needs none


#: compiles both kernels of fedaug.layers.triton_ffa to a cubin for a GPU architecture, for variants that take every
#: compile-time branch at least once (argv: ``arch:variant,...``): the layer's path and given noise; float32, bfloat16
#: features and float64; fixed scales, std and variance scales; per-channel and constant parameters. Pointers are the
#: ``*_ptr`` arguments (seed and offset int64, features in their dtype, the rest in the accumulation dtype), ``p`` a
#: float, the other non-constexpr arguments 32-bit integers, as a launch specialises them
AHEAD_OF_TIME = """
import inspect, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fedaug.layers import triton_ffa as m

VARIANTS = [  # feature dtype, accumulation dtype, LAYER, FIXED, STD, CONST_PARAM
    ("fp32", "fp32", True, False, True, False), ("bf16", "fp32", True, True, True, True),
    ("fp64", "fp64", False, False, False, False), ("fp32", "fp32", False, False, True, True),
]
for job in sys.argv[1:]:
    arch, variants = job.split(":")
    for v in map(int, variants.split(",")):
        feat, acc, layer, fixed, std, const = VARIANTS[v]
        values = {"EPS": 1e-6, "EXTRA": 0.0 if fixed else 1e-6, "SHIFT": 1.0, "CONST": 0.5, "CONST_PARAM": const,
                  "FIXED": fixed, "STD": std, "LAYER": layer, "BLOCK_B": 16, "BLOCK_N": 128}
        for fn in (m._ffa_forward, m._ffa_backward):
            names = list(inspect.signature(fn.fn).parameters)
            ptr = {"seed_ptr": "*i64", "offset_ptr": "*i64", "x_ptr": "*" + feat, "y_ptr": "*" + feat,
                   "g_ptr": "*" + feat, "gx_ptr": "*" + feat}
            sig = {k: "constexpr" if k in values else ptr.get(k, "*" + acc) if k.endswith("_ptr")
                   else "fp32" if k == "p" else "i32" for k in names}
            src = ASTSource(fn, sig, constexprs={k: v for k, v in values.items() if k in names})
            done = triton.compile(src, target=GPUTarget("cuda", int(arch), 32),
                                  options={"num_warps": 4, "enable_fp_fusion": True})
            assert "cubin" in done.asm
            print(arch, VARIANTS[v], fn.__name__)
"""


def test_kernels_compile_for_gpus_without_one(tmp_path):
    """The interpreter runs the kernels' Python; Triton's compiler (its own front end, typing and
    lowering) is checked here by compiling them for H100/H200 (sm_90, every variant) and A100 (sm_80,
    the layer's float32 path), no GPU needed.
    In a subprocess without ``TRITON_INTERPRET``, with an empty Triton cache so that nothing is reused."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", AHEAD_OF_TIME, "90:0,1,2,3", "80:0"], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == (4 + 1) * 2


def test_fedaug_imports_and_trains_ffa_without_importing_triton():
    code = ("import sys, torch, fedaug\n"
            "from fedaug.layers import FFALayer\n"
            "FFALayer(3, p=1.0)(torch.randn(4, 3, 5))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' or m.endswith('triton_ffa')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
