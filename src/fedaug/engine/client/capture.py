"""How a client's step is captured and replayed (:mod:`~fedaug.engine.client.graphed`): CUDA graphs on a GPU
(:class:`CudaGraphs`), and on a CPU a faithful emulation of their semantics (:class:`TracedCapture`), so that
what decides a captured step's correctness is proven where there is no GPU (issue 45).

A CUDA graph records the kernels a step launches, once, and a replay launches exactly those kernels again on
the same memory: Python runs at capture alone, a replay reads every tensor at the address it had then, and a
step that reads a value on the host (``.item()``, ``bool(tensor)``, a branch on a tensor) cannot be captured.
:class:`TracedCapture` gives the same three properties on any device: it traces the step once into the tensor
operations it runs (:func:`torch.fx.experimental.proxy_tensor.make_fx`, with the step's tensors as constants
held by reference, so a replay reads and writes the same tensors), undoes what the trace wrote (a capture
computes nothing), refuses a host read during the trace, and replays only the recorded operations. A step that
keeps what it changes in a Python attribute (set while tracing, never again) therefore gives other numbers than
eager steps, as on a GPU (tests/engine/test_graphed.py keeps such a component as a regression test).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from fedaug.core.errors import ConfigError

#: operations that read a tensor's value on the host (a synchronisation, not capturable)
HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
              torch.ops.aten.equal.default)


class CaptureRefused(ConfigError):
    """A step that a capture would not replay exactly, found when it is first captured (after its warm-up steps,
    which are undone first): ``reason`` says why. ``train.cuda_graph = true`` fails with it; ``"auto"`` trains
    eagerly instead (:class:`~fedaug.engine.client.graphed.GraphedSteps`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"train.cuda_graph=true: {reason}; set train.cuda_graph=false")
        self.reason = reason


class Capture(Protocol):
    """How :class:`~fedaug.engine.client.graphed.GraphedSteps` warms up and captures a step."""

    def warm_up(self) -> contextlib.AbstractContextManager[None]:
        """Where the warm-up steps before a capture run."""

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        """``body`` captured without its effects; returns what replays it."""

    def rng_state(self) -> Tensor:
        """The global random stream's state on the device (a step must not draw from it)."""

    def set_rng_state(self, state: Tensor) -> None:
        """Put the global random stream back to ``state`` (what :meth:`rng_state` gave)."""


class CudaGraphs:
    """:class:`Capture` by :class:`torch.cuda.CUDAGraph` on ``device``: the warm-up runs on a side
    stream that waits for the current one and is waited for after, as PyTorch's notes ask."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextlib.contextmanager
    def warm_up(self) -> Iterator[None]:
        stream, current = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield
        current.wait_stream(stream)

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph.replay

    def rng_state(self) -> Tensor:
        return torch.cuda.get_rng_state(self.device)

    def set_rng_state(self, state: Tensor) -> None:
        torch.cuda.set_rng_state(state, self.device)


class _Undo(TorchDispatchMode):
    """While a step is traced: keep the first value of every tensor an operation reads or writes (to put it
    back after: a capture computes nothing), and refuse a host read. Every tensor, not only those an
    operation's schema marks as written: some kernels write tensors their schema does not mark (BatchNorm's
    running statistics in ``native_batch_norm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[int, tuple[Tensor, Tensor]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise ConfigError(f"train.cuda_graph=true: a training step reads a tensor's value on the host ({func}), "
                              "which a CUDA graph cannot capture (a component that branches on a tensor, or an "
                              "optimiser that is not capturable on this device); set train.cuda_graph=false")
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, Tensor) and id(t) not in self.first and not _overlaps(t):
                with _disable_current_modes():
                    self.first[id(t)] = (t, t.detach().clone())
        return func(*args, **kwargs)

    def undo(self) -> None:
        """Every tensor the trace touched back to its first value."""
        with torch.no_grad():
            for t, value in self.first.values():
                t.copy_(value)


def _overlaps(t: Tensor) -> bool:
    """Whether elements of ``t`` share memory (an expanded view): nothing writes it in place."""
    return any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape))


class TracedCapture:
    """:class:`Capture` with CUDA graphs' semantics on any device (module docstring): the step traced once into
    its tensor operations, replayed without Python. Warm-up runs in place; the global random stream is the
    CPU's (and, where there is one, the CUDA device's)."""

    def warm_up(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        undo = _Undo()

        def traced() -> None:
            with undo:
                body()

        graph = make_fx(traced)()
        undo.undo()

        def replay() -> None:
            with torch.no_grad():  # the trace holds the backward's operations; replaying builds no graph
                graph()

        return replay

    def rng_state(self) -> Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: Tensor) -> None:
        torch.set_rng_state(state)
