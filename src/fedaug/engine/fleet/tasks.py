"""What a fleet of worker models shares, whatever carries its messages: the clients' data packed once,
the server's :class:`Task` and a worker's :class:`Answered` or :class:`Failed`, how a worker is built
from a :class:`WorkerSetup` and answers a task, which clients go first and in which order the
answers go back to the server.

Two fleets use them: worker processes of this machine (:mod:`~fedaug.engine.fleet.processes`,
through shared memory) and Ray actors on a cluster (:mod:`~fedaug.engine.fleet.ray`, through Ray's
object store). Either fleet changes where a client runs, never what it computes: a worker answers a
task from the message, the client's state and the seed only (invariant 1), and the fleet hands the
answers to the server in the order it asked for them (:func:`in_order`), so the records equal
``workers = 1`` at the same ``threads``, bit for bit (DESIGN.md, "Throughput").
"""

from __future__ import annotations

import pickle
import traceback
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedaug.config.schema import RunConfig, TrainConfig
from fedaug.core.device import data_on_device, to_device
from fedaug.core.errors import ConfigError, FedaugError
from fedaug.core.payload import Message
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.engine.client.training import num_local_steps
from fedaug.engine.client.worker import Worker, build_worker_model
from fedaug.engine.protocol import Reply
from fedaug.methods.component import Phase, State
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import make_task

#: the splits of every client that a fleet packs for its workers
PACKED_SPLITS = ("train", "val", "test")


class WorkerDied(FedaugError):
    """A worker (a process, or a Ray actor) ended while it ran a client; the run stops (it resumes from
    its last checkpoint)."""


@dataclass(frozen=True)
class Packed:
    """Every client's splits concatenated per split and field (``x``, ``y``): what a worker receives of
    the data (six tensors whatever the number of clients, where one tensor per client and split would
    each take a file descriptor in shared memory, or an object in Ray's store).

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
        """The clients, each split a view into the packed tensors (no copy)."""
        out = []
        for k, rows in enumerate(self.bounds):
            splits = {s: Split(self.tensors[f"{s}.x"][slice(*rows[s])], self.tensors[f"{s}.y"][slice(*rows[s])])
                      for s in PACKED_SPLITS}
            out.append(ClientData(self.names[k], self.groups[k], **splits))
        return out


def pack(data: FederatedData, shared: bool = True) -> Packed:
    """The clients' splits in six tensors (:class:`Packed`), in shared memory with ``shared`` (worker
    processes of this machine map them; Ray's object store takes plain ones)."""
    tensors: dict[str, Tensor] = {}
    bounds: list[dict[str, tuple[int, int]]] = [{} for _ in data.clients]
    for s in PACKED_SPLITS:
        splits = [getattr(c, s) for c in data.clients]
        start = 0
        for k, sp in enumerate(splits):
            bounds[k][s] = (start, start + len(sp))
            start += len(sp)
        for field in ("x", "y"):
            t = torch.cat([getattr(sp, field).cpu() for sp in splits])
            tensors[f"{s}.{field}"] = t.share_memory_() if shared else t
    return Packed(tensors, bounds, [c.name for c in data.clients], [c.group for c in data.clients])


def expected_cost(phase: Phase, client: ClientData, train: TrainConfig) -> int:
    """How long a client takes in ``phase``, in units that order clients: its local steps (train),
    its training samples (the query's features) or its samples to evaluate."""
    if phase == "train":
        return num_local_steps(len(client.train), train)
    if phase == "query":
        return len(client.train)
    return len(client.val) + len(client.test)


def longest_first(phase: Phase, client_ids: Sequence[int], clients: Sequence[ClientData],
                  train: TrainConfig) -> deque[int]:
    """The clients in the order they go to free workers: the most expensive first (:func:`expected_cost`;
    the longest-processing-time rule, which keeps a phase's last worker from starting a long client when
    the others are done)."""
    return deque(sorted(client_ids, key=lambda cid: -expected_cost(phase, clients[cid], train)))


