"""torch's optimisers without their import of torch._dynamo (fedaug.core.eager_optim): torch's bits, state, hooks,
profiler range and zero_grad."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.eager_optim import EagerOptimizer, LocalAdam, torch_step


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((3,), (4, 5), (33,))]


@pytest.mark.parametrize("options", [{}, {"weight_decay": 1e-2}, {"amsgrad": True, "betas": (0.8, 0.9)},
                                     {"maximize": True, "lr": 3e-2}])
def test_local_adam_gives_torchs_bits_and_state_over_steps(options):
    ours, theirs = _params(0), _params(0)
    a, b = LocalAdam(ours, **options), torch.optim.Adam(theirs, **options)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        for p, q in zip(ours, theirs):
            p.grad = q.grad = torch.randn(p.shape, generator=g)
        a.step()
        b.step()
    assert all(torch.equal(p.view(torch.int32), q.view(torch.int32)) for p, q in zip(ours, theirs))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert all(torch.equal(x, y) for k in sa["state"] for x, y in zip(sa["state"][k].values(), sb["state"][k].values()))


def test_the_closure_is_evaluated_with_gradients_and_its_loss_returned():
    (p, *_) = _params(2)
    opt = LocalAdam([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p ** 2).sum()
        loss.backward()
        return loss

    before = p.detach().clone()
    with torch.no_grad():  # torch's step evaluates the closure with gradients all the same
        loss = opt.step(closure)
    assert loss.requires_grad and torch.equal(loss.detach(), (before ** 2).sum())
    assert torch.equal(p.grad, 2 * before) and not torch.equal(p.detach(), before)


def test_hooks_run_and_the_profiler_sees_the_step_named_by_the_class():
    (p, *_) = _params(3)
    opt = LocalAdam([p], lr=0.1)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    p.grad = torch.ones_like(p)
    opt.step()
    assert calls == ["pre", "post"]
    with torch.profiler.profile() as prof:
        LocalAdam([p], lr=0.1).step()
    assert any(e.name == "Optimizer.step#LocalAdam.step" for e in prof.events())


def test_zero_grad_sets_the_gradients_to_none_or_zero():
    (p, *_) = _params(4)
    opt = LocalAdam([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.zero_grad(set_to_none=False)
    assert torch.equal(p.grad, torch.zeros_like(p))
    opt.zero_grad()
    assert p.grad is None


def test_torch_step_is_the_first_torch_class_in_the_method_order():
    """A class of one's own over EagerOptimizer steps with its torch base's step, not Optimizer's."""

    class Mine(EagerOptimizer, torch.optim.SGD):
        pass

    ours, theirs = _params(5), _params(5)
    a, b = Mine(ours, lr=0.1, momentum=0.9), torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    for p, q in zip(ours, theirs):
        p.grad = q.grad = torch.full_like(p, 0.5)
    torch_step(a)
    b.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))
    assert a.state[ours[0]]["momentum_buffer"] is not None
