"""The clients' compiled SGD step (fedaug.core.local_sgd): torch.optim.SGD's bits, its state, hooks and
fallbacks."""

from __future__ import annotations

import pytest
import torch

from fedaug.core import local_sgd
from fedaug.core.local_sgd import LocalSGD
from tests.conftest import imports_torch_dynamo

#: sizes with and without a tail past whole 8- and 16-float vectors, and one spread over two threads
SIZES = [(1,), (7,), (16,), (33,), (40, 25), (300, 500)]


def _pair(sizes, seed, **options):
    """The same parameters under LocalSGD and torch.optim.SGD."""
    g = torch.Generator().manual_seed(seed)
    ours = [torch.nn.Parameter(torch.randn(s, generator=g) * 10.0 ** torch.randint(-3, 3, s, generator=g))
            for s in sizes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    return ours, theirs, LocalSGD(ours, **options), torch.optim.SGD(theirs, **options)


def _step_both(ours, theirs, opts, g):
    for p, q in zip(ours, theirs):
        grad = torch.randn(p.shape, generator=g) * 10.0 ** torch.randint(-3, 3, p.shape, generator=g)
        p.grad, q.grad = grad.clone(), grad.clone()
    for opt in opts:
        opt.step()


def _same_bits(a, b):
    return all(torch.equal(x.detach().view(torch.int32), y.detach().view(torch.int32)) for x, y in zip(a, b))


@pytest.mark.usefixtures("local_sgd_library")
@pytest.mark.parametrize("weight_decay, momentum", [(5e-4, 0.9), (0.0, 0.9), (1e-2, 0.0), (0.0, 0.0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_compiled_step_gives_torchs_bits_over_steps_and_a_cleared_state(weight_decay, momentum, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours, theirs, a, b = _pair(SIZES, 0, lr=0.05, momentum=momentum, weight_decay=weight_decay)
        g = torch.Generator().manual_seed(1)
        for i in range(5):
            if i == 3:  # a new client: the momentum starts again from the gradient
                a.state.clear()
                b.state.clear()
            _step_both(ours, theirs, (a, b), g)
            assert _same_bits(ours, theirs), f"step {i}"
        if momentum:
            assert _same_bits([a.state[p]["momentum_buffer"] for p in ours], [b.state[p]["momentum_buffer"] for p in theirs])
        else:
            assert not a.state and not b.state  # torch keeps no buffer without momentum
    finally:
        torch.set_num_threads(before)


@pytest.mark.usefixtures("local_sgd_library")
def test_parameters_without_a_gradient_are_left_alone_and_the_closure_is_evaluated_with_gradients():
    ours, theirs, a, b = _pair([(5,), (6,)], 2, lr=0.1, momentum=0.9)
    frozen = ours[1].detach().clone()

    def closure():
        assert torch.is_grad_enabled()
        ours[0].grad = torch.ones(5)
        return torch.tensor(3.0)

    assert a.step(closure).item() == 3.0
    theirs[0].grad = torch.ones(5)
    b.step()
    assert _same_bits(ours, theirs) and torch.equal(ours[1].detach(), frozen) and ours[1] not in a.state


@pytest.mark.usefixtures("local_sgd_library")
@pytest.mark.parametrize("options", [{"nesterov": True, "momentum": 0.9}, {"dampening": 0.5, "momentum": 0.9},
                                     {"maximize": True, "momentum": 0.9}])
def test_what_the_library_does_not_take_is_torchs_own_step(options):
    ours, theirs, a, b = _pair(SIZES[:3], 3, lr=0.05, **options)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        _step_both(ours, theirs, (a, b), g)
    assert _same_bits(ours, theirs)


@pytest.mark.usefixtures("local_sgd_library")
def test_float64_and_strided_parameters_take_torchs_step():
    base = torch.randn(6, 4, dtype=torch.float64)
    ours = [torch.nn.Parameter(base.clone()), torch.nn.Parameter(torch.randn(4, 6).t())]
    theirs = [torch.nn.Parameter(t.detach().clone()) for t in ours]
    a, b = LocalSGD(ours, lr=0.1, momentum=0.9), torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        for p, q in zip(ours, theirs):
            grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.grad, q.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    assert all(torch.equal(x, y) for x, y in zip(ours, theirs))


@pytest.mark.usefixtures("local_sgd_library")
def test_the_step_advances_version_counters_so_autograd_sees_the_in_place_update():
    p = torch.nn.Parameter(torch.randn(10))
    opt = LocalSGD([p], lr=0.1, momentum=0.9)
    loss = (p * p).sum()  # saves p for its backward
    p.grad = torch.ones(10)
    version = p._version
    opt.step()
    assert p._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.usefixtures("local_sgd_library")
def test_a_momentum_buffer_held_elsewhere_is_not_reused():
    p = torch.nn.Parameter(torch.randn(50))
    opt = LocalSGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.ones(50)
    opt.step()
    kept = opt.state[p]["momentum_buffer"]
    snapshot = kept.clone()
    opt.state.clear()
    p.grad = torch.full((50,), 2.0)
    opt.step()
    assert opt.state[p]["momentum_buffer"] is not kept and torch.equal(kept, snapshot)
    last = id(opt.state[p]["momentum_buffer"])
    opt.state.clear()
    del kept
    p.grad = torch.full((50,), 3.0)
    opt.step()  # nothing else holds the last buffer now: it is taken again and written whole
    assert id(opt.state[p]["momentum_buffer"]) == last
    assert torch.equal(opt.state[p]["momentum_buffer"], torch.full((50,), 3.0))


@pytest.mark.usefixtures("local_sgd_library")
def test_step_hooks_run_and_the_profiler_sees_the_step():
    p = torch.nn.Parameter(torch.randn(4))
    opt = LocalSGD([p], lr=0.1)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    p.grad = torch.ones(4)
    opt.step()
    assert calls == ["pre", "post"]
    quiet = LocalSGD([p], lr=0.1)
    with torch.profiler.profile() as prof:
        quiet.step()
    assert any(e.name == "Optimizer.step#LocalSGD.step" for e in prof.events())


@pytest.mark.usefixtures("local_sgd_library")
def test_a_dispatch_mode_sees_torchs_step_not_the_library():
    """make_fx capturing a step for a CUDA graph, or a counting mode, must see the update's operators."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    ours, theirs, a, b = _pair(SIZES[:3], 8, lr=0.05, momentum=0.9, weight_decay=1e-3)
    g = torch.Generator().manual_seed(9)
    for p, q in zip(ours, theirs):
        p.grad = q.grad = torch.randn(p.shape, generator=g)
    with Seen() as seen:
        a.step()
    b.step()
    assert any(op.startswith("add") for op in seen.ops) and _same_bits(ours, theirs)


def test_a_library_that_disagrees_with_torch_is_not_used(monkeypatch):
    monkeypatch.setattr(local_sgd, "_STATE", {})
    monkeypatch.setattr(local_sgd, "agrees", lambda: False)
    assert local_sgd.loaded() is None
    ours, theirs, a, b = _pair(SIZES[:4], 6, lr=0.05, momentum=0.9, weight_decay=1e-3)
    _step_both(ours, theirs, (a, b), torch.Generator().manual_seed(7))
    assert _same_bits(ours, theirs)  # torch's own step


@pytest.mark.usefixtures("local_sgd_library")
def test_the_probe_passes_where_the_library_is_built():
    assert local_sgd.agrees()


def test_zero_grad_sets_the_gradients_to_none_or_zero():
    p = torch.nn.Parameter(torch.randn(3))
    opt = LocalSGD([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.zero_grad(set_to_none=False)
    assert torch.equal(p.grad, torch.zeros(3))
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.usefixtures("local_sgd_library")
def test_the_probe_compares_with_torchs_own_arithmetic(monkeypatch):
    """The probe's reference is torch's SGD step: where it computed anything else (here: one float32 ulp more on
    every value), the library would disagree with it and not be used."""
    raw = local_sgd.torch_step

    def off_by_an_ulp(opt):
        raw(opt)
        with torch.no_grad():
            for p in opt.param_groups[0]["params"]:
                p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))

    monkeypatch.setattr(local_sgd, "torch_step", off_by_an_ulp)
    assert not local_sgd.agrees()


@pytest.mark.parametrize("library", ["built", "not built"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_process_that_trains_on_the_cpu_never_imports_torch_dynamo(library, optimizer, local_sgd_library, tmp_path):
    """torch.optim imports torch._dynamo (3-5 CPU-seconds) at a process's first optimiser, for the graph breaks a
    compiled caller needs; LocalSGD (with the library and with torch's step) and LocalAdam build and step without
    it, so a run, a worker or a Flower ClientApp (one process per message) starts without that cost."""
    assert not imports_torch_dynamo(
        "from fedaug.core import local_sgd\n"
        f"if {library == 'not built'!r}: local_sgd._STATE['step'] = None\n"
        "from fedaug.config.schema import validate\n"
        "from fedaug.engine.run import run_experiment\n"
        "from tests.conftest import tiny_raw\n"
        f"raw = tiny_raw(rounds=2, optimizer={optimizer!r}); raw['out_dir'] = {str(tmp_path)!r}\n"
        "run_experiment(validate(raw), quiet=True)\n"
        f"assert (local_sgd.loaded() is not None) == {library == 'built'!r}")
