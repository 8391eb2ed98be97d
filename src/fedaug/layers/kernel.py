"""The FFA layer's compiled CPU kernel: build, cache and load ``csrc/ffa_restyle.cpp``.

:func:`fedaug.layers.functional.restyle` with a :class:`~fedaug.layers.functional.StatNoise` map
on a CPU float tensor runs ``torch.ops.fedaug.ffa_restyle``: the statistics (Eq. 2), the noise map
(Eq. 3, 7, 9), the re-styling (Eq. 8) and the exact backward in one C++ autograd node, instead of
~45 small ATen calls from Python (on 2x2-14x14 maps those calls cost more than the arithmetic).
Both paths compute the same function; they agree to float rounding (tested to 1e-10 in float64).

The library is compiled on first use with the system C++ compiler against the installed torch
(~20 s; ``scripts/setup.sh`` does it ahead) for this CPU (``-march=native``, OpenMP threads like
ATen's) and cached under ``$FEDAUG_KERNEL_CACHE`` (default ``~/.cache/fedaug/kernels``), keyed by
the source, torch's and Python's versions, the CPU's model and flags, and the compiler command; a
file lock makes concurrent processes build it once. Nothing is downloaded.

``FEDAUG_FFA_KERNEL`` chooses: ``auto`` (default: use it if it builds, else warn once and run the
pure-PyTorch path), ``on`` (a failed build raises :class:`KernelBuildError`), ``off`` (never).

Build ahead of time (prints the library's path): ``fedaug kernel``.
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
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from fedaug.core.errors import ConfigError, FedaugError

SOURCE = Path(__file__).with_name("csrc") / "ffa_restyle.cpp"
MODES = ("auto", "on", "off")
MODE_ENV, CACHE_ENV = "FEDAUG_FFA_KERNEL", "FEDAUG_KERNEL_CACHE"


class KernelBuildError(FedaugError, RuntimeError):
    """The compiled kernel could not be built or loaded (no compiler, a compile error, ...)."""


#: process-wide: the forced mode (``None``: read the environment), the loaded op, a failed build's error.
_STATE: dict[str, object] = {"forced": None, "op": None, "error": None}


def mode() -> str:
    """The kernel mode in effect: :func:`forced` if active, else ``$FEDAUG_FFA_KERNEL`` (``auto``)."""
    value = _STATE["forced"] or os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ConfigError(f"{MODE_ENV}={value!r} is not one of {', '.join(MODES)}; "
                          f"unset it or set it to auto (use the kernel when it builds), on or off")
    return str(value)


@contextlib.contextmanager
def forced(value: str) -> Iterator[None]:
    """Run a block with the kernel mode ``value`` (``auto``, ``on``, ``off``), whatever the environment says."""
    if value not in MODES:
        raise ConfigError(f"kernel mode {value!r} is not one of {', '.join(MODES)}")
    before = _STATE["forced"]
    _STATE["forced"] = value
    try:
        yield
    finally:
        _STATE["forced"] = before


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise KernelBuildError("no C++ compiler found (looked at $CXX, g++, c++, clang++); install one "
                               f"(apt-get install g++) or set {MODE_ENV}=off to use the pure-PyTorch path")
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
                                       f"{tail}\nfix the compiler set-up or set {MODE_ENV}=off")
            os.replace(tmp, lib)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return lib


def restyle_op() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """``torch.ops.fedaug.ffa_restyle``, built and loaded on first call; ``None`` when the mode is
    ``off`` or (``auto``) the build failed, after one warning.

    Raises:
        KernelBuildError: mode ``on`` and the kernel cannot be built or loaded.
    """
    current = mode()
    if current == "off":
        return None
    if _STATE["op"] is None and _STATE["error"] is None:
        try:
            torch.ops.load_library(str(build()))
            _STATE["op"] = torch.ops.fedaug.ffa_restyle
        except (KernelBuildError, OSError, RuntimeError) as err:
            _STATE["error"] = (err if isinstance(err, KernelBuildError)
                               else KernelBuildError(f"loading the kernel failed: {err}"))
            if current == "auto":
                warnings.warn(f"fedaug: the FFA layer's compiled kernel is unavailable, using the pure-PyTorch "
                              f"path (same results, slower on small maps): {_STATE['error']}", stacklevel=3)
    if _STATE["error"] is not None:
        if current == "on":
            raise _STATE["error"]  # type: ignore[misc]
        return None
    return _STATE["op"]  # type: ignore[return-value]
