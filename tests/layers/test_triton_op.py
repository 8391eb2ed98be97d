"""The FFA layer's Triton path (fedaug.layers.triton_op over the kernels of fedaug.layers.triton_ffa): the
kernel draws its coin and noise (Philox, from a seed and an offset tensor) and updates the running
statistics itself, in one launch forward and one backward; grouped by ``torch.func.vmap`` in one launch;
traced by ``make_fx`` and replayed like a CUDA graph.

Without a GPU (CI) the kernels run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set
by the repository's conftest.py); with a GPU the same tests run them compiled, on CUDA tensors. The
interpreter costs ~0.1 s per program (one per channel and client), hence the tiny shapes. Statistical
checks use fixed seeds: each is one sample, compared with a bound that a true N(0, 1) or Bernoulli(p)
sample of that size exceeds with probability below 1e-3.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from fedaug.layers import FFALayer
from fedaug.layers.ffa import KernelState
from tests.layers.test_ffa import X, np_ffa, np_stats

pytest.importorskip("triton", reason="the Triton kernel's tests need triton: pip install -e '.[gpu]' "
                                     "(scripts/setup.sh installs it)")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fedaug.layers import triton_ffa, triton_op  # noqa: E402  (needs triton)

#: where the kernel runs: compiled on a GPU, else interpreted on the CPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: the layer's map for FedFA's fused variance (gamma + 1 multipliers, std scale, the paper's estimators)
FUSED = {"const": None, "shift": 1.0, "fixed": False, "std_scale": True, "correction": 0, "extra": 0.0, "eps": 1e-6,
         "unbiased": False}


def features(shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (1.0 + 2.0 * torch.randn(shape, generator=g, dtype=dtype)).to(DEVICE)


def layer(c=2, *, seed=7, kernel="triton", **options):
    out = FFALayer(c, kernel=kernel, **options).double().to(DEVICE)
    out.set_stream(seed)
    return out


def grouped_state(g, c, seeds, *, momentum=0.9, first=()):
    """``triton_ffa.forward``'s per-client tensors for ``g`` clients of ``c`` channels (float64, on DEVICE);
    clients in ``first`` copy their first batch's statistics."""
    ema = torch.tensor([[0.0 if i in first else momentum, momentum] for i in range(g)], dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    return {"seed": torch.tensor(seeds, dtype=torch.int64), "offset": torch.zeros(g, dtype=torch.int64), "ema": ema,
            "running_mean": torch.rand(g, c, generator=gen, dtype=torch.float64),
            "running_std": torch.rand(g, c, generator=gen, dtype=torch.float64) + 0.5,
            "k_mu": torch.rand(g, c, generator=gen, dtype=torch.float64) + 0.5,
            "k_sigma": torch.rand(g, c, generator=gen, dtype=torch.float64) + 0.5}


def on_device(state):
    return {k: v.to(DEVICE) for k, v in state.items()}


# --- randomness ------------------------------------------------------------------------------------------
def test_same_seed_and_offset_give_bit_identical_draws_and_the_offset_moves_on_the_device():
    x = features((4, 2, 3, 3))
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("other", 8)):
        ffa = layer(seed=seed, p=1.0)
        runs[name] = [ffa(x) for _ in range(2)]
        assert ffa.offset.item() == 2 * 2  # C per forward
    assert all(torch.equal(u, v) for u, v in zip(runs["a"], runs["b"], strict=True))
    assert not torch.equal(runs["a"][0], runs["a"][1])  # the second forward drew anew
    assert not torch.equal(runs["a"][0], runs["other"][0])
    again = layer(seed=7, p=1.0)
    again.offset.fill_(2)  # the stream where the first forward left it
    assert torch.equal(again(x), runs["a"][1])


