"""fedaug's compiled CPU libraries: build with the system C++ compiler against the installed torch,
cache, and load.

Three libraries use this: the FFA layer's fused kernel (:mod:`fedaug.layers.kernel`, built on first
use where a config asks for it), the server's arithmetic on uploads (:mod:`fedaug.core.server_ops`) and
the clients' SGD step (:mod:`fedaug.core.local_sgd`), the last two used only where already built, e.g.
by ``fedaug kernel`` or ``scripts/setup.sh``: they give the same bits as their PyTorch paths, so a run
never waits for a compiler to get them. A ``.c`` source is plain C (no torch headers, loaded with
:mod:`ctypes`; compiled by the same compiler with ``-x c``, in a fraction of a second).

A library is compiled for this CPU (``-march=native``, OpenMP threads like ATen's) and cached under
``$FEDAUG_KERNEL_CACHE`` (default ``~/.cache/fedaug/kernels``), keyed by its source, torch's and
Python's versions, the CPU's model and flags, and the compiler command; a file lock makes concurrent
processes build it once. Nothing is downloaded.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedaug.core.errors import FedaugError

CACHE_ENV = "FEDAUG_KERNEL_CACHE"


class KernelBuildError(FedaugError, RuntimeError):
    """A compiled library could not be built or loaded (no compiler, a compile error, no triton, ...)."""


def compiler(fix: str) -> str:
    """The C++ compiler: ``$CXX``, else g++, c++ or clang++ on the path.

    Args:
        fix: what to do instead, appended to the error (how to leave the compiled path).

    Raises:
        KernelBuildError: none found.
    """
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise KernelBuildError(f"no C++ compiler found (looked at $CXX, g++, c++, clang++); install one "
                               f"(apt-get install g++) {fix}")
    return cxx


def command(cxx: str, source: Path, out: Path, flags: Sequence[str] = ()) -> list[str]:
    """The compile-and-link command of ``source`` into the shared library ``out`` (``flags`` after the
    optimisation flags); a ``.c`` source is compiled as plain C, without torch."""
    if source.suffix == ".c":
        return [cxx, "-x", "c", "-std=c11", "-O3", "-march=native", "-fopenmp", *flags, "-shared", "-fPIC",
                str(source), "-o", str(out)]
    import torch
    import torch.utils.cpp_extension as cpp  # imports setuptools: only when building

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp.include_paths()]
    libs = [f"-L{p}" for p in cpp.library_paths()] + [f"-Wl,-rpath,{p}" for p in cpp.library_paths()]
    return [cxx, "-O3", "-march=native", "-std=c++20", "-fopenmp", *flags, "-shared", "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, str(source), *libs, "-lc10", "-ltorch_cpu", "-ltorch",
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


def library_path(source: Path, cxx: str, flags: Sequence[str] = ()) -> Path:
    """Where the library of ``source`` built by ``cxx`` with ``flags`` is cached (built or not)."""
    import torch  # here, so that naming CACHE_ENV (fedaug kernel --help) imports no torch

    key = hashlib.sha256(b"\0".join([source.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                                     _cpu().encode(), " ".join(command(cxx, source, Path(), flags)).encode()]))
    return cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"


def build(source: Path, fix: str, flags: Sequence[str] = ()) -> Path:
    """Compile ``source`` unless a matching library is cached; return the library's path.

    Args:
        fix: what to do instead, appended to errors.
        flags: extra compiler flags (part of the cache key).

    Raises:
        KernelBuildError: no compiler, or the compiler failed (its last output lines are included).
    """
    cxx = compiler(fix)
    lib = library_path(source, cxx, flags)
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(lib.parent / f"{lib.stem}.lock", "w") as lock:
        with contextlib.suppress(ImportError):  # fcntl is POSIX; elsewhere concurrent builds just race
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_file():  # another process built it while we waited
            return lib
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
        os.close(fd)
        try:
            done = subprocess.run(command(cxx, source, Path(tmp), flags), capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
                raise KernelBuildError(f"compiling {source.name} with {cxx} failed (exit {done.returncode}):\n"
                                       f"{tail}\nfix the compiler set-up {fix}")
            os.replace(tmp, lib)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return lib


@dataclass(frozen=True)
class Library:
    """One of fedaug's compiled libraries used only where already built (:mod:`fedaug.core.server_ops`,
    :mod:`fedaug.core.local_sgd`).

    Args:
        source: its source file.
        flags: extra compiler flags (part of the cache key).
        fix: what a run does without it, appended to errors.
    """

    source: Path
    flags: tuple[str, ...]
    fix: str

    def build(self) -> Path:
        """Compile the library unless a matching one is cached; return its path.

        Raises:
            KernelBuildError: no compiler, or the compiler failed.
        """
        return build(self.source, self.fix, self.flags)

    def cached(self) -> Path | None:
        """Its cached file for this CPU and torch where built, else ``None``; never compiles.

        Raises:
            KernelBuildError: no compiler to name the cache entry by.
        """
        lib = library_path(self.source, compiler(self.fix), self.flags)
        return lib if lib.is_file() else None
