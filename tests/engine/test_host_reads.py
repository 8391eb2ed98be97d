"""Host reads and operator calls of a round, counted (issue 46; DESIGN.md, "One step, several executions").

Every read of a tensor's value on the host (``item``, ``tolist``, ``float``/``int``/``bool`` of a tensor, and
what torch reads inside its own operations, ``aten._local_scalar_dense``) is a synchronisation on a GPU, so a
round may read a constant number of values plus a constant number per client, never one per tensor of the
model. Every operator call that computes (a view computes nothing) is a kernel launch on a GPU, so the
engine's work around a client's local steps (loading the weights, the upload's copy, its check, the average)
calls a constant number per client. Counted on the CPU, where the same code runs: mobilenetv2_cifar (344
state entries) as often as small_cnn (26).
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedaug.config.schema import validate
from fedaug.core import payload, server_ops
from fedaug.engine.client import training
from fedaug.engine.run import build_simulation

#: the tensor methods that read values on the host
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


class HostReads(TorchDispatchMode):
    """Counts host reads by where in fedaug they happen: calls of :data:`READS`, and torch's own reads
    (``aten._local_scalar_dense`` outside those calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_place: collections.Counter[str] = collections.Counter()
        self._inside = 0

    def note(self) -> None:
        stack = traceback.extract_stack(limit=16)[:-2]
        place = next((f"{f.filename.split('src/')[-1]}:{f.lineno}" for f in reversed(stack)
                      if "/src/fedaug/" in f.filename), "elsewhere")
        self.by_place[place] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and not self._inside:
            self.note()
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_place.values())


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostReads]:
    reads = HostReads()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            reads.note()
            reads._inside += 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                reads._inside -= 1

        monkeypatch.setattr(torch.Tensor, name, read)
    with reads:
        yield reads
    monkeypatch.undo()


#: the programs a round runs: the CPU's (the compiled server library's upload pass where it is built) and an
#: accelerator's, on the CPU (no compiled library, small tensors' extremes fused, as on CUDA)
PROGRAMS = ("cpu", "accelerator")


def federation(monkeypatch: pytest.MonkeyPatch, model: str, clients: int, program: str, every: int, *,
               method: dict[str, Any] | None = None, steps: int = 1) -> Any:
    """A small federation on ``model`` running ``program``'s branches (:data:`PROGRAMS`), evaluated every
    ``every`` rounds, training ``method`` (default FedAvg) for ``steps`` local steps."""
    if program == "accelerator":
        monkeypatch.setattr(server_ops, "loaded", lambda: None)
        monkeypatch.setattr(payload, "fuses", lambda device: True)
    raw = {"seed": 0, "threads": 1, "model": {"name": model}, **({"method": method} if method else {}),
           "data": {"name": "synthetic", "options": {"num_clients": clients, "samples_per_client": 12, "size": 16,
                                                     "channels": 3, "num_classes": 10}},
           "train": {"rounds": 2, "local_steps": steps, "batch_size": 6}, "eval": {"every": every}}
    return build_simulation(validate(raw))


def mark_local_steps(monkeypatch: pytest.MonkeyPatch, mode: Any) -> None:
    """``mode.inside`` raised while a client's local steps run (:func:`~fedaug.engine.client.training.eager_steps`)."""
    steps = training.eager_steps

    def local_steps(*args: Any, **kwargs: Any) -> Any:
        mode.inside += 1
        try:
            return steps(*args, **kwargs)
        finally:
            mode.inside -= 1

    monkeypatch.setattr(training, "eager_steps", local_steps)


