"""Derived seeds and scoped global seeding."""

from __future__ import annotations

import torch

from fedaug.core.rng import derive_seed, generator, scoped_global_seed


def test_derived_seed_is_stable_and_key_sensitive():
    assert derive_seed(0, "a", 1) == derive_seed(0, "a", 1)
    seeds = {derive_seed(s, p, r) for s in (0, 1) for p in ("a", "b") for r in (1, 2)}
    assert len(seeds) == 8
    assert derive_seed(0, 1) != derive_seed(0, "1")  # types are part of the key
    assert 0 <= derive_seed(5, "x") < 2**63


def test_generators_from_equal_keys_draw_equal_numbers():
    a = torch.rand(5, generator=generator(3, "client", 2))
    b = torch.rand(5, generator=generator(3, "client", 2))
    c = torch.rand(5, generator=generator(3, "client", 3))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_scoped_global_seed_is_reproducible_and_restores_the_global_state():
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    with scoped_global_seed(1, "init"):
        x = torch.rand(3)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.rand(10)  # whatever ran before does not matter
    with scoped_global_seed(1, "init"):
        y = torch.rand(3)
    assert torch.equal(x, y)


def test_scoped_global_seed_draws_what_torch_manual_seed_of_the_derived_seed_draws():
    """The same global stream as ``torch.manual_seed(derive_seed(...))`` (what it called before it seeded
    only the generators in use): dropout masks and initialisers of existing runs do not move."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(5, "client", 2, 7))
        want = (torch.rand(4), torch.randn(3), torch.randperm(6))
    with scoped_global_seed(5, "client", 2, 7):
        got = (torch.rand(4), torch.randn(3), torch.randperm(6))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_scoped_global_seed_formats_no_stack_trace(monkeypatch):
    """torch.manual_seed queues a lazy seeding of each uninitialised backend (CUDA, XPU, MTIA) with a
    formatted stack trace, a fifth of a small client's round; seeding the generators in use does not."""
    import traceback

    calls = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: calls.append(a) or [])
    torch.manual_seed(1)
    queued = len(calls)
    with scoped_global_seed(5, "client", 2, 7):
        pass
    assert len(calls) == queued and (queued > 0 or torch.cuda.is_initialized())
