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

import contextlib
import hashlib
from collections.abc import Iterator

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


@contextlib.contextmanager
def scoped_global_seed(seed: int, *keys: Key) -> Iterator[None]:
    """Seed torch's global RNG from the keys inside the block and restore it afterwards.

    Library layers that only read global state (``nn.Dropout``, weight initialisers) then become
    a function of the keys alone, whatever ran before.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, *keys))
        yield
