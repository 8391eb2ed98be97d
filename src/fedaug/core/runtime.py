"""Process-wide settings for training: torch's thread count, keeping freed memory (glibc), and
deterministic algorithms.

Library calls (:func:`~fedaug.engine.run.run_experiment`,
:func:`~fedaug.engine.run.build_simulation`, ...) never change process-wide state. A process
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

A run with ``deterministic = true`` runs inside :func:`deterministic_algorithms` (the engine enters
it; nothing changes without it), and an entry point sets ``CUBLAS_WORKSPACE_CONFIG`` before CUDA
starts (:func:`configure_process`), which deterministic cuBLAS needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator

import torch
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch._C import _len_torch_dispatch_stack

from fedaug.core.errors import ConfigError

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: free heap top kept before glibc returns memory to the system.
TRIM_THRESHOLD = 1024 * 1024 * 1024

#: cuBLAS's workspace setting for deterministic results (CUDA >= 10.2; read when CUDA starts)
CUBLAS_WORKSPACE = ":4096:8"

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


def configure_process(threads: int | None = None, deterministic: bool = False) -> None:
    """Apply fedaug's process-wide settings for training: torch's intra-op thread count,
    :func:`retain_freed_memory` and, for a deterministic run, ``CUBLAS_WORKSPACE_CONFIG`` (unless
    already set). For process entry points (see the module docstring), before CUDA starts.

    Args:
        threads: ``torch.set_num_threads(threads)`` (a run's ``cfg.threads``); ``None`` leaves
            the thread count alone.
        deterministic: a run's ``cfg.deterministic``.

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
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    retain_freed_memory()


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """Run a block with torch's deterministic algorithms (``enabled``), then restore the settings.

    On: ``torch.use_deterministic_algorithms(True)`` (an operation without a deterministic kernel
    raises, naming itself), cuDNN's benchmark off and its deterministic mode on, and
    ``CUBLAS_WORKSPACE_CONFIG`` set if unset (effective only if CUDA has not started yet: an entry
    point sets it earlier, :func:`configure_process`). Off: nothing is touched, so the CPU
    defaults stay as they are. docs/engine.md ("Devices and precision") lists the costs.
    """
    if not enabled:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[2], before[3]


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


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def untraced() -> bool:
    """Whether torch runs plainly here, so that work done outside its dispatcher (a compiled library called
    directly, a kernel launched without its operator) is seen by no one who needed to see it: no dispatch
    mode is active (``make_fx`` tracing a step for a CUDA graph, fake tensors, a test's counting mode) and
    nothing is being compiled or traced by ``torch.fx``."""
    return not _len_torch_dispatch_stack() and not is_fx_symbolic_tracing() and not torch.compiler.is_compiling()
