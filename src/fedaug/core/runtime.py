"""Process-wide settings for training: torch's thread count, and keeping freed memory (glibc).

Library calls (:func:`~fedaug.engine.simulate.run_experiment`,
:func:`~fedaug.engine.simulate.build_simulation`, ...) never change process-wide state. A process
entry point opts in with :func:`configure_process`: the ``fedaug`` command line does, and so do
the Flower ClientApp and ServerApp (each runs in a process that Flower starts for it); a Python
user calls it once, before training, when the process is theirs to tune.

A training step allocates and frees the same large tensors (activations, gradients) every step.
glibc's ``malloc`` serves blocks above its *mmap threshold* with fresh ``mmap`` pages and gives
them back on ``free``, and trims the heap top above its *trim threshold*, so the next step touches
new pages again: on our 2-core machine a ``small_cnn`` step on a batch of 32 took ~3,000-5,000 minor
page faults and 4-8 ms of kernel time (about a fifth of the step). Raising both thresholds keeps
freed blocks for reuse: ~30 faults per step. It must be both: raising only one of them makes glibc
stop adapting the other, and the faults go up.

The cost is that a process keeps its peak heap (freed memory is reused, not returned) and blocks
above 32 MiB (the largest threshold glibc accepts on 64-bit) are still mapped per allocation.
Set ``FEDAUG_MALLOC=default`` to leave glibc's defaults alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator

import torch

from fedaug.core.errors import ConfigError

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: free heap top kept before glibc returns memory to the system.
TRIM_THRESHOLD = 1024 * 1024 * 1024

_applied: bool | None = None


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process, once; see the module docstring.

    Returns:
        ``True`` if the thresholds are in effect; ``False`` on a platform without glibc's
        ``mallopt``, or when ``FEDAUG_MALLOC=default`` asks to keep the defaults.
    """
    global _applied
    if _applied is None:
        _applied = False
        if os.environ.get("FEDAUG_MALLOC", "") != "default" and sys.platform.startswith("linux"):
            name = ctypes.util.find_library("c")
            mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
            if mallopt is not None:
                _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


def configure_process(threads: int | None = None) -> None:
    """Apply fedaug's process-wide settings for training: torch's intra-op thread count and
    :func:`retain_freed_memory`. For process entry points (see the module docstring).

    Args:
        threads: ``torch.set_num_threads(threads)`` (a run's ``cfg.threads``); ``None`` leaves
            the thread count alone.

    Raises:
        ConfigError: ``threads`` is below 1.

    >>> before = torch.get_num_threads()
    >>> configure_process(1)
    >>> torch.get_num_threads()
    1
    >>> torch.set_num_threads(before)
    """
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    retain_freed_memory()


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run a block with ``threads`` torch intra-op threads, then restore the previous count
    (for a library call that runs work at a stated thread count, e.g. a grid's cells)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
