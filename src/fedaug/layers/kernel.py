"""The FFA layer's fused kernels: the compiled CPU kernel (``csrc/ffa_restyle.cpp``: build, cache and
load) and the Triton kernels (:mod:`fedaug.layers.triton_op`: import on first use).

:func:`fedaug.layers.functional.restyle` with ``kernel="on"``, a
:class:`~fedaug.layers.functional.StatNoise` map and a CPU float tensor runs
``torch.ops.fedaug.ffa_restyle``: the statistics (Eq. 2), the noise map (Eq. 3, 7, 9), the
re-styling (Eq. 8) and the exact backward in one C++ autograd node, instead of ~45 small ATen calls
from Python (on 2x2-14x14 maps those calls cost more than the arithmetic). Both paths compute the
same function; they agree to float rounding (tested to 1e-10 in float64). In float32 the last bits
differ, and a long training run amplifies them (docs/fedfa.md), so the path is part of a run's
config: the ``kernel`` option of :class:`~fedaug.layers.ffa.FFALayer` and of the ``fedfa`` and
``vfda`` components (:data:`MODES`). No environment variable chooses it.

The library is compiled on first use with the system C++ compiler against the installed torch
(~20 s; ``fedaug kernel`` or ``scripts/setup.sh`` does it ahead) for this CPU (``-march=native``,
OpenMP threads like ATen's), so its float32 rounding may differ between CPU models, and cached
under ``$FEDAUG_KERNEL_CACHE`` (default ``~/.cache/fedaug/kernels``), keyed by the source, torch's
and Python's versions, the CPU's model and flags, and the compiler command; a file lock makes
concurrent processes build it once. Nothing is downloaded.

On CUDA ``kernel="on"`` (and ``"triton"`` anywhere) takes the Triton path
(:mod:`fedaug.layers.triton_op`): the layer's training forward draws its coin and noise and updates
its running statistics inside the kernel (:func:`~fedaug.layers.triton_op.ffa_train`), and
``restyle`` runs the same kernel on given noise (:func:`~fedaug.layers.triton_op.ffa_restyle`, the
compiled kernel's arguments). It needs the ``triton`` package (the ``gpu`` extra; torch's CUDA wheels
ship it); Triton compiles it for the GPU on first use and caches it (``~/.triton/cache``). It is
imported only then, so fedaug runs without triton. On a CPU the Triton path runs only under Triton's
interpreter (``TRITON_INTERPRET=1`` before triton is imported: slow, for tests;
:func:`check_triton_device`). :func:`fused_op` picks ``restyle``'s kernel by device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Literal, get_args

import torch

from fedaug.core import native
from fedaug.core.errors import ConfigError
from fedaug.core.native import CACHE_ENV, KernelBuildError, cache_dir

__all__ = ["CACHE_ENV", "FUSED_DEVICES", "MODES", "KernelBuildError", "build", "cache_dir", "check_triton_device",
           "fused_op", "restyle_op", "triton_module", "triton_on", "triton_op", "uses_triton"]

SOURCE = Path(__file__).with_name("csrc") / "ffa_restyle.cpp"
#: the FFA layers' computation paths: the pure-PyTorch path (default), the fused kernel of the device
#: (compiled C++ on the CPU, Triton on CUDA), the Triton path on any device (a CPU needs TRITON_INTERPRET=1).
KernelMode = Literal["off", "on", "triton"]
MODES: tuple[str, ...] = get_args(KernelMode)
#: device types with a fused kernel: the compiled C++ kernel on the CPU, the Triton kernel on CUDA.
FUSED_DEVICES = ("cpu", "cuda")
#: how to leave the kernel, for error messages.
_FIX_OFF = ('or set the FFA layers\' kernel option to "off" (the pure-PyTorch path, the default: '
            'method.options.fedfa.kernel / method.options.vfda.kernel, FFALayer(kernel="off"))')

#: the loaded op and a failed build's error, kept for the life of the process (loading is process-wide).
_STATE: dict[str, object] = {"op": None, "error": None}


def build() -> Path:
    """Compile the kernel unless a matching library is cached (:func:`fedaug.core.native.build`);
    return the library's path.

    Raises:
        KernelBuildError: no compiler, or the compiler failed (its last output lines are included).
    """
    return native.build(SOURCE, _FIX_OFF)


def restyle_op() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``torch.ops.fedaug.ffa_restyle``, built (:func:`build`) and loaded on the first call.

    Raises:
        KernelBuildError: the kernel cannot be built or loaded (the same error on every later call).
    """
    if _STATE["op"] is None and _STATE["error"] is None:
        try:
            torch.ops.load_library(str(build()))
            _STATE["op"] = torch.ops.fedaug.ffa_restyle
        except (KernelBuildError, OSError, RuntimeError) as err:
            _STATE["error"] = (err if isinstance(err, KernelBuildError)
                               else KernelBuildError(f"loading the kernel failed: {err}; {_FIX_OFF}"))
    if _STATE["error"] is not None:
        raise _STATE["error"]  # type: ignore[misc]
    return _STATE["op"]  # type: ignore[return-value]


