"""Seeded random streams derived from (seed, round, client, component, purpose).

No fedaug code draws from global RNG state on purpose: every stream is a fresh
:class:`torch.Generator` whose seed is a hash of the keys that identify the draw, so results do
not depend on the order (or the process) in which clients run (DESIGN.md, invariant 1).

A stream lives on the device it feeds (``generator(..., device=...)``; a CUDA generator draws
only CUDA tensors): the same keys seed it everywhere, so draws are order-free on every device, but
a CUDA generator's draws differ from a CPU generator's of the same seed. On the CPU nothing
depends on ``device``: a run's numbers are those of a CPU-only fedaug.
"""

from __future__ import annotations

import hashlib

import torch

Key = int | str


def derive_seed(seed: int, *keys: Key) -> int:
    """Return a 63-bit seed that is a deterministic hash of ``seed`` and ``keys``.

    Different key tuples give independent-looking seeds; the same tuple always gives the same seed.

    >>> derive_seed(0, "sample", 3) == derive_seed(0, "sample", 3)
    True
    """
    text = "\x1f".join([str(seed), *(f"{type(k).__name__}:{k}" for k in keys)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generator(seed: int, *keys: Key, device: torch.device | str = "cpu") -> torch.Generator:
    """A :class:`torch.Generator` on ``device`` seeded with :func:`derive_seed` of the keys.

    Draw from it with ``device=g.device`` (``torch.randperm(n, generator=g, device=g.device)``)."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, *keys))
    return g


class scoped_global_seed:  # noqa: N801 - used as a function: ``with scoped_global_seed(seed, *keys):``
    """Seed torch's global RNG from the keys inside the block and restore it afterwards.

    Library layers that only read global state (``nn.Dropout``, weight initialisers) then become
    a function of the keys alone, whatever ran before. The CPU's generator is seeded, and CUDA's
    and MPS's where they are in use; not with :func:`torch.manual_seed`, which also queues a lazy
    seeding of every uninitialised backend (CUDA, XPU, MTIA), each formatting a stack trace: a
    fifth of a round's time for a small client on the CPU. The CPU's draws are the same either way,
    and its state is saved and restored as ``torch.random.fork_rng(devices=[])`` does (a class, not
    a generator-based context manager: it is entered once per client).
    """

    def __init__(self, seed: int, *keys: Key) -> None:
        self.derived = derive_seed(seed, *keys)

    def __enter__(self) -> None:
        self._saved = torch.default_generator.get_state()
        torch.default_generator.manual_seed(self.derived)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(self.derived)
        if torch.backends.mps.is_available():
            torch.mps.manual_seed(self.derived)

    def __exit__(self, *exc: object) -> None:
        torch.default_generator.set_state(self._saved)
