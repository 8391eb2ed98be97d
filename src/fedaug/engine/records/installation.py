"""What this installation can do (``fedaug env``; every run directory's ``environment.jsonl``).

One report, as ``python -m torch.utils.collect_env`` and ``flwr --version`` give for their projects:
fedaug's, Python's and torch's versions; the CPU (model, torch's vector-instruction capability, the
cores and threads); every device and the precision flags that change float32 results (TF32 in
cuBLAS and cuDNN, the float32 matmul precision); fedaug's compiled CPU libraries, built or not and
why not, and what a run does without them; Triton and Flower; every optional extra's packages; and
which offline data sources this machine has; and what a run with the default settings does here (its device,
execution and data placement). Gathering it compiles nothing, imports no optional
package and reads no data set (0.4 s once torch is loaded on a 2-core AMD EPYC, most of it importing
torch's C++-extension helper for the libraries' cache keys; 0.08 s a second time).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedaug.core import local_sgd, native, server_ops
from fedaug.core.device import DATA_BUDGET, available_devices, cpu_name, free_memory, resolve_device
from fedaug.core.runtime import available_cores
from fedaug.core.version import __version__
from fedaug.data.sources import source_status
from fedaug.layers import kernel

#: fedaug's compiled CPU libraries (``fedaug kernel`` builds them): source, compiler flags, and what a
#: run does where one is not built
LIBRARIES: dict[str, tuple[Path, Sequence[str], str]] = {
    "ffa_kernel": (kernel.SOURCE, (), "runs with method.options.fedfa.kernel (or vfda.kernel) = \"on\" compile "
                   "it on first use (~20 s), or fail without a C++ compiler; the default \"off\" never uses it"),
    "server_ops": (server_ops.SOURCE, server_ops.FLAGS, "the server takes its PyTorch path: the same numbers, "
                   "slower with many small clients (W2 benchmark: engine / bare loop 1.10 instead of 1.02, "
                   "docs/benchmarks.md)"),
    "local_sgd": (local_sgd.SOURCE, local_sgd.FLAGS, "CPU clients step with torch.optim.SGD: the same numbers, "
                  "slower with many small clients (docs/benchmarks.md, W2)"),
}
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def library_status(name: str) -> dict[str, Any]:
    """One of :data:`LIBRARIES`: ``built``, its ``path`` if built, else ``why_not`` and what that ``costs``."""
    source, flags, costs = LIBRARIES[name]
    try:
        cxx = native.compiler("")
    except native.KernelBuildError:
        return {"built": False, "path": None, "costs": costs, "why_not": "no C++ compiler (looked at $CXX, g++, "
                "c++, clang++): apt-get install g++, then fedaug kernel"}
    lib = native.library_path(source, cxx, flags)
    if lib.is_file():
        return {"built": True, "path": str(lib), "costs": None, "why_not": None}
    return {"built": False, "path": None, "costs": costs,
            "why_not": f"none for this CPU and torch in the cache yet: run fedaug kernel (compiler {cxx})"}


def extras() -> dict[str, dict[str, str | None]]:
    """Every optional extra of fedaug's installed metadata: ``{extra: {distribution: version or None}}``
    (empty where fedaug is not installed as a distribution, e.g. run from a source tree alone)."""
    try:
        requires = metadata.requires("fedaug") or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, dict[str, str | None]] = {}
    for req in requires:
        name, extra = _REQUIREMENT.match(req), _EXTRA.search(req)
        if name and extra:
            out.setdefault(extra.group(1), {})[name.group(1)] = _version(name.group(1))
    return out


def devices() -> list[dict[str, Any]]:
    """Each device a config can name (:func:`~fedaug.core.device.available_devices`): its name, and on
    CUDA the model, compute capability, memory and bfloat16 support."""
    out: list[dict[str, Any]] = []
    for name in available_devices():
        if name.startswith("cuda"):
            props = torch.cuda.get_device_properties(name)
            out.append({"device": name, "name": props.name, "capability": f"{props.major}.{props.minor}",
                        "memory_gib": round(props.total_memory / 2**30, 1),
                        "bf16": torch.cuda.is_bf16_supported()})
        else:
            out.append({"device": name, "name": cpu_name() if name == "cpu" else "Apple MPS"})
    return out


def precision_flags() -> dict[str, Any]:
    """torch's process-wide switches that change float32 results: TF32 in cuBLAS matmuls and cuDNN
    convolutions (on NVIDIA GPUs from Ampere on; cuDNN's is on by default), the float32 matmul
    precision, reduced-precision reductions, and cuDNN's determinism and autotuning."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": cuda.allow_tf32, "cudnn_allow_tf32": cudnn.allow_tf32,
            "cuda_matmul_fp16_reduced_reduction": cuda.allow_fp16_reduced_precision_reduction,
            "cuda_matmul_bf16_reduced_reduction": cuda.allow_bf16_reduced_precision_reduction,
            "cudnn_deterministic": cudnn.deterministic, "cudnn_benchmark": cudnn.benchmark}


def defaults_here() -> dict[str, Any]:
    """What a run with the default settings does on this machine: the device ``"auto"`` resolves to, how its
    clients step (``train.cuda_graph = "auto"``: captured on CUDA where the method can be captured, else eager) and
    where their data waits between rounds (``data.on_device = "auto"``: on a CUDA device where it takes at most
    :data:`~fedaug.core.device.DATA_BUDGET` of the memory free, ``data_budget_gib`` of it now; else the host)."""
    device = resolve_device("auto")
    if device.type != "cuda":
        return {"device": str(device), "steps": "eager", "data": "host", "data_budget_gib": None}
    budget = DATA_BUDGET * (free_memory(device) or 0) / 2**30
    return {"device": str(device), "steps": "captured where the method can be captured, else eager",
            "data": "device where it fits the budget, else host", "data_budget_gib": round(budget, 1)}


def machine_line() -> str:
    """One line naming the machine a benchmark's figures come from (docs/benchmarks.md names one for each):
    ``"machine: AMD EPYC, torch CPU capability AVX2, 2 cores, torch 2.13.0+cpu"``, then each GPU."""
    gpus = "".join(f", {d['device']} {d['name']}" for d in devices() if d["device"].startswith("cuda"))
    return (f"machine: {cpu_name()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{available_cores()} cores, torch {torch.__version__}{gpus}")


def installation() -> dict[str, Any]:
    """The whole report (JSON-ready), in the order ``fedaug env`` prints it."""
    return {
        "fedaug": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "torch": {"version": str(torch.__version__), "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                  "openmp": torch.backends.openmp.is_available(), "mkldnn": torch.backends.mkldnn.is_available()},
        "cpu": {"model": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(),
                "capability_override": os.environ.get("ATEN_CPU_CAPABILITY"), "cores": available_cores(),
                "threads": torch.get_num_threads()},
        "devices": devices(),
        "defaults": defaults_here(),
        "precision": precision_flags(),
        "compiled": {name: library_status(name) for name in LIBRARIES},
        "triton": _version("triton"),
        "flower": _version("flwr"),
        "extras": extras(),
        "data": source_status(),
    }
