"""The server's arithmetic on uploads in one pass each, from a compiled library
(``csrc/server_ops.cpp``), used where it is already built.

:func:`weighted_sum` is fedavg's weighted mean before its cast (:func:`fedaug.methods.base.fedavg.
weighted_average`) with the same bits as its PyTorch path: every element takes the same two roundings
per client in the same order. Its PyTorch path reads each upload three times and writes a float64
copy; here each upload is read once, which on a round of a hundred small clients is a good part of
the server's work. ``upload_stats`` gives, for each float32 upload entry and the entry sent, the
squared distance (float32 differences, exact float64 squares, a fixed-order float64 sum) and the
upload's extremes in one read of both (:class:`fedaug.core.payload.Against`, whose PyTorch path
computes the same distance through a buffer).

Since the results are the same, a run never waits for a compiler for them: the library is used where
``fedaug kernel`` (``scripts/setup.sh`` runs it) built it for this CPU and torch, and the PyTorch path
serves everywhere else (:func:`loaded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from fedaug.core import native

#: no fused multiply-add: the library's sums take the PyTorch path's two roundings per term
LIBRARY = native.Library(Path(__file__).with_name("csrc") / "server_ops.cpp", ("-ffp-contract=off",),
                         "(the server then uses its PyTorch path, which gives the same results)")
SOURCE, FLAGS, build = LIBRARY.source, LIBRARY.flags, LIBRARY.build

#: the loaded ops, looked up once per process (None: not built here)
_STATE: dict[str, object] = {}


def loaded() -> object | None:
    """``torch.ops.fedaug_server`` if the library is built for this CPU and torch (loaded on the first
    call), else ``None``; never compiles."""
    if "ops" not in _STATE:
        ops = None
        try:
            lib = LIBRARY.cached()
            if lib is not None:
                torch.ops.load_library(str(lib))
                ops = torch.ops.fedaug_server
        except (native.KernelBuildError, OSError, RuntimeError):
            ops = None
        _STATE["ops"] = ops
    return _STATE["ops"]


def _fits(tensors: Sequence[Tensor]) -> bool:
    first = tensors[0]
    return first.dtype in (torch.float32, torch.float64) and all(
        t.is_cpu and t.is_contiguous() and t.dtype == first.dtype and t.shape == first.shape for t in tensors)


def weighted_sum(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """``sum_k weights[k] * float64(tensors[k])``, accumulated in order from zero, as float64.

    Args:
        tensors: same-shaped float tensors, one per client.
        weights: one float per tensor.

    Returns:
        A float64 tensor of the inputs' shape; the same bits whether the library is loaded or not.
    """
    return weighted_sums([tensors], weights)[0]


def weighted_sums(columns: Sequence[Sequence[Tensor]], weights: Sequence[float]) -> list[Tensor]:
    """:func:`weighted_sum` of each column (one entry's tensors, one per client) with the same weights.

    A column that fits the compiled library takes its one pass; the others take the PyTorch path together:
    each client's terms of every such column in three multi-tensor operations (copy into float64, scale,
    add; on a GPU a few launches per client, not three per entry). The same bits either way: every element
    takes the same two roundings per client (the float64 cast is exact), in client order.
    """
    ops = loaded()
    out: list[Tensor] = [None] * len(columns)  # type: ignore[list-item]
    rest = []
    with torch.no_grad():
        for i, column in enumerate(columns):
            if ops is not None and _fits(column):
                out[i] = ops.weighted_sum(list(column), list(weights))
            else:
                rest.append(i)
        if rest:
            accs = [torch.zeros(columns[i][0].shape, dtype=torch.float64, device=columns[i][0].device) for i in rest]
            terms = [torch.empty_like(a) for a in accs]  # one buffer per entry for every client's w_k t_k
            for k, wk in enumerate(weights):
                torch._foreach_copy_(terms, [columns[i][k] for i in rest])
                torch._foreach_mul_(terms, wk)
                torch._foreach_add_(accs, terms)
            for i, acc in zip(rest, accs):
                out[i] = acc
    return out
