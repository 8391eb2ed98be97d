"""Clients on worker processes: the in-process engine's fleet for ``workers > 1`` (issue "Throughput").

A :class:`ProcessFleet` runs each phase's clients on a pool of worker processes on this machine;
each holds its own worker model (:func:`~fedaug.engine.client.worker.build_worker_model`), its torch
threads set to ``cfg.threads``, and the federation's data in shared memory (one copy for all the
workers, :func:`pack`). The server process keeps the client states and does validation, accounting
and aggregation exactly as with one worker, and this fleet yields the answers in the order the
server asked for them, so the records are bit-identical to ``workers = 1`` at the same thread
count (DESIGN.md, "Throughput"): a client's computation depends on the message, its state and
the seed only (invariant 1), never on the process or on which clients ran before it.

Clients go to whichever worker is free, the most expensive first (its number of local steps, or of
samples to evaluate): the longest-processing-time rule, which keeps the round's last worker from
starting a long client when the others are done. ``devices`` places the workers on devices in turn
(several workers may share one GPU). A worker that dies ends the phase with a
:class:`WorkerDied` naming the client it ran; Ctrl-C ends every worker (they ignore SIGINT and
stop when the server process closes the pool or goes away).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import signal
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait

import torch

from fedaug.config.schema import RunConfig, validate
from fedaug.core.payload import Message
from fedaug.core.runtime import available_cores, configure_process, deterministic_algorithms
from fedaug.data.base import FederatedData
from fedaug.engine.fleet.base import StatesHere
from fedaug.engine.fleet.tasks import (PACKED_SPLITS, Answered, Failed, Packed, Task, WorkerDied, WorkerSetup,
                                       answer, build_worker, expected_cost, in_order, longest_first, pack,
                                       picklable, raise_failure, recipe_bytes, reply_on)
from fedaug.engine.fleet.transport import Channel, remove_arenas
from fedaug.engine.protocol import Reply
from fedaug.methods.component import Phase
from fedaug.methods.recipe import Recipe

#: what this module's old path (``fedaug.engine.pool``) still finds here, from the module they live in now
__all__ = ["PACKED_SPLITS", "Answered", "Failed", "NewPhase", "Packed", "ProcessFleet", "Task", "WorkerDied",
           "expected_cost", "pack"]


@dataclass(frozen=True)
class NewPhase:
    """The server's note to a worker process that a phase begins: forget the last phase's tensors."""


def _serve(conn: Connection, setup: WorkerSetup) -> None:
    """A worker process: build the worker, then answer tasks until the server closes the connection
    (a worker that cannot be built answers every task with the reason)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it closes the pool
    _name_process(multiprocessing.current_process().name)
    channel = Channel(conn)
    try:
        _answer_tasks(channel, setup)
    finally:
        channel.close()


def _answer_tasks(channel: Channel, setup: WorkerSetup) -> None:
    cfg = validate(setup.config)
    configure_process(cfg.threads, cfg.deterministic)
    with deterministic_algorithms(cfg.deterministic):
        try:
            worker, clients = build_worker(cfg, setup)
            failure = None
        except Exception as exc:  # noqa: BLE001 - raised again in the server process, with the first task
            failure = (picklable(exc), traceback.format_exc())
        while True:
            try:
                task: Task | NewPhase = channel.recv()
            except EOFError:
                return
            if isinstance(task, NewPhase):
                channel.reset()
                continue
            reply = Failed(task.client, *failure) if failure is not None else answer(worker, clients, task)
            channel.send(reply, remember=False)


