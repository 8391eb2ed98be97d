"""The in-process fleet: every client of a dataset held in this process, trained in turn (or in groups,
``train.group_clients``) on one worker model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from fedaug.core.device import data_on_device
from fedaug.core.payload import Message
from fedaug.data.base import ClientData, FederatedData
from fedaug.engine.client.grouped import group_size, plan_groups
from fedaug.engine.client.training import batch_sizes
from fedaug.engine.client.worker import Worker
from fedaug.engine.execution import execution_name
from fedaug.engine.fleet.base import StatesHere
from fedaug.engine.protocol import Reply
from fedaug.methods.component import Phase, State

Order = Callable[[list[int]], list[int]]
#: one client's training job: ``(client id, its data, its message, its per-client state)``
Job = tuple[int, ClientData, Message, Mapping[str, State]]
#: what trains a whole training phase instead of the worker's groups: ``(worker, round, lr, jobs) -> replies`` in
#: the jobs' order (a pack's :meth:`~fedaug.engine.fleet.packed.PackSlot.train`: with other runs' clients)
Trainer = Callable[[Worker, int, float, Sequence[Job]], list[Reply]]


class InProcessFleet(StatesHere):
    """Every client of a dataset held in this process, trained in turn on one :class:`Worker`.

    Args:
        worker: the worker (one model for all clients).
        data: the federated dataset.
        execution_order: permutes the client ids of a phase before running them (tests use it to
            show that the order does not matter); default: ascending ids.
        on_device: ``data.on_device``: keep every client's data on the worker's device for the whole run
            (``true``; ``"auto"``: on a CUDA device where it fits a share of the free memory,
            :func:`~fedaug.core.device.data_on_device`); else it stays on the host (in pinned memory for a CUDA
            worker) and the worker copies a client's splits to the device when it runs it. On the CPU both are
            the same.
        trainer: trains each training phase's clients (:data:`Trainer`: a pack's, with other runs' clients);
            default: the worker, in groups of ``train.group_clients`` (or one at a time).

    Raises:
        ConfigError: ``on_device = true`` and the data's bytes exceed the device's free memory
            (:func:`~fedaug.core.device.check_fits`, naming the estimate).
    """

    def __init__(self, worker: Worker, data: FederatedData, execution_order: Order | None = None,
                 on_device: bool | str = False, trainer: Trainer | None = None) -> None:
        super().__init__()
        self.worker, self.data, self.trainer = worker, data, trainer
        device = worker.device
        placed = data_on_device(on_device, sum(c.nbytes for c in data.clients), device)
        #: whether the clients' data lives on the worker's device (other than the CPU) for the whole run
        self.data_on_device = placed and device.type != "cpu"
        if placed:
            self.clients = [c.to(device) for c in data.clients]
        elif device.type == "cuda":
            self.clients = [c.pin_memory() for c in data.clients]
        else:
            self.clients = list(data.clients)
        self.order = execution_order or (lambda ids: ids)
        #: clients trained at once (train.group_clients, or 1 with a notice where the method cannot group)
        self.group_size = group_size(worker.cfg.train.group_clients, worker.recipe, worker.model)

    @property
    def execution(self) -> str:
        """How the clients' steps run (:func:`~fedaug.engine.execution.execution_name`): in a pack (a trainer's),
        grouped (:attr:`group_size` > 1), captured (the worker's graphs), or eager."""
        return execution_name(packed=self.trainer is not None, grouped=self.group_size > 1,
                              captured=self.worker.captures)

    def run(self, phase: Phase, r: int, lr: float, client_ids: Sequence[int],
            message: Callable[[int], Message]) -> Iterator[tuple[int, Reply]]:
        if phase == "train" and self.trainer is not None:
            ids = sorted(client_ids)
            jobs = [(cid, self.clients[cid], message(cid), self.client_states.get(cid, {})) for cid in ids]
            yield from self.delivered(phase, zip(ids, self.trainer(self.worker, r, lr, jobs)))
            return
        if phase == "train" and self.group_size > 1:
            yield from self.delivered(phase, self._train_groups(r, lr, client_ids, message))
            return
        ids = self.order(list(client_ids)) if phase != "evaluate" else sorted(client_ids)
        yield from self.delivered(phase, ((cid, self.worker.run(phase, cid, r, lr, self.clients[cid], message(cid),
                                                                self.client_states.get(cid, {}))) for cid in ids))

    def _train_groups(self, r: int, lr: float, client_ids: Sequence[int],
                      message: Callable[[int], Message]) -> Iterator[tuple[int, Reply]]:
        """The training phase in groups of clients with one batch schedule (:func:`plan_groups`; the
        groups do not depend on ``execution_order``), each trained at once (:meth:`Worker.train_group`)."""
        cfg = self.worker.cfg.train
        schedules = {cid: batch_sizes(len(self.clients[cid].train), cfg) for cid in client_ids}
        for group in plan_groups(schedules, self.group_size):
            jobs = [(cid, self.clients[cid], message(cid), self.client_states.get(cid, {})) for cid in group]
            yield from zip(group, self.worker.train_group(r, lr, jobs))
