"""Process-wide settings for training: keep freed memory in the process (glibc).

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

import ctypes
import ctypes.util
import os
import sys

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
