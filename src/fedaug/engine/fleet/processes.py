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
import pickle
import signal
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch import Tensor

from fedaug.config.schema import RunConfig, TrainConfig, validate
from fedaug.core.device import to_device
from fedaug.core.errors import ConfigError, FedaugError
from fedaug.core.payload import Message
from fedaug.core.runtime import available_cores, configure_process, deterministic_algorithms
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.engine.fleet.base import StatesHere
from fedaug.engine.protocol import Reply
from fedaug.engine.client.training import num_local_steps
from fedaug.engine.client.worker import Worker, build_worker_model
from fedaug.engine.fleet.transport import Channel, remove_arenas
from fedaug.methods.component import Phase, State
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import make_task

#: the splits of every client that a pool packs into shared memory
PACKED_SPLITS = ("train", "val", "test")


class WorkerDied(FedaugError):
    """A worker process ended while it ran a client; the run stops (it resumes from its last checkpoint)."""


@dataclass(frozen=True)
class Packed:
    """Every client's splits concatenated per split and field (``x``, ``y``), in shared memory: what a
    worker process receives of the data (six tensors whatever the number of clients, where one
    tensor per client and split would each take a file descriptor).

    Args:
        tensors: ``{"train.x": (sum N_k, C, *spatial), "train.y": (sum N_k, ...), ...}``.
        bounds: per client, per split, the ``(start, stop)`` rows of its samples.
        names, groups: each client's name and group.
    """

    tensors: dict[str, Tensor]
    bounds: list[dict[str, tuple[int, int]]]
    names: list[str]
    groups: list[str]

    def clients(self) -> list[ClientData]:
        """The clients, each split a view into the shared tensors (no copy)."""
        out = []
        for k, rows in enumerate(self.bounds):
            splits = {s: Split(self.tensors[f"{s}.x"][slice(*rows[s])], self.tensors[f"{s}.y"][slice(*rows[s])])
                      for s in PACKED_SPLITS}
            out.append(ClientData(self.names[k], self.groups[k], **splits))
        return out


def pack(data: FederatedData) -> Packed:
    """The clients' splits in shared memory (:class:`Packed`)."""
    tensors: dict[str, Tensor] = {}
    bounds: list[dict[str, tuple[int, int]]] = [{} for _ in data.clients]
    for s in PACKED_SPLITS:
        splits = [getattr(c, s) for c in data.clients]
        start = 0
        for k, sp in enumerate(splits):
            bounds[k][s] = (start, start + len(sp))
            start += len(sp)
        for field in ("x", "y"):
            tensors[f"{s}.{field}"] = torch.cat([getattr(sp, field).cpu() for sp in splits]).share_memory_()
    return Packed(tensors, bounds, [c.name for c in data.clients], [c.group for c in data.clients])


def expected_cost(phase: Phase, client: ClientData, train: TrainConfig) -> int:
    """How long a client takes in ``phase``, in units that order clients: its local steps (train),
    its training samples (the query's features) or its samples to evaluate."""
    if phase == "train":
        return num_local_steps(len(client.train), train)
    if phase == "query":
        return len(client.train)
    return len(client.val) + len(client.test)


@dataclass(frozen=True)
class Task:
    """The server's request to a worker process: run ``phase`` of round ``round`` on ``client``."""

    phase: Phase
    client: int
    round: int
    lr: float
    message: Message
    state: dict[str, State]


@dataclass(frozen=True)
class NewPhase:
    """The server's note to a worker process that a phase begins: forget the last phase's tensors."""


@dataclass(frozen=True)
class Answered:
    """A worker process's answer to a :class:`Task`: the client's reply."""

    client: int
    reply: Reply


@dataclass(frozen=True)
class Failed:
    """A worker process's answer to a :class:`Task` that raised: the exception where it can travel
    (``None`` where it cannot be pickled) and its traceback."""

    client: int
    error: BaseException | None
    traceback: str


@dataclass(frozen=True)
class _Setup:
    """What a worker process needs to build its worker (sent once, when it starts)."""

    config: dict[str, Any]
    recipe: bytes
    data: Packed
    input_shape: tuple[int, ...]
    num_classes: int
    task: str
    device: str