def in_order(ids: Sequence[int], answers: Iterable[tuple[int, Reply]]) -> Iterator[tuple[int, Reply]]:
    """The ``(client id, reply)`` pairs of ``answers`` (in the order the workers finished) in the order
    of ``ids`` (the order the server asked): each as soon as every client asked before it has answered."""
    done: dict[int, Reply] = {}
    head = 0
    for cid, reply in answers:
        done[cid] = reply
        while head < len(ids) and ids[head] in done:
            yield ids[head], done.pop(ids[head])
            head += 1


@dataclass(frozen=True)
class Task:
    """The server's request to a worker: run ``phase`` of round ``round`` on ``client``."""

    phase: Phase
    client: int
    round: int
    lr: float
    message: Message
    state: dict[str, State]


@dataclass(frozen=True)
class Answered:
    """A worker's answer to a :class:`Task`: the client's reply."""

    client: int
    reply: Reply


@dataclass(frozen=True)
class Failed:
    """A worker's answer to a :class:`Task` that raised: the exception where it can travel (``None``
    where it cannot be pickled) and its traceback."""

    client: int
    error: BaseException | None
    traceback: str


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to build its worker model (sent once, when it starts)."""

    config: dict[str, Any]
    recipe: bytes
    data: Packed
    input_shape: tuple[int, ...]
    num_classes: int
    task: str
    device: str


def recipe_bytes(cfg: RunConfig, recipe: Recipe, where: str) -> bytes:
    """The method pickled for workers elsewhere, as it is now (before any component's setup).

    Args:
        where: what receives it, for the error (``"worker processes"``, ``"Ray actors"``).

    Raises:
        ConfigError: the recipe cannot be pickled (a component defined where workers cannot import it).
    """
    try:
        return pickle.dumps(recipe)
    except Exception as exc:  # noqa: BLE001 - any reason pickling fails
        how = f"fleet = 'ray' sends the method to {where}" if cfg.fleet == "ray" else \
            f"workers={cfg.workers} sends the method to {where}"
        raise ConfigError(f"{how}, which needs a picklable recipe ({exc}); define custom components at a module's "
                          "top level, or set workers=1" + (" and fleet = 'local'" if cfg.fleet == "ray" else "")
                          ) from None


def build_worker(cfg: RunConfig, setup: WorkerSetup) -> tuple[Worker, list[ClientData]]:
    """A worker's :class:`~fedaug.engine.client.worker.Worker` and clients, on ``setup.device``."""
    recipe: Recipe = pickle.loads(setup.recipe)
    device = torch.device(setup.device)
    clients = setup.data.clients()
    if data_on_device(cfg.data.on_device, sum(c.nbytes for c in clients), device):
        clients = [c.to(device) for c in clients]
    model = build_worker_model(cfg, recipe, setup.input_shape, setup.num_classes, device)
    return Worker(cfg, recipe, model, make_task(setup.task, setup.num_classes), len(clients)), clients


def picklable(exc: BaseException) -> BaseException | None:
    """``exc`` where it survives pickling (to be raised again by the server), else ``None``."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception that cannot travel is described by its traceback
        return None
    return exc


def answer(worker: Worker, clients: Sequence[ClientData], task: Task) -> Answered | Failed:
    """Run ``task`` on ``worker``: its reply, or what it raised."""
    try:
        return Answered(task.client, worker.run(task.phase, task.client, task.round, task.lr, clients[task.client],
                                                task.message, task.state))
    except Exception as exc:  # noqa: BLE001 - raised again in the server process
        return Failed(task.client, picklable(exc), traceback.format_exc())


def reply_on(reply: Reply, device: torch.device) -> Reply:
    """``reply`` with its message and state on ``device`` (the server's)."""
    return Reply(to_device(reply.message, device), reply.metrics, to_device(reply.state, device))


def raise_failure(failed: Failed, r: int, phase: Phase, where: str) -> None:
    """Raise what a worker's task raised (the exception itself where it travelled)."""
    if failed.error is not None:
        raise failed.error
    raise FedaugError(f"round {r}: client {failed.client} ({phase}) failed in {where}:\n{failed.traceback}")
