"""The in-process simulation engine: seeded, order-free rounds over logical client ids.

One worker model serves every client (memory stays flat in the number of clients, DESIGN.md
invariant 4); all randomness is derived from (seed, round, client, component, purpose), so the
result does not depend on the order in which clients are trained (invariant 1); every message part
is validated and its bytes counted (invariants 3 and 5); checkpoints make resumed runs exact (6).
Nothing here changes process-wide state (torch's thread count, the allocator): a process entry
point opts in with :func:`fedaug.core.runtime.configure_process` (the CLI does).
The round itself is the server's (:class:`~fedaug.engine.server.loop.Server`), shared with the Flower
adapter; this module supplies the clients: an :class:`InProcessFleet` over the dataset in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

from fedaug.config.schema import RunConfig, run_name, validate
from fedaug.core.cluster import ray_target
from fedaug.core.device import resolve_device
from fedaug.core.errors import ConfigError
from fedaug.data.base import FederatedData
from fedaug.data.registry import load_dataset
from fedaug.engine.client.worker import Worker, build_worker_model
from fedaug.engine.execution import captures, execution_name, on_cuda
from fedaug.engine.fleet.inprocess import InProcessFleet, Order, Trainer
from fedaug.engine.fleet.processes import ProcessFleet
from fedaug.engine.fleet.ray import RayFleet
from fedaug.engine.fleet.tasks import WorkerDied
from fedaug.engine.records.installation import installation
from fedaug.engine.records.progress import Progress, RoundUpdate, announce, plural
from fedaug.engine.records.rundir import RunDir, stored_config
from fedaug.engine.records.tracking import Tracker, check_tracking
from fedaug.engine.server.loop import Federation, Server
from fedaug.methods.component import State
from fedaug.methods.recipe import Recipe, build_recipe
from fedaug.methods.recorded import check_resume, pin
from fedaug.metrics.tasks import make_task


class Simulation(Server):
    """Runs a configured experiment round by round in this process, on ``cfg.device`` (resolved
    here: :func:`~fedaug.core.device.resolve_device`).

    Args:
        cfg: the validated run configuration.
        data: the federated dataset.
        recipe: the method (base algorithm + augmentations).
        execution_order: permutes the sampled client ids before training them (tests use it to
            show that the order does not matter); default: ascending ids.
        trainer: trains each training phase's clients (a pack's slot, :mod:`fedaug.engine.fleet.packed`: with
            other runs' clients); default: the worker (one at a time, or ``train.group_clients`` at once).

    Raises:
        ConfigError: ``execution_order`` or ``trainer`` with worker processes or Ray actors.
    """

    def __init__(self, cfg: RunConfig, data: FederatedData, recipe: Recipe,
                 execution_order: Order | None = None, trainer: Trainer | None = None) -> None:
        federation = Federation.of(data)
        federation.check(cfg)
        device = resolve_device(cfg.device)
        fleet: InProcessFleet | ProcessFleet | RayFleet
        if execution_order is not None and cfg.fleet == "ray":
            raise ConfigError("execution_order runs clients in a given order on one worker in this process; with "
                              "fleet = 'ray' they run as actors become free: set fleet='local' and workers=1 to "
                              "choose the order")
        if trainer is not None and (cfg.fleet == "ray" or cfg.workers > 1):
            raise ConfigError("a packed run trains its clients in this process with other runs' clients; it cannot "
                              "also train them on worker processes or Ray actors: set workers=1 and fleet='local', "
                              "or run it unpacked")
        if execution_order is not None and cfg.workers > 1:
            raise ConfigError("execution_order runs clients in a given order on one worker; with workers > 1 "
                              "they run as workers become free: set workers=1 to choose the order")
        if cfg.fleet == "ray":
            fleet = RayFleet(cfg, recipe, data, device)  # pickles the recipe before its setup
            model = build_worker_model(cfg, recipe, data.input_shape, data.num_classes, device)
        elif cfg.workers > 1:
            devices = [str(resolve_device(d)) for d in cfg.devices] or [str(device)]
            fleet = ProcessFleet(cfg, recipe, data, device, devices)  # pickles the recipe before its setup
            model = build_worker_model(cfg, recipe, data.input_shape, data.num_classes, device)
        else:
            model = build_worker_model(cfg, recipe, data.input_shape, data.num_classes, device)
            worker = Worker(cfg, recipe, model, make_task(data.task, data.num_classes), data.num_clients)
            fleet = InProcessFleet(worker, data, execution_order, on_device=cfg.data.on_device, trainer=trainer)
        super().__init__(cfg, recipe, model, federation, fleet)
        self.data = data

    @property
    def client_states(self) -> dict[int, dict[str, State]]:
        """Each client's per-client state ``{client id: {component name: state}}``."""
        return self.fleet.checkpoint()

    def run(self, run_dir: RunDir | None = None, progress: Progress | None = None,
            tracker: Tracker | None = None, stop: Callable[[int], bool] | None = None) -> dict[str, Any]:
        """:meth:`Server.run` (``stop`` as there), then stop the worker processes or actors (``workers > 1``,
        ``fleet = "ray"``) however it ends."""
        try:
            return super().run(run_dir, progress, tracker, stop)
        except WorkerDied as exc:
            where = f"'fedaug resume {run_dir.path}'" if run_dir is not None else "a resume of its run directory"
            raise WorkerDied(str(exc).replace("'fedaug resume <run dir>'", where)) from None
        finally:
            self.close()

    def _environment(self) -> dict[str, Any]:
        """Where the run computed, how its clients stepped (``execution``,
        :func:`~fedaug.engine.execution.execution_name`) and where their data waited between rounds (``data``:
        ``"device"`` or ``"host"``); with worker processes or Ray actors, the thread count they trained at
        (``threads``), how many there were (``workers``) and, on Ray, ``fleet``. Worker processes and actors report
        neither choice back: their ``execution`` is what the config resolves to on their devices
        (:func:`~fedaug.engine.execution.captures`), and ``data`` is recorded where the config decides it alone
        (``"host"``: no worker on CUDA, or ``data.on_device = false``; else each worker decides on its device)."""
        env = super()._environment()
        if isinstance(self.fleet, InProcessFleet):
            env.update(execution=self.fleet.execution, data="device" if self.fleet.data_on_device else "host")
        else:
            captured = captures(self.cfg, (self.recipe, self.model))
            env.update(execution=execution_name(packed=False, grouped=False, captured=captured))
            if self.cfg.data.on_device is False or not on_cuda(self.cfg):
                env.update(data="host")
        if self.cfg.workers > 1 or self.cfg.fleet == "ray":
            env.update(threads=self.cfg.threads, workers=self.cfg.workers)
        if self.cfg.fleet == "ray":
            env.update(fleet="ray")
        return env

    def close(self) -> None:
        """Stop the worker processes or actors, if any (a later round starts them again)."""
        self.fleet.close()

    def __enter__(self) -> "Simulation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_simulation(cfg: RunConfig, execution_order: Order | None = None, recipe: Recipe | None = None,
                     trainer: Trainer | None = None) -> Simulation:
    """Validate the method and the device, load the data and build a :class:`Simulation` (no files
    written, no process-wide setting changed: ``cfg.threads`` is applied by
    :func:`~fedaug.core.runtime.configure_process`, which the caller may run first).

    Args:
        recipe: the method (default: built from ``cfg.method``), e.g. one with your own components.
        trainer: trains each training phase's clients (:class:`Simulation`; a pack's slot).

    Raises:
        ConfigError: among others, a ``device`` this machine does not have (before the data loads).
    """
    resolve_device(cfg.device)
    recipe = recipe or build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    return Simulation(cfg, data, recipe, execution_order, trainer)