def test_noise_is_standard_normal():
    """8 clients x 256 samples x 1 channel x 2 statistics x 2 forwards = 8192 draws: mean, variance,
    skewness, excess kurtosis within 4 standard errors; the Kolmogorov-Smirnov distance to N(0, 1) below
    its 0.1 % critical value 1.95 / sqrt(n); the two statistics' noises uncorrelated."""
    g, b = 8, 256
    x = features((g, b, 1, 1))
    state = on_device(grouped_state(g, 1, list(range(g))))
    draws = []
    for _ in range(2):
        _, saved, use = triton_ffa.forward(x, None, **state, p=1.0, **FUSED)
        assert bool(use.all())
        draws.append(saved[:, 2:].cpu())
    z = torch.cat(draws).double()
    flat, n = z.flatten(), z.numel()
    se = 1 / math.sqrt(n)
    assert abs(flat.mean()) < 4 * se
    assert abs(flat.var() - 1) < 4 * math.sqrt(2) * se
    centred = flat - flat.mean()
    assert abs((centred**3).mean() / flat.var() ** 1.5) < 4 * math.sqrt(6) * se
    assert abs((centred**4).mean() / flat.var() ** 2 - 3) < 4 * math.sqrt(24) * se
    ordered = flat.sort().values
    cdf = torch.special.ndtr(ordered)
    ks = torch.maximum(torch.arange(1, n + 1) / n - cdf, cdf - torch.arange(n) / n).max()
    assert ks < 1.95 * se
    assert abs(torch.corrcoef(z.transpose(0, 1).reshape(2, -1))[0, 1]) < 4 / math.sqrt(n / 2)


@triton.jit
def _uniforms(seed, out_ptr, base_ptr, N, BLOCK: tl.constexpr):
    """``out[i] = tl.rand(seed, base[i])``: the uniform the kernel compares with p for a forward."""
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.rand(seed, tl.load(base_ptr + i, mask=i < N, other=0)), mask=i < N)


def test_coin_is_the_counters_uniform_below_p_and_bernoulli_p():
    """The kernel's coin for forward f is ``tl.rand(seed, f << 32) < p`` (checked on 16 forwards for
    three p), and those uniforms over 4096 forwards are Bernoulli(p) for every p within 4 standard errors
    (the uniforms drawn in one vectorised launch: the kernel's own launches cost a program each)."""
    x = features((2, 1, 1))
    forwards = 16
    base = (torch.arange(forwards, dtype=torch.int64) << 32).to(DEVICE)
    u = torch.empty(forwards, dtype=torch.float32, device=DEVICE)
    _uniforms[(1,)](3, u, base, forwards, BLOCK=triton.next_power_of_2(forwards))
    for p in (0.2, 0.5, 0.8):
        ffa = layer(1, seed=3, p=p)
        won = [not torch.equal(ffa(x), x) for _ in range(forwards)]
        assert won == (u.cpu() < p).tolist()
        assert 0 < sum(won) < forwards
    many = 4096
    base = (torch.arange(many, dtype=torch.int64) << 32).to(DEVICE)
    u = torch.empty(many, dtype=torch.float32, device=DEVICE)
    _uniforms[(1,)](3, u, base, many, BLOCK=many)
    for p in (0.1, 0.3, 0.5, 0.9):
        assert abs((u < p).double().mean().item() - p) < 4 * math.sqrt(p * (1 - p) / many)


