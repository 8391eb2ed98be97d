"""The FFA layer's fused kernels: the compiled CPU kernel (``csrc/ffa_restyle.cpp``: build, cache and
load) and the Triton CUDA kernel (:mod:`fedaug.layers.triton_ffa`: import on first use).

:func:`fedaug.layers.functional.restyle` with ``kernel="on"``, a
:class:`~fedaug.layers.functional.StatNoise` map and a CPU float tensor runs
``torch.ops.fedaug.ffa_restyle``: the statistics (Eq. 2), the noise map (Eq. 3, 7, 9), the
re-styling (Eq. 8) and the exact backward in one C++ autograd node, instead of ~45 small ATen calls
from Python (on 2x2-14x14 maps those calls cost more than the arithmetic). Both paths compute the
same function; they agree to float rounding (tested to 1e-10 in float64). In float32 the last bits
differ, and a long training run amplifies them (docs/fedfa.md), so the path is part of a run's
config: the ``kernel`` option of :class:`~fedaug.layers.ffa.FFALayer` and of the ``fedfa`` and
``vfda`` components (``"off"``, the default: the pure-PyTorch path; ``"on"``: this kernel). No
environment variable chooses it.

The library is compiled on first use with the system C++ compiler against the installed torch
(~20 s; ``fedaug kernel`` or ``scripts/setup.sh`` does it ahead) for this CPU (``-march=native``,
OpenMP threads like ATen's), so its float32 rounding may differ between CPU models, and cached
under ``$FEDAUG_KERNEL_CACHE`` (default ``~/.cache/fedaug/kernels``), keyed by the source, torch's
and Python's versions, the CPU's model and flags, and the compiler command; a file lock makes
concurrent processes build it once. Nothing is downloaded.

On CUDA the same ``kernel="on"`` runs :func:`fedaug.layers.triton_ffa.ffa_restyle` (same arguments,
same function), which needs the ``triton`` package (the ``gpu`` extra; torch's CUDA wheels ship
it); Triton compiles it for the GPU on first use and caches it (``~/.triton/cache``). It is
imported only then, so fedaug runs without triton. :func:`fused_op` picks the kernel by device.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from fedaug.core.errors import FedaugError

SOURCE = Path(__file__).with_name("csrc") / "ffa_restyle.cpp"
#: the FFA layers' computation paths: the pure-PyTorch path (default), the fused kernel of the device.
MODES = ("off", "on")
#: device types with a fused kernel: the compiled C++ kernel on the CPU, the Triton kernel on CUDA.
FUSED_DEVICES = ("cpu", "cuda")
CACHE_ENV = "FEDAUG_KERNEL_CACHE"
#: chose the path before the ``kernel`` option existed (``auto``: the kernel when it built); no longer read.
RETIRED_ENV = "FEDAUG_FFA_KERNEL"
#: how to leave the kernel, for error messages.
_FIX_OFF = ('or set the FFA layers\' kernel option to "off" (the pure-PyTorch path, the default: '
            'method.options.fedfa.kernel / method.options.vfda.kernel, FFALayer(kernel="off"))')


class KernelBuildError(FedaugError, RuntimeError):
    """A fused kernel could not be built or loaded (no compiler, a compile error, no triton, ...)."""


#: the loaded op and a failed build's error, kept for the life of the process (loading is process-wide).
_STATE: dict[str, object] = {"op": None, "error": None}


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise KernelBuildError("no C++ compiler found (looked at $CXX, g++, c++, clang++); install one "
                               f"(apt-get install g++) {_FIX_OFF}")
    return cxx


def _command(cxx: str, out: Path) -> list[str]:
    import torch.utils.cpp_extension as cpp  # imports setuptools: only when building

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp.include_paths()]
    libs = [f"-L{p}" for p in cpp.library_paths()] + [f"-Wl,-rpath,{p}" for p in cpp.library_paths()]
    return [cxx, "-O3", "-march=native", "-std=c++20", "-fopenmp", "-shared", "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, str(SOURCE), *libs, "-lc10", "-ltorch_cpu", "-ltorch",
            "-o", str(out)]


def _cpu() -> str:
    """The CPU's model and feature flags (``-march=native`` code built on one CPU may not run on
    another: a cache shared between machines keeps one library per CPU kind)."""
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text().splitlines()
        return "|".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    return platform.machine() + platform.processor()


def cache_dir() -> Path:
    """Where built libraries live: ``$FEDAUG_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/fedaug/kernels``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedaug" / "kernels"


def build() -> Path:
    """Compile the kernel unless a matching library is cached; return the library's path.

    Raises:
        KernelBuildError: no compiler, or the compiler failed (its last output lines are included).
    """
    cxx = _compiler()
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                                     _cpu().encode(), " ".join(_command(cxx, Path())).encode()]))
    root = cache_dir()
    lib = root / f"ffa_restyle-{key.hexdigest()[:16]}.so"
    if lib.is_file():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{lib.stem}.lock", "w") as lock:
        with contextlib.suppress(ImportError):  # fcntl is POSIX; elsewhere concurrent builds just race
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_file():  # another process built it while we waited
            return lib
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=root)
        os.close(fd)
        try:
            done = subprocess.run(_command(cxx, Path(tmp)), capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
                raise KernelBuildError(f"compiling {SOURCE.name} with {cxx} failed (exit {done.returncode}):\n"
                                       f"{tail}\nfix the compiler set-up {_FIX_OFF}")
            os.replace(tmp, lib)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return lib


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


def triton_op() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fedaug.layers.triton_ffa.ffa_restyle`, the CUDA kernel, imported on the first call.

    Raises:
        KernelBuildError: ``triton`` is not installed.
    """
    try:
        from fedaug.layers import triton_ffa
    except ImportError as err:
        raise KernelBuildError(f"the CUDA FFA kernel is written in Triton, which cannot be imported ({err}); install "
                               f"it with pip install 'fedaug[gpu]' (torch's CUDA wheels ship it) {_FIX_OFF}") from err
    return triton_ffa.ffa_restyle


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