def _serve(conn: Connection, setup: _Setup) -> None:
    """A worker process: build the worker, then answer tasks until the server closes the connection
    (a worker that cannot be built answers every task with the reason)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it closes the pool
    _name_process(multiprocessing.current_process().name)
    channel = Channel(conn)
    try:
        _answer_tasks(channel, setup)
    finally:
        channel.close()


def _answer_tasks(channel: Channel, setup: _Setup) -> None:
    cfg = validate(setup.config)
    configure_process(cfg.threads, cfg.deterministic)
    with deterministic_algorithms(cfg.deterministic):
        try:
            worker, clients = _build(cfg, setup)
            failure = None
        except Exception as exc:  # noqa: BLE001 - raised again in the server process, with the first task
            failure = (_picklable(exc), traceback.format_exc())
        while True:
            try:
                task: Task | NewPhase = channel.recv()
            except EOFError:
                return
            if isinstance(task, NewPhase):
                channel.reset()
                continue
            answer: Answered | Failed
            try:
                if failure is not None:
                    answer = Failed(task.client, *failure)
                else:
                    answer = Answered(task.client, worker.run(task.phase, task.client, task.round, task.lr,
                                                              clients[task.client], task.message, task.state))
            except Exception as exc:  # noqa: BLE001 - raised again in the server process
                answer = Failed(task.client, _picklable(exc), traceback.format_exc())
            channel.send(answer, remember=False)


def _build(cfg: RunConfig, setup: _Setup) -> tuple[Worker, list[ClientData]]:
    """A worker process's :class:`~fedaug.engine.client.worker.Worker` and clients, on its device."""
    recipe: Recipe = pickle.loads(setup.recipe)
    device = torch.device(setup.device)
    clients = setup.data.clients()
    if cfg.data.on_device:
        clients = [c.to(device) for c in clients]
    model = build_worker_model(cfg, recipe, setup.input_shape, setup.num_classes, device)
    return Worker(cfg, recipe, model, make_task(setup.task, setup.num_classes), len(clients)), clients


def _name_process(name: str) -> None:
    """Show ``name`` for this process in ``ps``/``top`` (Linux; elsewhere nothing happens)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        return


def _picklable(exc: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception that cannot travel is described by its traceback
        return None
    return exc


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
        try:
            recipe_bytes = pickle.dumps(recipe)
        except Exception as exc:  # noqa: BLE001 - any reason pickling fails
            raise ConfigError(f"workers={cfg.workers} sends the method to worker processes, which needs a picklable "
                              f"recipe ({exc}); define custom components at a module's top level, or set workers=1") from None
        cores = available_cores()
        if cfg.workers * cfg.threads > cores:
            warnings.warn(f"workers={cfg.workers} x threads={cfg.threads} = {cfg.workers * cfg.threads} threads on {cores} "
                          f"cores: they slow each other down; set threads={max(1, cores // cfg.workers)} (or fewer "
                          "workers) to fit the cores (the records depend on threads, not on workers)", stacklevel=3)
        self.cfg, self.device = cfg, device
        self.clients = list(data.clients)
        self._setup = _Setup(cfg.to_dict(), recipe_bytes, pack(data), tuple(data.input_shape), data.num_classes,
                             data.task, "")
        self._devices = list(devices)
        self._pool: list[_Process] = []
        self._finalizer: weakref.finalize | None = None

    # --- the pool -----------------------------------------------------------------------------
    def _start(self) -> list[_Process]:
        if self._pool:
            return self._pool
        ctx = _context()
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
        queue = deque(sorted(ids, key=lambda cid: -expected_cost(phase, self.clients[cid], self.cfg.train)))
        done: dict[int, Reply] = {}
        head = 0  # the next answer to yield, in the order asked
        try:
            while head < len(ids):
                for w in pool:
                    if w.client is None and queue:
                        w.client = queue.popleft()
                        w.channel.send(Task(phase, w.client, r, lr, message(w.client),
                                            self.client_states.get(w.client, {})))
                for conn in wait([w.channel.conn for w in pool if w.client is not None]):
                    w = next(p for p in pool if p.channel.conn is conn)
                    done[w.client] = self._answer(w, phase, r)
                    w.client = None
                while head < len(ids) and ids[head] in done:
                    cid = ids[head]
                    reply = done.pop(cid)
                    if phase == "train":
                        self.keep(cid, reply)
                    head += 1
                    yield cid, reply
        except BaseException:
            self.close()  # a worker may be mid-client: none of its answers can be trusted to arrive
            raise

    def _answer(self, w: _Process, phase: Phase, r: int) -> Reply:
        """The reply of the client ``w`` runs, delivered on the server's device; an error the worker
        raised is raised here."""
        try:
            answer = w.channel.recv()
        except (EOFError, OSError):
            w.process.join(timeout=5)
            remove_arenas(w.process.pid)  # what it was writing when it died, if anything
            code = w.process.exitcode
            how = (f"killed by signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0
                   else f"exit code {code}")
            raise WorkerDied(f"round {r}: worker process {w.process.name} (pid {w.process.pid}, {w.device}) died "
                             f"while it ran client {w.client} ({phase}): {how}. The run stops here; its records and "
                             "checkpoints so far are intact: continue it with 'fedaug resume <run dir>'") from None
        if isinstance(answer, Failed):
            if answer.error is not None:
                raise answer.error
            raise FedaugError(f"round {r}: client {answer.client} ({phase}) failed in worker process "
                              f"{w.process.name}:\n{answer.traceback}")
        reply = answer.reply
        return Reply(to_device(reply.message, self.device), reply.metrics, to_device(reply.state, self.device))


def _context() -> multiprocessing.context.BaseContext:
    """Fork server where there is one (Linux): its children start with torch and fedaug imported, in
    a process that never ran an op (no thread pool, no CUDA to inherit); spawn elsewhere (macOS)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
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
