"""Clients on Ray actors: the in-process engine's fleet for ``fleet = "ray"`` (docs/cluster.md).

A :class:`RayFleet` runs each phase's clients on ``workers`` Ray actors, each holding its own worker
model (:func:`~fedaug.engine.fleet.tasks.build_worker`) at ``threads`` torch threads, placed by Ray
where the resources it reserves are free (``ray.num_cpus``, default ``threads``; ``ray.num_gpus``,
a fraction sharing a GPU). The federation's data go into Ray's object store once
(:func:`~fedaug.engine.fleet.tasks.pack`), and every actor reads them from there. As with worker
processes (:mod:`~fedaug.engine.fleet.processes`), the server process keeps the client states and
does validation, accounting and aggregation; clients go to free actors longest first and their
answers go back in the order the server asked (:func:`~fedaug.engine.fleet.tasks.in_order`), so the
records equal ``workers = 1`` at the same ``threads``, bit for bit, wherever the actors run: a
client's computation depends on its message, its state and the seed only (invariant 1). That takes
the same software on every node (Python, fedaug, torch: checked when an actor starts) and, for the
same float32 numbers, CPUs of the same capability (docs/engine.md, "Reproducibility across CPUs").

An actor that dies, or whose node is lost, ends the phase with a :class:`WorkerDied` naming the
client it ran and the node; the run stops with its records and checkpoints intact, and
``fedaug resume`` continues it to the numbers of an uninterrupted run.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from fedaug.config.schema import RunConfig, validate
from fedaug.core.cluster import check_software, connect, import_ray, node_gone, software
from fedaug.core.device import to_device
from fedaug.core.errors import ConfigError
from fedaug.core.payload import Message
from fedaug.core.runtime import configure_process, deterministic_algorithms
from fedaug.data.base import FederatedData
from fedaug.engine.fleet.base import StatesHere
from fedaug.engine.fleet.tasks import (Answered, Failed, Task, WorkerDied, WorkerSetup, answer, build_worker,
                                       in_order, longest_first, pack, picklable, raise_failure, recipe_bytes,
                                       reply_on)
from fedaug.engine.protocol import Reply
from fedaug.methods.component import Phase
from fedaug.methods.recipe import Recipe

CPU = torch.device("cpu")


def actor_device(cfg: RunConfig) -> str:
    """Where an actor computes: the GPU Ray gives it where it reserves one (``ray.num_gpus > 0``, unless
    ``device = 'cpu'``), else the CPU."""
    return "cuda" if cfg.ray.num_gpus > 0 and cfg.device != "cpu" else "cpu"


def actor_cpus(cfg: RunConfig) -> float:
    """The CPUs Ray reserves for an actor: ``ray.num_cpus``, default ``threads``."""
    return cfg.threads if cfg.ray.num_cpus is None else cfg.ray.num_cpus


class RayWorker:
    """One worker model on a Ray actor (made one by :class:`RayFleet` with ``ray.remote``).

    Args:
        setup: the config, the pickled method, the packed data and the device (``setup.device``).
    """

    def __init__(self, setup: WorkerSetup) -> None:
        self.cfg = validate(setup.config)
        configure_process(self.cfg.threads, self.cfg.deterministic)
        self._phase = -1  # the phase whose tensors _seen holds (RayFleet's count)
        self._seen: dict[Any, torch.Tensor] = {}  # this phase's tensors, by object ref
        try:
            self.worker, self.clients = build_worker(self.cfg, setup)
            self.failure: tuple[BaseException | None, str] | None = None
        except Exception as exc:  # noqa: BLE001 - raised again in the server process, with the first task
            self.failure = (picklable(exc), traceback.format_exc())

    def _resolve(self, phase: int, refs: dict[str, dict[str, Any]]) -> Message:
        """The message of ``refs``, each object read once per phase (the server sends every client of a
        phase the same global weights: one copy travels to this actor, not one per client)."""
        import ray

        if self._phase != phase:
            self._phase, self._seen = phase, {}
        fresh = [ref for part in refs.values() for ref in part.values() if ref not in self._seen]
        self._seen.update(zip(fresh, ray.get(fresh)))
        return {name: {k: self._seen[ref] for k, ref in part.items()} for name, part in refs.items()}

    def where(self) -> dict[str, Any]:
        """The actor's node (id and address), process and software (:func:`~fedaug.core.cluster.software`)."""
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "software": software()}

    def run(self, task: Task, phase: int, refs: dict[str, dict[str, Any]]) -> Answered | Failed:
        """Answer ``task`` of the fleet's ``phase``-th phase, whose message's tensors are in ``refs``
        (``{component: {name: object ref}}``, :func:`_lift`); the reply's tensors on the CPU (any node can
        read them)."""
        if self.failure is not None:
            return Failed(task.client, *self.failure)
        task = replace(task, message=self._resolve(phase, refs))
        with deterministic_algorithms(self.cfg.deterministic):
            got = answer(self.worker, self.clients, task)
        return Answered(got.client, reply_on(got.reply, CPU)) if isinstance(got, Answered) else got