def test_a_lost_coin_returns_the_input_values_keeps_the_statistics_and_passes_the_gradient():
    x = features((3, 2, 2, 2)).requires_grad_()
    ffa = layer(seed=3, p=0.5)
    outcomes = set()
    for _ in range(6):
        before = (ffa.running_mean.clone(), ffa.running_std.clone())
        y = ffa(x)
        (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
        lost = torch.equal(y, x)
        outcomes.add(lost)
        if lost:
            assert torch.equal(gx, torch.ones_like(x))
            assert torch.equal(ffa.running_mean, before[0]) and torch.equal(ffa.running_std, before[1])
    assert outcomes == {True, False}
    assert ffa.offset.item() == 6 * 2


# --- the layer's output and running statistics against float64 references -------------------------------
@pytest.mark.parametrize("fusion, scale", [("fused", "std"), ("product", "variance"), ("client", "std"),
                                           ("fixed", "std")])
def test_layer_output_and_running_statistics_golden(fusion, scale):
    """FedFA Eq. 2-9 and VFDA Eq. 7 computed with numpy (tests/layers/test_ffa.py) on the noise the kernel
    drew (read back from a launch at the same seed and offset), and Eq. 4 from 0 / 1."""
    shared = np.array([0.4, 1.6]), np.array([1.5, 0.5])
    ffa = layer(2, seed=5, p=1.0, momentum=0.99, variance=fusion, noise_scale=scale)
    if fusion == "fused":
        ffa.set_gamma(*map(torch.tensor, shared))
    elif fusion == "product":
        ffa.set_server_variances(*map(torch.tensor, shared))
    x = torch.tensor(X, device=DEVICE)
    y = ffa(x).detach().cpu().numpy()
    state = on_device(grouped_state(1, 2, [5]))
    _, saved, _ = triton_ffa.forward(x[None], None, **state, p=1.0, **FUSED)  # offset 0 again: the same noise
    noise = saved[0, 2:].cpu().numpy()
    if fusion == "fixed":
        mu, sig = np_stats(X)
        e = (slice(None), slice(None), None, None)
        want = (sig + 0.5 * noise[1])[e] * (X - mu[e]) / sig[e] + (mu + 0.5 * noise[0])[e]
    else:
        want, _, _ = np_ffa(X, *shared, noise, fusion, scale)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    mu, sig = np_stats(X)
    np.testing.assert_allclose(ffa.running_mean.cpu().numpy(), 0.01 * mu.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(ffa.running_std.cpu().numpy(), 0.99 + 0.01 * sig.mean(axis=0), rtol=1e-12)


def test_running_statistics_follow_eq_4_where_the_coin_wins_after_copying_the_first_batch():
    """VFDA's clients copy their first augmented batch's statistics (``from_first_batch``), then Eq. 4 with
    momentum 0.9, only in forwards whose coin wins (p = 0.5, seed 2: lost, won, lost, lost, won, won)."""
    ffa = layer(2, seed=2, p=0.5, momentum=0.9)
    ffa.reset_running_stats(from_first_batch=True)
    mean, std, won = np.zeros(2), np.ones(2), []
    for step in range(6):
        x = features((3, 2, 4), seed=step)
        y = ffa(x)
        won.append(not torch.equal(y, x))
        if won[-1]:
            mu, sig = np_stats(x.cpu().numpy())
            w = 0.9 if sum(won) > 1 else 0.0
            mean, std = w * mean + (1 - w) * mu.mean(axis=0), w * std + (1 - w) * sig.mean(axis=0)
        assert ffa.ema.tolist() == [0.9 if any(won) else 0.0, 0.9]
        np.testing.assert_allclose(ffa.running_mean.cpu().numpy(), mean, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(ffa.running_std.cpu().numpy(), std, rtol=1e-12)
    assert won == [False, True, False, False, True, True]


def test_running_statistics_equal_the_pytorch_paths_at_p_1():
    """At p = 1 the running statistics do not depend on the draws: the Triton path's equal the PyTorch
    path's (Python momentum updates) to float64 rounding, over three forwards, also after a momentum change."""
    stats = {}
    for kernel in ("triton", "off"):
        ffa = layer(3, kernel=kernel, p=1.0, momentum=0.8, generator=torch.Generator(DEVICE).manual_seed(0))
        for step in range(3):
            ffa(features((4, 3, 5), seed=step))
            ffa.momentum = 0.5
        stats[kernel] = torch.stack((ffa.running_mean, ffa.running_std))
    torch.testing.assert_close(stats["triton"], stats["off"], rtol=1e-12, atol=1e-14)


# --- grouped ---------------------------------------------------------------------------------------------
class Launches:
    """Counts the launches of the forward and backward kernels (wraps ``kernel[grid]``)."""

    def __init__(self, monkeypatch):
        self.counts = {"forward": 0, "backward": 0}
        for name, attr in (("forward", "_ffa_forward"), ("backward", "_ffa_backward")):
            monkeypatch.setattr(triton_ffa, attr, self._wrap(name, getattr(triton_ffa, attr)))

    def _wrap(self, name, kernel):
        outer = self

        class Counted:
            def __getitem__(self, grid):
                outer.counts[name] += 1
                return kernel[grid]

        return Counted()


def test_a_group_under_vmap_equals_each_clients_own_calls_bit_for_bit_in_one_launch(monkeypatch):
    """Three clients (the second copies its first batch; p = 0.5: seeds 1, 0, 3 give won, lost, won), each
    with its own state, through the layer under ``vmap`` as a grouped step runs it (featstats'
    :class:`~fedaug.layers.ffa.KernelState`): outputs, input gradients, running statistics, offsets and
    first-batch weights equal three separate calls exactly; one launch forward and one backward."""
    g, b, c = 3, 4, 2
    x = features((g, b, c, 3, 3))
    weights = features((g, b, c, 3, 3), seed=1)
    start = grouped_state(g, c, [1, 0, 3], first=(1,))
    ffa = layer(c, p=0.5, variance="fused")
    keys = ("running_mean", "running_std", "shared_mu", "shared_sigma", "seed", "offset", "ema")

    def as_layer(state):
        return {"running_mean": state["running_mean"], "running_std": state["running_std"],
                "shared_mu": state["k_mu"] - 1, "shared_sigma": state["k_sigma"] - 1, "seed": state["seed"],
                "offset": state["offset"], "ema": state["ema"]}

    launches = Launches(monkeypatch)
    separate = on_device(as_layer({k: v.clone() for k, v in start.items()}))
    want_y, want_grad = [], []
    for i in range(g):
        xi = x[i].clone().requires_grad_()
        ffa.drawn = KernelState(**{k: separate[k][i] for k in keys})
        yi = ffa(xi)
        ffa.drawn = None
        (yi * weights[i]).sum().backward()
        want_y.append(yi.detach())
        want_grad.append(xi.grad)
    assert launches.counts == {"forward": g, "backward": g}
    assert [torch.equal(y, x[i]) for i, y in enumerate(want_y)] == [False, True, False]

    grouped = on_device(as_layer({k: v.clone() for k, v in start.items()}))

    def one_client(xi, *state):
        ffa.drawn = KernelState(*state)
        try:
            return ffa(xi)
        finally:
            ffa.drawn = None

    xg = x.clone().requires_grad_()
    y = vmap(one_client)(xg, *(grouped[k] for k in keys))
    (y * weights).sum().backward()
    assert launches.counts == {"forward": g + 1, "backward": g + 1}
    assert torch.equal(y.detach(), torch.stack(want_y))
    assert torch.equal(xg.grad, torch.stack(want_grad))
    for k in keys:
        assert torch.equal(grouped[k], separate[k]), k
    assert grouped["offset"].tolist() == [c] * g and grouped["ema"][:, 0].tolist() == [0.9, 0.0, 0.9]


def test_a_group_refuses_state_shared_by_its_clients():
    x = features((2, 3, 2, 4))
    state = {k: v[0] for k, v in grouped_state(2, 2, [0, 1]).items()}
    with pytest.raises(ValueError, match=r"a grouped FFA layer needs one offset per client \(stacked over the "
                                         r"group\), got one tensor for the whole group"):
        vmap(lambda xi: triton_op.ffa_train(xi, *on_device(state).values(), p=1.0, **FUSED))(x)


# --- one launch each way; traced and replayed ------------------------------------------------------------
def model_with_ffa(c=2):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, c, 3), FFALayer(c, p=0.5, kernel="triton"), nn.ReLU(), nn.Conv2d(c, c, 1),
                        FFALayer(c, p=1.0, kernel="triton"), nn.Flatten(), nn.Linear(c * 16, 2)).to(DEVICE)
    net[1].set_stream(11)
    net[4].set_stream(12)
    return net.train()


class Ops(TorchDispatchMode):
    """The operators a region dispatches (the outermost calls: what a CUDA stream would launch or copy)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


#: operators that only describe a tensor (views), or allocate one without writing it
VIEWS = {"aten.view", "aten.unsqueeze", "aten.squeeze", "aten._unsafe_view", "aten.reshape", "aten.detach",
         "aten.alias", "aten.empty_like", "aten.empty", "aten.new_empty"}


def test_one_training_step_launches_one_kernel_each_way_per_layer_and_nothing_else(monkeypatch):
    """What makes FFA cost what InstanceNorm costs: per layer and step one Triton launch forward and one
    backward (two layers here), and no other operator in the layer (no noise draw, no running-statistics
    update, no host read: ``aten._local_scalar_dense`` is what ``.item()``/``bool()`` dispatch)."""
    net = model_with_ffa()
    launches = Launches(monkeypatch)
    x, target = features((4, 1, 6, 6), dtype=torch.float32), torch.tensor([0, 1, 0, 1], device=DEVICE)
    nn.functional.cross_entropy(net(x), target).backward()
    assert launches.counts == {"forward": 2, "backward": 2}
    ffa = net[1]
    h = features((4, 2, 4, 4), dtype=torch.float32).requires_grad_()
    with Ops() as ops:
        y = ffa(h)
        y.backward(torch.ones_like(y))
    work = [name for name in ops.names if name not in VIEWS]
    assert work == ["fedaug_triton.ffa_forward", "aten.ones_like", "fedaug_triton.ffa_backward"]


@pytest.mark.parametrize("p", [1.0, 0.5])
def test_eager_launches_skip_the_operators_and_give_their_bits(monkeypatch, p):
    """Eagerly (no dispatch mode, no tracing) the layer calls the kernels' launch functions directly, not through
    the custom operators (whose Python cost a layer ~0.5 ms of host time a step): the same launches, and the
    same output, input gradient, running statistics, offset and first-batch weight bit for bit as the operators
    give (forced here), over three steps."""
    h = features((4, 2, 4, 4), seed=3)
    runs = {}
    for eager in (True, False):
        monkeypatch.setattr(triton_op, "untraced", lambda eager=eager: eager)
        ffa, outs = layer(p=p), []
        for _ in range(3):
            x = h.clone().requires_grad_()
            y = ffa(x)
            y.backward(torch.cos(y.detach()))
            outs.append((y.detach(), x.grad))
        runs[eager] = (outs, {k: v.clone() for k, v in ffa.named_buffers()})
    (eager_outs, eager_buffers), (op_outs, op_buffers) = runs[True], runs[False]
    assert all(torch.equal(a, b) for pair, other in zip(eager_outs, op_outs) for a, b in zip(pair, other))
    assert eager_buffers.keys() == op_buffers.keys()
    assert all(torch.equal(eager_buffers[k], op_buffers[k]) for k in eager_buffers), eager_buffers
    assert int(eager_buffers["offset"]) == 3 * 2
    monkeypatch.undo()
    assert triton_op.untraced()  # no mode here: the real test of the path taken
    with Ops():
        assert not triton_op.untraced()  # a dispatch mode (make_fx's, a counting mode) sees the operators


class NoLaunch:
    """A kernel whose launches do nothing (``kernel[grid](...)``): what is left of a call is the host's work."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def python_calls(step):
    """The Python functions one call of ``step`` runs (``sys.setprofile``'s call events), outside this file."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename != __file__:
            calls.append(f"{frame.f_code.co_filename.split('/')[-1]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls


def test_one_layer_calls_a_bounded_number_of_python_functions_per_training_step(monkeypatch):
    """The host's work of one layer's training forward and backward on the Triton path, its launches stubbed
    (``bench_ffa.py --host``): on a GPU whose small steps wait for the host, this is FFA's cost beyond its two
    launches. Counted as Python function calls beyond the same step without the layer (``x.sum().backward()``):
    measured 27 (the module call, the layer, ``ffa_train``, the autograd function's forward, context and backward,
    the two launch functions, ``untraced`` twice), where the tree before issue 63 made 83 (the launch arguments'
    helpers and dictionaries, a device context, ``once_differentiable``'s no-grad context, ``Function.apply``'s
    dead-wrapper pass, the buffers' ``Module.__getattr__``, the device check) and ``nn.InstanceNorm2d`` makes 14.
    The bound leaves room for 3."""
    monkeypatch.setattr(triton_ffa, "_ffa_forward", NoLaunch())
    monkeypatch.setattr(triton_ffa, "_ffa_backward", NoLaunch())
    x = torch.randn(4, 16, 2, 2, requires_grad=True)
    ffa = FFALayer(16, p=1.0, kernel="triton").train()
    ffa(x).sum().backward()  # first calls: the launch plan, the checked device, the options (cached after)
    layer = python_calls(lambda: ffa(x).sum().backward())
    none = python_calls(lambda: x.sum().backward())
    assert "triton_op.py:ffa_train" in layer and "triton_ffa.py:backward" in layer  # the Triton path ran
    assert len(layer) - len(none) <= 30, layer


def sgd_step(net):
    """One training step as a pure function of its state (what a CUDA graph captures): forward, backward
    (``torch.autograd.grad``), an in-place SGD update; returns the loss."""

    def step(params, buffers, x, target):
        loss = nn.functional.cross_entropy(functional_call(net, {**params, **buffers}, (x,)), target)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, grad in zip(params.values(), grads):
                p.sub_(0.1 * grad)
        return loss.detach()

    return step


def test_a_traced_training_step_replayed_k_times_equals_k_eager_steps():
    """The CPU proof of CUDA-graph semantics: ``make_fx`` traces a whole step once (fake tensors: Python
    runs only then), the graph holds one forward and one backward operator per layer and no host read,
    and replaying it 3 times on the real state gives 3 eager steps' losses, weights, running statistics,
    offsets and first-batch weights bit for bit; each replay drew anew (the offsets advanced)."""
    net = model_with_ffa()
    step = sgd_step(net)
    x, target = features((4, 1, 6, 6), dtype=torch.float32), torch.tensor([0, 1, 0, 1], device=DEVICE)

    def state():
        return ({k: v.detach().clone().requires_grad_() for k, v in net.named_parameters()},
                {k: v.clone() for k, v in net.named_buffers()})

    graph = make_fx(step, tracing_mode="fake")(*state(), x, target)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert targets.count("fedaug_triton.ffa_forward.default") == 2
    assert targets.count("fedaug_triton.ffa_backward.default") == 2
    assert not [t for t in targets if t.startswith(("aten._local_scalar_dense", "aten.item"))]
    (eager_p, eager_b), (replay_p, replay_b) = state(), state()
    eager_losses, replay_losses = [], []
    with torch.backends.cudnn.flags(enabled=True, deterministic=True, benchmark=False):  # on a GPU: same sums
        for _ in range(3):
            eager_losses.append(step(eager_p, eager_b, x, target))
            with torch.no_grad():  # the graph holds the backward's operators: a replay records no autograd
                replay_losses.append(graph(replay_p, replay_b, x, target))
    assert torch.equal(torch.stack(replay_losses), torch.stack(eager_losses))
    assert all(torch.equal(replay_p[k], eager_p[k]) for k in eager_p)
    assert all(torch.equal(replay_b[k], eager_b[k]) for k in eager_b)
    assert replay_b["1.offset"].item() == 3 * 2 and replay_b["4.offset"].item() == 3 * 2


# --- where the Triton path runs ----------------------------------------------------------------------------
REFUSED = """
import torch
from torch import nn
from fedaug.core.errors import ConfigError
from fedaug.layers import FFALayer
from fedaug.methods.aug.fedfa import FedFA
for attempt in (lambda: FedFA(kernel="triton", at=["0"]).setup(nn.Sequential(nn.Conv2d(1, 2, 3)), (1, 5, 5)),
                lambda: FFALayer(2, p=1.0, kernel="triton")(torch.randn(3, 2, 4))):
    try:
        attempt()
    except ConfigError as err:
        print(err)
"""


def test_kernel_triton_is_refused_on_a_cpu_without_the_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", REFUSED], capture_output=True, text=True, env=env, check=True,
                          timeout=300)
    fix = ("='triton' on the CPU runs Triton's interpreter, which needs TRITON_INTERPRET=1 in the environment before "
           "triton is imported (slow: for tests); set it, or set {0}='on' (the compiled CPU kernel) or 'off' (the "
           "PyTorch path)")
    assert done.stdout.splitlines() == ["fedfa.kernel" + fix.format("fedfa.kernel"),
                                        "FFALayer.kernel" + fix.format("FFALayer.kernel")]


def test_the_interpreter_runs_here_and_one_that_cannot_is_refused_with_versions_and_fix(monkeypatch):
    """Triton's interpreter before 3.7 (torch 2.11's 3.6) cannot run a loop bounded by a kernel argument under
    numpy 2.4; the probe finds that, and kernel="triton" on the CPU then names both versions and the fix
    instead of failing inside the interpreter."""
    from fedaug.core.errors import ConfigError
    from fedaug.layers import kernel

    assert triton_ffa.interpreter_runs()  # this environment's interpreter counts the probe's loop to 2
    monkeypatch.setattr(triton_ffa, "interpreter_runs", lambda: False)
    with pytest.raises(ConfigError) as refused:
        kernel.check_triton_device(torch.device("cpu"), "fedfa.kernel")
    assert str(refused.value) == (
        f"fedfa.kernel='triton' on the CPU runs Triton's interpreter, and that of triton {triton.__version__} cannot "
        f"run under numpy {np.__version__} (it converts one-element arrays to int, which numpy 2.4 refuses); "
        "install triton>=3.7 (torch>=2.12 ships it) or numpy<2.4, or set fedfa.kernel='on' (the compiled CPU "
        "kernel) or 'off'")
