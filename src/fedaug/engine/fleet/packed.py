"""Packed runs: the training phases of several runs trained as one program (issue 62; DESIGN.md, "Studies").

A pack holds runs whose clients' steps have one shape (one model, one method's step, one precision; the
grid runner chooses them, :mod:`fedaug.report.packing`). Each run stays a whole run of its own: its server,
its in-process fleet and worker model, its random streams, records, checkpoints and run directory; it runs
in a thread of its own, given a :class:`PackSlot` as its fleet's trainer. The runs take turns, one at a time
(so the process-wide random stream and switches a run sets are never shared between two at once): a run
computes until its fleet reaches a training phase, where it starts its sampled clients
(:meth:`~fedaug.engine.client.worker.Worker.start_group`: their messages checked, their components'
``receive``), or until it ends; then the next run's turn comes. Once every run still going waits in a
training phase, the pack trains all their started clients as groups of one batched model
(:func:`~fedaug.engine.client.grouped.train_stacked`; grouped by :func:`~fedaug.engine.client.grouped.signature`,
in the order of the runs and then of the clients, at most ``max_group`` clients a group), and every run finishes
its clients (their replies) in its next turn and goes on to its next training phase.

What a run computes in a pack is what it computes alone with its clients grouped (docs/engine.md, "Grouped
clients"), with other runs' clients beside its own in each group: equal to one-at-a-time training within the
grouped tolerances, and bit for bit the same whenever the pack holds the same runs at the same rounds (a
resumed pack of the same cells). A run that fails (its error raised in its own thread: a bad message, a
stalled round, an option found wrong late) leaves the pack with its error, and the others go on. A group
whose batched steps raise is trained again run by run (each run's clients alone, from their streams as they
were), so that only the run whose clients raise fails; a CUDA group that runs out of memory is split in
halves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from fedaug.engine.client.grouped import Started, Trained, plan_groups, signature
from fedaug.engine.client.worker import Worker
from fedaug.engine.fleet.inprocess import Job
from fedaug.engine.protocol import Reply
from fedaug.core.payload import Message

T = TypeVar("T")
#: a started client's place in a pack: ``(run index, position among the run's started clients)``
Key = tuple[int, int]


class PackSlot:
    """One run's place in a :class:`Pack`: its fleet's trainer (:data:`~fedaug.engine.fleet.inprocess.Trainer`)."""

    def __init__(self, pack: Pack, index: int) -> None:
        self.pack, self.index = pack, index
        self.turn = threading.Semaphore(0)
        self.done = False
        #: the run's worker and its started clients while it waits in a training phase (else None)
        self.waiting: tuple[Worker, list[tuple[Started, Message]]] | None = None
        self.trained: list[Trained] = []
        self.error: BaseException | None = None

    def train(self, worker: Worker, r: int, lr: float, jobs: Sequence[Job]) -> list[Reply]:
        """A training phase of the run (in its thread): its clients started on ``worker``, then trained with
        the other runs' when the pack's turn comes, then finished here.

        Raises:
            BaseException: what the run's clients' steps raised (the pack trained them alone first), or
                :class:`KeyboardInterrupt` when the pack was interrupted.
        """
        started = worker.start_group(r, lr, jobs)
        self.waiting, self.trained, self.error = (worker, started), [], None
        self.pack._hand_back()
        self.turn.acquire()
        self.waiting = None
        if self.error is not None:
            raise self.error
        return worker.finish_group(r, started, self.trained)


class Pack(Generic[T]):
    """Runs that take turns in threads, their training phases trained together (module docstring).

    Args:
        max_group: the most clients a batched group holds (``None``: every client of one signature).
    """

    def __init__(self, max_group: int | None = None) -> None:
        self.max_group = max_group
        self._back = threading.Semaphore(0)
        self._interrupt: BaseException | None = None

    def run(self, bodies: Sequence[Callable[[PackSlot], T]]) -> list[T | BaseException]:
        """Run each body (a whole run, given its slot to hand its fleet) in a thread of its own, taking turns,
        until every one has returned or raised.

        Returns:
            Each body's result, or the exception it raised, in ``bodies``' order.

        Raises:
            KeyboardInterrupt: the process was interrupted (every run was stopped first, each raising
                :class:`KeyboardInterrupt` in its own thread at its next training phase).
        """
        slots = [PackSlot(self, i) for i in range(len(bodies))]
        results: list[Any] = [None] * len(bodies)

        def main(slot: PackSlot, body: Callable[[PackSlot], T]) -> None:
            slot.turn.acquire()
            try:
                if self._interrupt is not None:  # interrupted before this run's first turn: it does not start
                    raise KeyboardInterrupt
                results[slot.index] = body(slot)
            except BaseException as exc:  # the run's own failure, returned as its result
                results[slot.index] = exc
            finally:
                slot.done = True
                self._back.release()

        threads = [threading.Thread(target=main, args=(s, b), name=f"fedaug-pack-{s.index}", daemon=True)
                   for s, b in zip(slots, bodies)]
        for t in threads:
            t.start()
        live = slots
        while live:
            for slot in live:
                self._take_turn(slot)
            live = [s for s in live if not s.done]
            if live:
                self._train(live)
        for t in threads:
            t.join()
        if self._interrupt is not None:
            raise self._interrupt
        return results

    def _hand_back(self) -> None:
        """(In a run's thread) the run waits: the pack's turn."""
        self._back.release()

    def _take_turn(self, slot: PackSlot) -> None:
        """Let ``slot``'s run compute until it waits in a training phase or ends. An interrupt meanwhile is
        kept (the run finishes its turn first) and stops every run at its next training phase."""
        slot.turn.release()
        while True:
            try:
                self._back.acquire()
                return
            except KeyboardInterrupt as exc:
                self._interrupt = exc

    def _train(self, slots: Sequence[PackSlot]) -> None:
        """Train the started clients of every waiting run (or, after an interrupt, stop them all)."""
        if self._interrupt is not None:
            for slot in slots:
                slot.error = KeyboardInterrupt()
            return
        waiting = {slot.index: slot.waiting for slot in slots if slot.waiting is not None}
        started = {(i, k): s for i, (_, clients) in waiting.items() for k, (s, _) in enumerate(clients)}
        workers = {i: worker for i, (worker, _) in waiting.items()}
        trained: dict[Key, Trained] = {}
        failed: dict[int, BaseException] = {}
        for group in plan_groups({key: signature(s) for key, s in started.items()}, self.max_group or len(started)):
            self._train_group([k for k in group if k[0] not in failed], started, workers, trained, failed)
        for slot in slots:
            if slot.index in failed:
                slot.error = failed[slot.index]
            else:
                slot.trained = [trained[(slot.index, k)] for k in range(len(waiting[slot.index][1]))]

    def _train_group(self, keys: list[Key], started: dict[Key, Started], workers: dict[int, Worker],
                     trained: dict[Key, Trained], failed: dict[int, BaseException]) -> None:
        """One group's batched steps (by its first run's worker,
        :meth:`~fedaug.engine.client.worker.Worker.train_started`); a group that raises is trained run by run, a run alone that raises fails, a CUDA group out of memory is
        split in halves."""
        if not keys:
            return
        group = [started[k] for k in keys]
        streams = [s.ctx.stream_states() for s in group]
        runs = sorted({k[0] for k in keys})
        try:
            trained.update(zip(keys, workers[keys[0][0]].train_started(group)))
            return
        except torch.cuda.OutOfMemoryError:
            if len(keys) == 1:
                failed[keys[0][0]] = MemoryError("a client's steps do not fit the device's memory")
                return
            halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
        except Exception as exc:  # noqa: BLE001 - whose it is is found by training the runs alone
            if len(runs) == 1:
                failed[runs[0]] = exc
                return
            halves = [[k for k in keys if k[0] == run] for run in runs]
        for s, kept in zip(group, streams):
            s.ctx.rewind_streams(kept)
        for part in halves:
            self._train_group(part, started, workers, trained, failed)

