"""Where a run's tensors live and at which precision it computes: ``device`` and ``precision``.

A config names a device as ``"auto"`` (CUDA if available, else the CPU), ``"cpu"``, ``"cuda"``
(the current CUDA device), ``"cuda:N"`` or ``"mps"``; :func:`resolve_device` turns it into a
:class:`torch.device` on *this* machine, or raises one :class:`~fedaug.core.errors.ConfigError`
naming the devices that are there. A run directory's ``config.toml`` keeps the name as written
(``"auto"`` stays ``"auto"``), so a run resumed on another machine resolves it again there; the
device it ran on is recorded in its summary (:func:`environment`).

``precision`` is ``"32"`` (true float32 everywhere: CUDA's matrix products and cuDNN's convolutions do
not round their inputs to TF32 while a client computes, :func:`float32_math`), ``"tf32"`` (float32 with
TF32 matrix products and convolutions on CUDA GPUs that have them: faster, with about 10 bits of
mantissa in those products; on other devices the same as ``"32"``), ``"bf16-mixed"`` or ``"16-mixed"``:
the forward pass and the loss run under :func:`torch.autocast` with bfloat16 or float16 (:func:`autocast`),
weights, optimiser state and every message stay float32 (true float32 outside autocast); ``"16-mixed"``
scales the loss with a :class:`torch.amp.GradScaler` (:func:`grad_scaler`). torch autocasts float16 on
the CPU too, so ``"16-mixed"`` is accepted there (no faster than float32 on a CPU; useful to test the
scaler path).
"""

from __future__ import annotations

import contextlib
import platform
import re
import warnings
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from fedaug.core.errors import ConfigError

#: what ``device`` may say in a config (availability is checked when it is resolved)
DEVICE_SYNTAX = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
#: the ``precision`` names (Lightning's, and ``"tf32"``) and the autocast dtype of each (``None``: no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"32": None, "tf32": None, "bf16-mixed": torch.bfloat16,
                                             "16-mixed": torch.float16}
#: how CUDA's float32 matrix products and cuDNN's float32 convolutions round, per precision (torch's
#: ``fp32_precision`` values: ``"ieee"`` true float32, ``"tf32"`` TensorFloat-32)
FLOAT32_MATH: dict[str, str] = {"32": "ieee", "tf32": "tf32", "bf16-mixed": "ieee", "16-mixed": "ieee"}
CPU = torch.device("cpu")


def available_devices() -> list[str]:
    """The devices of this machine that a config can name: ``cpu``, each ``cuda:N``, ``mps``."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def resolve_device(name: str) -> torch.device:
    """The :class:`torch.device` a config's ``device`` names on this machine.

    Args:
        name: ``"auto"`` (``cuda:<current>`` if CUDA is available, else ``cpu``), ``"cpu"``,
            ``"cuda"`` (the current CUDA device), ``"cuda:N"`` or ``"mps"``.

    Raises:
        ConfigError: a name of another form, or a device this machine does not have; the message
            lists the ones it has.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if not isinstance(name, str) or not DEVICE_SYNTAX.fullmatch(name):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and torch.cuda.is_available():
        name = f"cuda:{torch.cuda.current_device()}"
    if name not in available_devices():
        raise ConfigError(f"device {name!r} is not available on this machine; available: "
                          f"{', '.join(available_devices())} (or 'auto')")
    return torch.device(name)


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse a precision that ``device`` cannot autocast to.

    Raises:
        ConfigError: an unknown name, ``"bf16-mixed"`` on a CUDA device without bfloat16 support, or
            a device type torch cannot autocast.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if PRECISIONS[precision] is None:
        return
    if not torch.amp.autocast_mode.is_autocast_available(device.type):
        raise ConfigError(f"precision={precision!r}: torch cannot autocast on {device}; use precision='32'")
    if device.type == "cuda" and precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"precision='bf16-mixed': {torch.cuda.get_device_name(device)} has no bfloat16 support; "
                          "use '16-mixed' or '32'")