def heading(cfg: RunConfig, start: int = 0) -> str:
    """A run's first progress line, printed before its data loads: its name, data and model, the rounds left
    after ``start``, its device and what trains its clients (this process, worker processes or Ray actors).

    Raises:
        ConfigError: a ``device`` this machine does not have (as :func:`build_simulation` would).

    >>> heading(validate({"data": {"name": "synthetic"}, "train": {"rounds": 5}, "device": "cpu", "threads": 1}))
    'fedaug: synthetic-fedavg: data synthetic, model small_cnn, rounds 1-5 of 5, device cpu, this process at 1 thread'
    """
    device, threads = resolve_device(cfg.device), plural(cfg.threads, "thread")
    if cfg.fleet == "ray":
        fleet = f"{plural(cfg.workers, 'Ray actor')} (Ray: {ray_target(cfg.ray.address)}) at {threads} each"
    elif cfg.workers > 1:
        fleet = f"{cfg.workers} worker processes on {', '.join(cfg.devices) or device} at {threads} each"
    else:
        fleet = f"this process at {threads}"
    rounds = cfg.train.rounds
    left = f"rounds {start + 1}-{rounds} of {rounds}" if start < rounds else f"all {rounds} rounds done"
    return f"fedaug: {run_name(cfg)}: data {cfg.data.name}, model {cfg.model.name}, {left}, device {device}, {fleet}"