def _name_process(name: str) -> None:
    """Show ``name`` for this process in ``ps``/``top`` (Linux; elsewhere nothing happens)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        return


@dataclass
class _Process:
    process: multiprocessing.process.BaseProcess
    channel: Channel
    device: str
    client: int | None = None  # the client it runs now


class ProcessFleet(StatesHere):
    """The clients of a dataset held in this process, trained on ``workers`` worker processes.

    Args:
        cfg: the run configuration (``workers``, ``devices``, ``threads`` per worker).
        recipe: the method, pickled for the workers as it is now (before any component's setup).
        data: the federated dataset (packed into shared memory once).
        device: where the server's state lives; replies are delivered there.
        devices: the workers' devices, in turn.

    Raises:
        ConfigError: a recipe that cannot be pickled (a component defined where the workers cannot
            import it).
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, data: FederatedData, device: torch.device,
                 devices: Sequence[str]) -> None:
        super().__init__()
        method = recipe_bytes(cfg, recipe, "worker processes")
        cores = available_cores()
        if cfg.workers * cfg.threads > cores:
            warnings.warn(f"workers={cfg.workers} x threads={cfg.threads} = {cfg.workers * cfg.threads} threads on {cores} "
                          f"cores: they slow each other down; set threads={max(1, cores // cfg.workers)} (or fewer "
                          "workers) to fit the cores (the records depend on threads, not on workers)", stacklevel=3)
        self.cfg, self.device = cfg, device
        self.clients = list(data.clients)
        self._setup = WorkerSetup(cfg.to_dict(), method, pack(data), tuple(data.input_shape), data.num_classes,
                                  data.task, "")
        self._devices = list(devices)
        self._pool: list[_Process] = []
        self._finalizer: weakref.finalize | None = None

    # --- the pool -----------------------------------------------------------------------------
    def _start(self) -> list[_Process]:
        if self._pool:
            return self._pool
        ctx = _context(self._devices)
        for k in range(self.cfg.workers):
            device = self._devices[k % len(self._devices)]
            ours, theirs = ctx.Pipe()
            setup = replace(self._setup, device=device)
            process = ctx.Process(target=_serve, args=(theirs, setup), name=f"fedaug-worker-{k}", daemon=True)
            process.start()
            theirs.close()
            self._pool.append(_Process(process, Channel(ours), device))
        self._finalizer = weakref.finalize(self, _stop, list(self._pool))
        return self._pool

    def close(self) -> None:
        """Stop every worker process (idempotent; also when this fleet is garbage collected)."""
        if self._finalizer is not None:
            self._finalizer()
        self._pool = []

    # --- a phase ------------------------------------------------------------------------------
    def run(self, phase: Phase, r: int, lr: float, client_ids: Sequence[int],
            message: Callable[[int], Message]) -> Iterator[tuple[int, Reply]]:
        pool = self._start()
        for w in pool:
            w.channel.send(NewPhase())
            w.channel.reset()
        ids = list(client_ids)
        yield from self.delivered(phase, in_order(ids, self._answers(pool, phase, r, lr, ids, message)))

    def _answers(self, pool: list[_Process], phase: Phase, r: int, lr: float, ids: list[int],
                 message: Callable[[int], Message]) -> Iterator[tuple[int, Reply]]:
        """Each client's reply as its worker finishes it, the clients sent to free workers longest first."""
        queue = longest_first(phase, ids, self.clients, self.cfg.train)
        while queue or any(w.client is not None for w in pool):
            for w in pool:
                if w.client is None and queue:
                    w.client = queue.popleft()
                    w.channel.send(Task(phase, w.client, r, lr, message(w.client),
                                        self.client_states.get(w.client, {})))
            for conn in wait([w.channel.conn for w in pool if w.client is not None]):
                w = next(p for p in pool if p.channel.conn is conn)
                reply = self._answer(w, phase, r)
                cid, w.client = w.client, None
                yield cid, reply

    def _answer(self, w: _Process, phase: Phase, r: int) -> Reply:
        """The reply of the client ``w`` runs, delivered on the server's device; an error the worker
        raised is raised here."""
        try:
            got: Answered | Failed = w.channel.recv()
        except (EOFError, OSError):
            w.process.join(timeout=5)
            remove_arenas(w.process.pid)  # what it was writing when it died, if anything
            code = w.process.exitcode
            how = (f"killed by signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0
                   else f"exit code {code}")
            raise WorkerDied(f"round {r}: worker process {w.process.name} (pid {w.process.pid}, {w.device}) died "
                             f"while it ran client {w.client} ({phase}): {how}. The run stops here; its records and "
                             "checkpoints so far are intact: continue it with 'fedaug resume <run dir>'") from None
        if isinstance(got, Failed):
            raise_failure(got, r, phase, f"worker process {w.process.name}")
        return reply_on(got.reply, self.device)


def _context(devices: Sequence[str]) -> multiprocessing.context.BaseContext:
    """Fork server where there is one (Linux): its children start with torch and fedaug imported, in
    a process that never ran an op (no thread pool, no CUDA to inherit); for workers on CUDA ``devices``
    torch._dynamo too, which torch.optim imports at a process's first optimizer on CUDA (about 3 CPU-seconds per
    worker otherwise; the CPU's optimisers, :class:`~fedaug.core.eager_optim.EagerOptimizer`, do without it, so a
    CPU fleet's fork server starts that much sooner). The preload applies when a process starts its fork server,
    at its first fleet. Spawn elsewhere (macOS)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    cuda = any(torch.device(d).type == "cuda" for d in devices)
    ctx.set_forkserver_preload([__name__, "torch._dynamo"] if cuda else [__name__])
    return ctx


def _stop(pool: list[_Process]) -> None:
    """Close the workers' connections (they stop at EOF) and make sure they are gone."""
    for w in pool:
        w.channel.close()
    for w in pool:
        w.process.join(timeout=2)
        if w.process.is_alive():
            w.process.kill()
            w.process.join()