@dataclass
class _Actor:
    name: str
    handle: Any
    node: str
    ip: str
    pid: int
    client: int | None = None  # the client it runs now

    @property
    def where(self) -> str:
        return f"node {self.node[:12]} at {self.ip}, pid {self.pid}"


class RayFleet(StatesHere):
    """The clients of a dataset held in this process, trained on ``workers`` Ray actors.

    Args:
        cfg: the run configuration (``workers``, ``threads`` per actor, ``[ray]``).
        recipe: the method, pickled for the actors as it is now (before any component's setup).
        data: the federated dataset (put into Ray's object store once, when the actors start).
        device: where the server's state lives; replies are delivered there.

    Raises:
        ConfigError: a recipe that cannot be pickled.
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, data: FederatedData, device: torch.device) -> None:
        super().__init__()
        method = recipe_bytes(cfg, recipe, "Ray actors")
        self.cfg, self.device = cfg, device
        self.clients = list(data.clients)
        self._setup = WorkerSetup(cfg.to_dict(), method, pack(data, shared=False), tuple(data.input_shape),
                                  data.num_classes, data.task, actor_device(cfg))
        self._actors: list[_Actor] = []
        self._phases = 0  # phases run so far: an actor keeps one phase's tensors

    # --- the actors ---------------------------------------------------------------------------
    def _start(self) -> list[_Actor]:
        """The actors, started (and their software checked) on first use."""
        if self._actors:
            return self._actors
        ray = connect(self.cfg.ray.address)
        cpus, gpus = actor_cpus(self.cfg), self.cfg.ray.num_gpus
        _check_fits(ray, cpus, gpus)
        setup = ray.put(self._setup)
        kind = ray.remote(RayWorker)
        handles = [kind.options(num_cpus=cpus, num_gpus=gpus, max_restarts=0, max_task_retries=0).remote(setup)
                   for _ in range(self.cfg.workers)]
        try:
            infos = ray.get([h.where.remote() for h in handles])
        except ray.exceptions.RayActorError as exc:
            for h in handles:
                ray.kill(h, no_restart=True)
            raise WorkerDied(f"a Ray worker actor died while it started: {exc}") from None
        self._actors = [_Actor(f"fedaug-worker-{k}", h, info["node"], info["ip"], info["pid"])
                        for k, (h, info) in enumerate(zip(handles, infos))]
        try:
            for a, info in zip(self._actors, infos):
                check_software(f"{a.node[:12]} at {a.ip}", info["software"])
        except ConfigError:
            self.close()
            raise
        return self._actors

    def close(self) -> None:
        """Stop every actor (idempotent; a later phase starts them again)."""
        if not self._actors:
            return
        ray = import_ray()
        for a in self._actors:
            try:
                ray.kill(a.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor whose node is gone cannot be killed, nor needs to be
                continue
        self._actors = []

    # --- a phase ------------------------------------------------------------------------------
    def run(self, phase: Phase, r: int, lr: float, client_ids: Sequence[int],
            message: Callable[[int], Message]) -> Iterator[tuple[int, Reply]]:
        actors = self._start()
        ids = list(client_ids)
        yield from self.delivered(phase, in_order(ids, self._answers(actors, phase, r, lr, ids, message)))

    def _answers(self, actors: list[_Actor], phase: Phase, r: int, lr: float, ids: list[int],
                 message: Callable[[int], Message]) -> Iterator[tuple[int, Reply]]:
        """Each client's reply as its actor finishes it, the clients sent to free actors longest first."""
        ray = import_ray()
        queue = longest_first(phase, ids, self.clients, self.cfg.train)
        running: dict[Any, _Actor] = {}
        sent: dict[int, tuple[torch.Tensor, int, Any]] = {}  # this phase's tensors: id -> (tensor, version, ref)
        self._phases += 1
        while queue or running:
            for a in actors:
                if a.client is None and queue:
                    a.client = queue.popleft()
                    task = Task(phase, a.client, r, lr, {}, to_device(self.client_states.get(a.client, {}), CPU))
                    running[a.handle.run.remote(task, self._phases, _lift(ray, message(a.client), sent))] = a
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                a = running.pop(ref)
                reply = self._answer(ray, ref, a, phase, r)
                cid, a.client = a.client, None
                yield cid, reply

    def _answer(self, ray: Any, ref: Any, a: _Actor, phase: Phase, r: int) -> Reply:
        """The reply of the client ``a`` runs, delivered on the server's device; an error the actor raised
        is raised here, a lost actor or node as :class:`WorkerDied`."""
        try:
            got: Answered | Failed = ray.get(ref)
        except ray.exceptions.RayActorError:
            how = "its node is gone" if node_gone(ray, a.node) else "its process ended (its node is still up)"
            raise WorkerDied(f"round {r}: Ray worker actor {a.name} ({a.where}) died while it ran client {a.client} "
                             f"({phase}): {how}. The run stops here; its records and checkpoints so far are intact: "
                             "continue it with 'fedaug resume <run dir>' (on the cluster, or on this machine with "
                             "--fleet local)") from None
        if isinstance(got, Failed):
            raise_failure(got, r, phase, f"Ray worker actor {a.name} ({a.where})")
        return reply_on(got.reply, self.device)