def run_experiment(cfg: RunConfig, *, quiet: bool = False, write: bool = True,
                   execution_order: Order | None = None,
                   tags: Mapping[str, str] | None = None,
                   on_round: Callable[[RoundUpdate], None] | None = None,
                   out_dir: str | None = None, trainer: Trainer | None = None,
                   stop: Callable[[int], bool] | None = None) -> tuple[dict[str, Any], RunDir | None]:
    """Run ``cfg`` from scratch; with ``write``, in a new run directory under ``cfg.out_dir``, whose
    ``config.toml`` states every recorded option (:func:`fedaug.methods.recorded.pin`) and whose
    ``environment.jsonl`` this installation (:func:`~fedaug.engine.records.installation.installation`), tracked
    where ``[log]`` asks (:class:`~fedaug.engine.records.tracking.Tracker`, with ``tags``); progress on stderr
    (:class:`~fedaug.engine.records.progress.Progress`; none with ``quiet``), each round also to ``on_round``.
    ``out_dir`` puts the run directory elsewhere while its ``config.toml`` keeps ``cfg.out_dir`` (a grid
    cell that a Ray node computes in a directory of its own, then ships to ``cfg.out_dir``). ``trainer`` trains its
    training phases (a pack's slot: :class:`Simulation`). ``stop`` is asked
    after each round but the last (:meth:`~fedaug.engine.server.loop.Server.run`: ``True`` raises
    :class:`~fedaug.core.errors.RunStopped` with that round checkpointed, its ``run_dir`` set)."""
    cfg = pin(cfg)
    check_tracking(cfg)
    announce(heading(cfg), quiet)
    sim = build_simulation(cfg, execution_order, trainer=trainer)
    run_dir = RunDir.start(cfg, out_dir) if write else None
    with run_dir if run_dir is not None else nullcontext():  # its writer lock, released however the run ends
        if run_dir is not None:
            run_dir.append_environment(0, installation())
        tracker = Tracker.open(cfg, run_dir.path if run_dir is not None else None, sim.task.metric, tags=tags)
        with Progress(cfg.train.rounds, quiet=quiet, on_update=on_round) as progress:
            return sim.run(run_dir, progress, tracker, stop), run_dir