def round_reads(monkeypatch: pytest.MonkeyPatch, model: str, clients: int, program: str = "cpu") -> HostReads:
    """The host reads of round 2 (training, aggregation, evaluation) of a small federation on ``model``,
    running ``program``'s branches (:data:`PROGRAMS`)."""
    sim = federation(monkeypatch, model, clients, program, every=1)
    sim.run_round(1)  # first-round work (caches of the server's unchanged tensors) left out
    sim.evaluate()
    with counting(monkeypatch) as reads:
        sim.run_round(2)
        sim.evaluate()
    return reads


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_rounds_host_reads_do_not_grow_with_the_number_of_tensors(monkeypatch, program):
    """On an accelerator's branches, the upload check read each reference tensor's extremes alone (one read per
    tensor: 96 reads for small_cnn, 361 for mobilenetv2_cifar, and as many synchronisations on an H100)."""
    small, large = (round_reads(monkeypatch, m, 3, program) for m in ("small_cnn", "mobilenetv2_cifar"))
    assert large.total == small.total, (small.by_place, large.by_place)


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_rounds_host_reads_are_a_constant_plus_a_constant_per_client(monkeypatch, program):
    counts = {n: round_reads(monkeypatch, "small_cnn", n, program).total for n in (2, 3, 5)}
    per_client = counts[3] - counts[2]
    assert counts[5] - counts[3] == 2 * per_client, counts  # linear in the clients
    # measured: 6 per client on the CPU's branches, 7 on an accelerator's (the upload check's passes, the training
    # metrics, the evaluation counts: one read each), 5 per round; the meters read per batch and per count were 22
    assert per_client <= 7 and counts[2] - 2 * per_client <= 5, counts