def _lift(ray: Any, message: Message, sent: dict[int, tuple[torch.Tensor, int, Any]]) -> dict[str, dict[str, Any]]:
    """``message`` with each tensor replaced by an object ref in Ray's store: a tensor already put in this
    phase (the same object, unchanged since) by the same ref, so that the global weights go into the store
    once per phase, not once per client (as the process pool's channel sends them once).

    Args:
        sent: the phase's tensors so far, ``id -> (tensor kept alive, version, ref)``; updated.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, part in message.items():
        out[name] = {}
        for k, t in part.items():
            seen = sent.get(id(t))
            if seen is None or seen[0] is not t or seen[1] != t._version:
                seen = sent[id(t)] = (t, t._version, ray.put(t.detach().to(CPU)))
            out[name][k] = seen[2]
    return out


def _check_fits(ray: Any, cpus: float, gpus: float) -> None:
    """Raise unless some live node of the cluster has ``cpus`` CPUs and ``gpus`` GPUs (else Ray would
    wait for one forever).

    Raises:
        ConfigError: naming what an actor reserves and what each node has.
    """
    nodes = [n for n in ray.nodes() if n["Alive"]]
    have = sorted((n["NodeManagerAddress"], n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0)) for n in nodes)
    if not any(c >= cpus and g >= gpus for _, c, g in have):
        listed = "; ".join(f"{ip}: {c:g} CPU, {g:g} GPU" for ip, c, g in have) or "none alive"
        raise ConfigError(f"fleet = 'ray': each worker actor reserves {cpus:g} CPU and {gpus:g} GPU, but no node of the "
                          f"cluster has that much ({listed}); lower threads, ray.num_cpus or ray.num_gpus, or add a "
                          "node that has them")