def resume_experiment(path: str, *, quiet: bool = False, device: str | None = None,
                      recipe: Recipe | None = None, workers: int | None = None,
                      fleet: str | None = None, from_round: int | None = None,
                      tags: Mapping[str, str] | None = None,
                      on_round: Callable[[RoundUpdate], None] | None = None,
                      trainer: Trainer | None = None,
                      stop: Callable[[int], bool] | None = None) -> tuple[dict[str, Any], RunDir]:
    """Finish the run in ``path`` from its newest checkpoint (or from scratch if it has none).

    Everything the resume needs is checked before anything in ``path`` changes (:func:`ready_to_resume`:
    the lock, config, checkpoint, records, device, tracking, data and model); a refused resume leaves
    the directory byte for byte as it was.

    Args:
        device: where to compute the remaining rounds (``None``: the run's own ``device``), e.g. the
            CPU for a run that began on a GPU; the checkpoint restores with a warning that the
            device moved (the rounds after it are another sample of the experiment).
        recipe: the method, for a run started with one of your own (default: built from the config).
        workers: train the remaining rounds on this many worker processes or actors (``None``: the run's
            own ``workers``); the numbers are the same.
        fleet: where the workers run from here (``"local"`` or ``"ray"``; ``None``: the run's own
            ``fleet``), e.g. on this machine after the cluster is gone; the numbers are the same.
        from_round: continue from the checkpoint of this round instead of the newest (0: from
            scratch); later checkpoints are deleted and later records moved aside
            (:meth:`~fedaug.engine.records.rundir.RunDir.rewind`), e.g. to go back before a poisoned round.
        tags: the tracked run's tags, if ``[log]`` starts a new one (:class:`~fedaug.engine.records.tracking.Tracker`);
            a tracked run continues its own MLflow run.
        on_round: called with each round's :class:`~fedaug.engine.records.progress.RoundUpdate` (as in
            :func:`run_experiment`); the run's ``environment.jsonl`` gains a line for this process.
        trainer: trains its training phases (a pack's slot: :class:`Simulation`).
        stop: asked after each round but the last, as in :func:`run_experiment`.

    Raises:
        RunStopped: ``stop`` said so (the round it stopped after is checkpointed; the same call continues).
        CheckpointError: another process writes ``path`` (its lock is held), the newest checkpoint
            (or that of ``from_round``) is missing, unreadable or not a fedaug checkpoint, or
            ``metrics.jsonl`` lacks a round the checkpoint covers.
        ConfigError: the run's device is not on this machine (the message names ``--device``), or
            the run's recorded options (the FFA layers' ``kernel``) differ between its
            checkpoint and its ``config.toml``, or the run predates their record
            (:func:`fedaug.methods.recorded.check_resume`); the message says what to do.
        FedaugError: its data or model cannot be built (a data root that is gone, say).
    """
    run_dir = RunDir.open(path).lock(tidy=False)  # one writer: a second resume is refused
    with run_dir.untouched_if_refused():
        stored, cfg, sim = ready_to_resume(run_dir, device=device, recipe=recipe, workers=workers, fleet=fleet,
                                           from_round=from_round, quiet=quiet, trainer=trainer)
    with run_dir, sim:  # from here the resume changes the directory
        run_dir.tidy()
        if from_round is not None:
            run_dir.rewind(from_round)
        if cfg != stored and sim.round == 0:
            run_dir.write_config(cfg)  # starts again from round 1: record the options it now runs with
        run_dir.truncate_rounds(sim.round)
        run_dir.append_environment(sim.round, installation())
        tracker = Tracker.open(cfg, run_dir.path, sim.task.metric, resume_from=sim.round, tags=tags)
        with Progress(cfg.train.rounds, start=sim.round, quiet=quiet, on_update=on_round) as progress:
            return sim.run(run_dir, progress, tracker, stop), run_dir


def ready_to_resume(run_dir: RunDir, *, device: str | None = None, recipe: Recipe | None = None,
                    workers: int | None = None, fleet: str | None = None, from_round: int | None = None,
                    quiet: bool = True, trainer: Trainer | None = None) -> tuple[RunConfig, RunConfig, Simulation]:
    """Everything a resume of ``run_dir`` needs, checked and built without changing a file in it: its
    stored config, the config it resumes with (:func:`fedaug.methods.recorded.check_resume`, with
    ``workers``, ``fleet`` and ``device`` applied), and the simulation, built (data loaded, model
    built) and restored from the checkpoint (newest, or ``from_round``'s), whose rounds
    ``metrics.jsonl`` must record; unless ``quiet``, the run's first progress line (:func:`heading`) on
    stderr before the data loads. Arguments and errors as :func:`resume_experiment`'s."""
    stored = stored_config(run_dir.path)
    payload = run_dir.load_latest() if from_round is None else run_dir.load_round(from_round)
    cfg = check_resume(stored, payload["config"] if payload is not None else None, str(run_dir.path))
    for key, value in (("workers", workers), ("fleet", fleet), ("device", device)):
        if value is not None:
            cfg = validate({**cfg.to_dict(), key: value})
    if device is None:
        try:
            resolve_device(cfg.device)
        except ConfigError as err:
            raise ConfigError(f"{err}; the run was configured for it: finish it here with "
                              f"'fedaug resume {run_dir.path} --device cpu' (or another available device)") from None
    start = payload["round"] if payload is not None else 0
    run_dir.check_records(start)
    check_tracking(cfg)
    announce(heading(cfg, start), quiet)
    sim = build_simulation(cfg, recipe=recipe, trainer=trainer)
    if payload is not None:
        try:
            sim.restore(payload)
        except BaseException:
            sim.close()
            raise
    return stored, cfg, sim