def _float32_math_settings() -> list[tuple[Any, str]]:
    """The ``(backend, attribute)`` pairs that decide whether float32 products round to TF32: torch's
    ``fp32_precision`` settings where it has them (2.9 on), else the older ``allow_tf32`` flags."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision"),
                (torch.backends.cudnn.rnn, "fp32_precision")]
    return [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]


@contextlib.contextmanager
def float32_math(precision: str) -> Iterator[None]:
    """Run a block with CUDA's float32 matrix products and cuDNN's float32 convolutions (and RNNs) at
    ``precision``'s rounding (:data:`FLOAT32_MATH`), then restore the settings as they were. PyTorch's
    defaults let cuDNN convolutions use TF32, so without this a ``"32"`` run on an Ampere or newer GPU
    would not be float32. Process-wide settings, read where kernels are chosen: a CUDA worker sets them
    around each client's phase, so the same process may run other code with its own (a worker on another
    device leaves them alone: :attr:`~fedaug.engine.client.worker.Worker.math`)."""
    want = FLOAT32_MATH[precision]
    settings = _float32_math_settings()
    before = [getattr(owner, name) for owner, name in settings]
    for owner, name in settings:
        setattr(owner, name, want == "tf32" if name == "allow_tf32" else want)
    try:
        yield
    finally:
        for (owner, name), value in zip(settings, before):
            setattr(owner, name, value)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of ``precision`` on ``device`` (no context at all for ``"32"``)."""
    dtype = PRECISIONS[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """A loss scaler for ``"16-mixed"`` (float16 gradients underflow without one), else ``None``."""
    return torch.amp.GradScaler(device.type) if precision == "16-mixed" else None


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (or buffer); the CPU for a module with neither."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return CPU


def to_device(tree: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``tree`` (dicts, lists, tuples, tensors and scalars) with every tensor on ``device``.

    A tensor already there is returned as it is (no copy, and no call of ``Tensor.to``, whose dispatch costs
    a small client's message microseconds a tensor), so on the run's own device this costs nothing; containers
    are rebuilt, scalars returned unchanged.
    """
    if isinstance(tree, torch.Tensor):
        return tree if tree.device == device else tree.to(device, non_blocking=non_blocking)
    if isinstance(tree, dict):
        return {k: to_device(v, device, non_blocking) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [to_device(v, device, non_blocking) for v in tree]
        return items if isinstance(tree, list) else tuple(items)
    return tree


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` for new tensors (CUDA: the driver's figure), ``None`` where unknown (CPU, MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return None


#: the share of a CUDA device's free memory that ``data.on_device = "auto"`` lets a run's data take (the rest is for
#: the model, optimiser state and activations, and in a pack for the runs built after it)
DATA_BUDGET = 0.5


def data_on_device(on_device: bool | str, nbytes: int, device: torch.device) -> bool:
    """Whether a run's data (``nbytes`` of every client's splits) stays on ``device`` for the whole run
    (``data.on_device``): ``true``: yes (refused where it does not fit, :func:`check_fits`); ``"auto"``: on a CUDA
    device where it takes at most :data:`DATA_BUDGET` of the memory free now (:func:`free_memory`; in a pack, what
    the runs built before it left), else no, after one notice (a :class:`UserWarning`); ``false``, and ``"auto"`` on
    another device: no (on a CPU the data is there either way).

    Raises:
        ConfigError: ``true`` and the data does not fit (:func:`check_fits`).
    """
    if on_device is True:
        check_fits(nbytes, device, "data.on_device=true (every client's splits)")
        return True
    if on_device != "auto" or device.type != "cuda":
        return False
    free = free_memory(device) or 0
    if nbytes <= DATA_BUDGET * free:
        return True
    warnings.warn(f"data.on_device=auto: the clients' data ({nbytes / 2**20:.1f} MiB) stays on the host in pinned "
                  f"memory, since it would take more than {DATA_BUDGET:.0%} of the {free / 2**20:.1f} MiB free on "
                  f"{device}; each client's data moves to the device when it runs (data.on_device=true keeps it "
                  "there where it fits at all)", UserWarning, stacklevel=2)
    return False


def check_fits(nbytes: int, device: torch.device, what: str) -> None:
    """Refuse to place ``nbytes`` of ``what`` on ``device`` when its free memory is known and smaller.

    Raises:
        ConfigError: the estimate, the free memory and the fix.
    """
    free = free_memory(device)
    if free is not None and nbytes > free:
        raise ConfigError(f"{what} needs an estimated {nbytes / 2**20:.1f} MiB on {device}, but only "
                          f"{free / 2**20:.1f} MiB are free; set data.on_device=false (data moves to the device "
                          "per round)")


def cpu_name() -> str:
    """This machine's CPU model as the OS names it (Linux: ``model name`` in ``/proc/cpuinfo``), else
    :func:`platform.processor` or the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, precision: str, deterministic: bool) -> dict[str, Any]:
    """What a run's summary records of where it ran: the device and its name, the precision, whether
    deterministic algorithms were on, the torch, CUDA and cuDNN versions (``None`` where absent), and
    the CPU: its model (``cpu``), the vector instructions torch's CPU kernels dispatch to
    (``cpu_capability``: ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``, ...; the ``ATEN_CPU_CAPABILITY``
    environment variable lowers it) and torch's thread count (``threads``). A float32 run on the CPU
    repeats bit for bit only on the same capability and thread count: the kernels' summation order
    follows both, and training amplifies the rounding (docs/engine.md, "Reproducibility across CPUs")."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = "Apple MPS"
    else:
        name = cpu_name()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"device": str(device), "device_name": name, "precision": precision, "deterministic": deterministic,
            "torch": str(torch.__version__), "cuda": torch.version.cuda, "cudnn": cudnn, "cpu": cpu_name(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}