def triton_module() -> ModuleType:
    """:mod:`fedaug.layers.triton_op`, the Triton path, imported on the first call.

    Raises:
        KernelBuildError: ``triton`` is not installed.
    """
    try:
        from fedaug.layers import triton_op as module
    except ImportError as err:
        raise KernelBuildError(f"the CUDA FFA kernel is written in Triton, which cannot be imported ({err}); install "
                               f"it with pip install 'fedaug[gpu]' (torch's CUDA wheels ship it) {_FIX_OFF}") from err
    return module


def triton_op() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fedaug.layers.triton_op.ffa_restyle`, the Triton re-styling with given noise (:func:`triton_module`)."""
    return triton_module().ffa_restyle


def uses_triton(kernel: str, device: torch.device) -> bool:
    """Whether an FFA layer with option ``kernel`` on ``device`` takes the Triton path: ``"triton"``
    anywhere, ``"on"`` on CUDA."""
    return kernel == "triton" or (kernel == "on" and device.type == "cuda")


def check_triton_device(device: torch.device, owner: str) -> None:
    """Import the Triton path (:func:`triton_module`) and check that it runs on ``device``: CUDA, or a CPU
    under Triton's interpreter.

    Raises:
        KernelBuildError: ``triton`` is not installed.
        ConfigError: ``device`` is a CPU and triton was imported without ``TRITON_INTERPRET=1``, or its
            interpreter cannot run here (:func:`fedaug.layers.triton_ffa.interpreter_runs`), or ``device`` is
            another device; the message names ``owner`` (e.g. ``fedfa.kernel``) and the fix.
    """
    triton_module()
    from fedaug.layers import triton_ffa

    if device.type == "cuda":
        return
    if device.type == "cpu" and triton_ffa.INTERPRETED:
        if not triton_ffa.interpreter_runs():
            import numpy
            import triton

            raise ConfigError(f"{owner}='triton' on the CPU runs Triton's interpreter, and that of triton "
                              f"{triton.__version__} cannot run under numpy {numpy.__version__} (it converts "
                              "one-element arrays to int, which numpy 2.4 refuses); install triton>=3.7 (torch>=2.12 "
                              f"ships it) or numpy<2.4, or set {owner}='on' (the compiled CPU kernel) or 'off'")
        return
    if device.type == "cpu":
        raise ConfigError(f"{owner}='triton' on the CPU runs Triton's interpreter, which needs TRITON_INTERPRET=1 in "
                          "the environment before triton is imported (slow: for tests); set it, or set "
                          f"{owner}='on' (the compiled CPU kernel) or 'off' (the PyTorch path)")
    raise ConfigError(f"{owner}='triton' runs on CUDA (or a CPU under Triton's interpreter), but the model is on "
                      f"{device}; set {owner}='off' (the PyTorch path, which runs on every device)")


@functools.cache
def triton_on(device_type: str, owner: str) -> ModuleType:
    """:func:`triton_module` once :func:`check_triton_device` passed for ``device_type`` (a failed check is not
    cached: it raises again), for the layer's every forward: a dictionary look-up after the first.

    Raises:
        KernelBuildError, ConfigError: as :func:`check_triton_device`.
    """
    check_triton_device(torch.device(device_type), owner)
    return triton_module()


def fused_op(device_type: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The fused kernel for tensors on ``device_type`` (one of :data:`FUSED_DEVICES`): the compiled CPU
    kernel (:func:`restyle_op`) or the Triton CUDA kernel (:func:`triton_op`).

    Raises:
        KernelBuildError: the kernel cannot be built or imported.
        ValueError: ``device_type`` has no fused kernel.
    """
    if device_type == "cpu":
        return restyle_op()
    if device_type == "cuda":
        return triton_op()
    raise ValueError(f"no fused FFA kernel for device type {device_type!r}; the fused kernels run on "
                     f"{' and '.join(FUSED_DEVICES)}")