#: operators that synchronise with the host on a GPU besides the host reads: an output whose size depends on values
#: (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``, ``bincount``, ``repeat_interleave``), a
#: comparison returned to Python (``equal``, ``is_nonzero``), host data made a tensor (``lift_fresh``: on a GPU a
#: copy from pageable memory)
SYNCING = frozenset({"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                     "bincount", "repeat_interleave", "equal", "is_nonzero", "lift_fresh"})


class Syncing(TorchDispatchMode):
    """Counts the calls of :data:`SYNCING` operators (and indexing by a boolean mask) by name, inside the clients'
    local steps (:attr:`inside` > 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: collections.Counter[str] = collections.Counter()
        self.inside = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        name = func.overloadpacket.__name__
        masked = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        if self.inside and (name in SYNCING or masked):
            self.names[name] += 1
        return func(*args, **(kwargs or {}))


def steps_round(monkeypatch: pytest.MonkeyPatch, method: dict[str, Any], steps: int) -> tuple[HostReads, Syncing]:
    """Round 2 of a federation of 2 small_cnn clients training ``steps`` local steps with ``method``: its host reads
    (training and aggregation) and the syncing operators of its local steps."""
    sim = federation(monkeypatch, "small_cnn", 2, "cpu", 100, method=method, steps=steps)
    sim.run_round(1)
    syncing = Syncing()
    mark_local_steps(monkeypatch, syncing)
    with counting(monkeypatch) as reads, syncing:
        sim.run_round(2)
    return reads, syncing


@pytest.mark.parametrize("method", [{"base": "fedavg"}, {"base": "fedprox"}, {"base": "scaffold"},
                                    {"base": "fedsam"}, {"base": "fedavg", "augs": ["fedrdn"]}],
                         ids=lambda m: "+".join([m["base"], *m.get("augs", [])]))
def test_a_clients_local_steps_read_the_host_a_constant_number_of_times_not_once_per_step(monkeypatch, method):
    """Issue 63: a round of 3 local steps a client reads the host as often as one of 9 (the losses and loss terms
    summed on the device, read once per client with its metrics), and no local step runs an operator that
    synchronises on a GPU (:data:`SYNCING`). Measured: 11 reads a round for 2 clients (22 with FedRDN, whose
    statistics travel), 0 syncing operators. (Methods whose draws are defined by a host read are left out, each
    read once per step and stream: FedFA's PyTorch path reads its coin per layer, MixStyle its coin and its Beta
    draws' seed, Mixup and FLea the seed and copy the NumPy draws to the device; docs/benchmarks.md.)"""
    few, few_ops = steps_round(monkeypatch, method, 3)
    monkeypatch.undo()
    many, many_ops = steps_round(monkeypatch, method, 9)
    assert many.total == few.total, (few.by_place, many.by_place)
    assert not few_ops.names and not many_ops.names, (few_ops.names, many_ops.names)
    assert few.total <= 22, few.by_place


#: operators that compute nothing (views and aliases: no kernel on a GPU)
VIEWS = frozenset({"view", "_unsafe_view", "_reshape_alias", "detach", "alias", "t", "slice", "select", "expand",
                   "as_strided", "unsqueeze", "squeeze", "lift_fresh", "permute", "transpose", "unbind"})


class Calls(TorchDispatchMode):
    """Counts the operator calls that compute, outside the clients' local steps (:attr:`inside` > 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.total, self.inside = 0, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if not self.inside and func.overloadpacket.__name__ not in VIEWS:
            self.total += 1
        return func(*args, **(kwargs or {}))


def round_calls(monkeypatch: pytest.MonkeyPatch, model: str, clients: int, program: str) -> int:
    """The computing operator calls of round 2 (training and aggregation, no evaluation) of a small federation
    on ``model``, outside the clients' local steps (:func:`~fedaug.engine.client.training.eager_steps`)."""
    sim = federation(monkeypatch, model, clients, program, every=100)
    sim.run_round(1)
    calls = Calls()
    mark_local_steps(monkeypatch, calls)
    with calls:
        sim.run_round(2)
    monkeypatch.undo()
    return calls.total


def test_the_work_around_the_local_steps_calls_a_constant_number_of_operators_per_client(monkeypatch):
    """On an accelerator's branches (where each call is a kernel launch): the upload's copy, its differences
    and norms and the float64 average took three to eight calls per tensor and client (1,902 calls a client
    outside the steps for mobilenetv2_cifar, 153 for small_cnn); they are multi-tensor operations now (43 for
    both). (On the
    CPU's branches a range-checked entry, BatchNorm's running variance and batch counter, still takes one
    ``aminmax`` of a few microseconds each; there a call launches nothing.)"""
    per_client = {m: round_calls(monkeypatch, m, 3, "accelerator") - round_calls(monkeypatch, m, 2, "accelerator")
                  for m in ("small_cnn", "mobilenetv2_cifar")}
    assert per_client["mobilenetv2_cifar"] == per_client["small_cnn"], per_client


def pack_reads(monkeypatch: pytest.MonkeyPatch, cells: int, rounds: int) -> int:
    """The host reads of a pack of ``cells`` small federations (3 clients each, seeds 0, 1, ...) run for ``rounds``
    rounds with an evaluation after each, counted in every thread (the cells' and the pack's own)."""
    from fedaug.engine.fleet.packed import Pack
    from fedaug.methods.base import fedavg

    fedavg._normalized.cache_clear()  # the weights' normalisation is cached (read once) across runs of a process
    raw = {"seed": 0, "threads": 1, "model": {"name": "small_cnn"},
           "data": {"name": "synthetic", "options": {"num_clients": 3, "samples_per_client": 12, "size": 16,
                                                     "channels": 3, "num_classes": 10}},
           "train": {"rounds": rounds, "local_steps": 1, "batch_size": 6}, "eval": {"every": 1}}
    with counting(monkeypatch) as reads:
        def body(slot: Any, seed: int) -> None:
            with reads:  # the mode is each thread's own
                sim = build_simulation(validate({**raw, "seed": seed}), trainer=slot.train)
                for r in range(1, rounds + 1):
                    sim.run_round(r)
                    sim.evaluate()

        results = Pack().run([lambda slot, s=s: body(slot, s) for s in range(cells)])
    assert not [r for r in results if isinstance(r, BaseException)], results
    return reads.total


def test_a_packed_rounds_host_reads_are_a_constant_plus_a_constant_per_cell(monkeypatch):
    """A pack's round (round 2 less round 1's reads: building and first-round work cancel) reads a constant plus a
    constant per cell of three clients; the training metrics are read once per group (one per round here: every
    client of the pack in one group), not once per client, so a packed cell reads at most what it reads alone."""
    per_round = {k: pack_reads(monkeypatch, k, 2) - pack_reads(monkeypatch, k, 1) for k in (1, 2, 3)}
    per_cell = per_round[2] - per_round[1]
    assert per_round[3] - per_round[2] == per_cell, per_round  # linear in the cells
    alone = round_reads(monkeypatch, "small_cnn", 3).total  # one cell of three clients, one at a time
    assert per_cell <= alone - 2, (per_round, alone)  # three clients' training metrics in one read
