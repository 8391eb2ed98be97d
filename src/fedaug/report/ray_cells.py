"""A grid's cells as tasks on a Ray cluster (``fedaug compare GRID --ray [ADDRESS]``, docs/cluster.md).

This process (the driver) plans the cells as the local runner does (:func:`~fedaug.report.runner.plan`;
a cell keeps its config's ``threads``: Ray reserves them), settles on its own those that need no
training (finished: ``"done before"``, a copy of an equal finished run: ``"reused"``, another
config: ``"failed"``), holds every other cell's lock and submits it as a Ray task that reserves the
cell's resources (:func:`cell_resources`). Ray runs as many at once as the cluster has room for; a
task whose node is lost is retried by Ray (:data:`RETRIES`), resuming from what it finds.

Where a cell's files go, per task (``files``):

- ``"shared"``: the node sees the output directory at the same path (NFS, a shared volume, or the
  driver's own machine): the cell's run directory is written there as the local runner writes it,
  checkpoints included, so an interrupted cell (a lost node, a cancelled grid) resumes from its last
  checkpoint.
- ``"shipped"``: the node computes in a directory of its own, into which the driver's copy of an
  interrupted run was unpacked first, and returns the run directory as a tar archive, which the
  driver puts in place. What a lost node had computed since is lost with it: the retry or the next
  ``fedaug compare`` resumes from the driver's copy.
- ``"auto"`` (default): ``"shared"`` where the node reads the token this invocation wrote into the
  output directory, else ``"shipped"``.

Every cell computes what it computes locally (same config, seed and threads; the same software on
each node, :func:`~fedaug.core.cluster.check_software`), so its records equal the local runner's
(DESIGN.md invariants 1 and 6). Each cell's start and rounds reach the ``watch`` through a Ray queue.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedaug.config.load import parse_config
from fedaug.core.cluster import check_software, session, software
from fedaug.core.errors import ConfigError, FedaugError
from fedaug.core.runtime import configure_process
from fedaug.engine.records.progress import RoundUpdate
from fedaug.report.runner import Cell, CellOutcome, GridWatch, claim, compute, deliver, find_run, settle

#: how cells' files reach the output directory (module docstring)
FILES = ("auto", "shared", "shipped")
#: the retries Ray gives a cell's task whose worker or node is lost
RETRIES = 2
#: where a shipped run directory is unpacked before it takes its place in the cell's directory
INCOMING = ".incoming"


@dataclass(frozen=True)
class RayCells:
    """Where a grid's cells run: the Ray cluster at ``address`` (``auto``, ``local``, ``host:port``,
    ``ray://host:port``: :func:`~fedaug.core.cluster.connect`), ``files`` as in the module docstring."""

    address: str = "auto"
    files: str = "auto"

    def __post_init__(self) -> None:
        if self.files not in FILES:
            raise ConfigError(f"--ray-files must be one of {', '.join(FILES)}, got {self.files!r}")


def cell_resources(cell: Cell) -> dict[str, float]:
    """What a cell's task reserves: ``ray.num_cpus`` (default: ``threads``, times ``workers`` for worker
    processes of its own) and ``ray.num_gpus`` (none for a cell whose clients run on Ray actors: those
    reserve their own)."""
    cfg = parse_config(cell.raw)
    own = cfg.fleet == "local"
    cpus = cfg.ray.num_cpus if cfg.ray.num_cpus is not None else cfg.threads * (cfg.workers if own else 1)
    return {"num_cpus": cpus, "num_gpus": cfg.ray.num_gpus if own else 0.0}


def pack_dir(path: Path) -> bytes:
    """``path``'s files as a tar archive (names relative to ``path``; the run's writer lock left out)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for f in sorted(path.rglob("*")):
            if f.is_file() and f.relative_to(path).as_posix() != "lock":
                tar.add(f, arcname=f.relative_to(path).as_posix(), recursive=False)
    return out.getvalue()


def unpack_dir(blob: bytes, path: Path) -> None:
    """Write :func:`pack_dir`'s archive into ``path`` (created); names outside it are refused."""
    path.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(path, filter="data")


def _sees(token_file: str, token: str) -> bool:
    try:
        return Path(token_file).read_text() == token
    except OSError:
        return False


def _node() -> str:
    import ray

    return f"{ray.get_runtime_context().get_node_id()[:12]} at {ray.util.get_node_ip_address()}"


def run_cell_task(cell: Cell, files: str, token_file: str, token: str, run: tuple[str, bytes] | None,
                  driver: dict[str, str], events: Any) -> tuple[CellOutcome, bytes | None]:
    """A cell on a Ray node (the body of its task): train it where :func:`settle` left it.

    Args:
        files: ``"auto"``, ``"shared"`` or ``"shipped"`` (module docstring).
        token_file, token: the file the driver wrote into the output directory, and its contents.
        run: the name and contents (:func:`pack_dir`) of the driver's copy of the cell's interrupted run
            directory, if any.
        driver: the driver's :func:`~fedaug.core.cluster.software`.
        events: the queue of the cell's start and rounds (:data:`~fedaug.report.runner.Report` events).

    Returns:
        The outcome and, where the files were shipped, the run directory (:func:`pack_dir`); the outcome's
        ``run_dir`` names the run's place in the cell's directory.
    """
    def note(kind: str, update: RoundUpdate | None = None) -> None:
        events.put((cell.label, kind, update))

    configure_process()
    try:
        check_software(_node(), software(), driver)
        shared = _sees(token_file, token)
        if files == "shared" and not shared:
            raise FedaugError(f"Ray node {_node()} does not see the output directory of {token_file} at the same "
                              "path: mount it there on every node, or use --ray-files shipped")
        if files != "shipped" and shared:
            return compute(cell, cell.dir, note, lambda u: note("round", u)), None
        with tempfile.TemporaryDirectory(prefix="fedaug-cell-") as tmp:
            if run is not None:
                unpack_dir(run[1], Path(tmp) / run[0])
            outcome = compute(cell, Path(tmp), note, lambda u: note("round", u))
            made = Path(outcome.run_dir or "")
            return replace(outcome, run_dir=str(cell.dir / made.name)), pack_dir(made)
    except FedaugError as exc:
        return CellOutcome(cell, "failed", None, 0.0, str(exc)), None
    finally:
        note("end")


def receive(cell: Cell, outcome: CellOutcome, blob: bytes) -> None:
    """Put a shipped run directory in its place in the cell's directory (replacing the driver's copy of
    the interrupted run, if any); a half-written one is never seen (:func:`~fedaug.report.runner.find_run`
    looks only at the cell directory's children)."""
    target = Path(outcome.run_dir or "")
    incoming = cell.dir / INCOMING
    shutil.rmtree(incoming, ignore_errors=True)
    unpack_dir(blob, incoming / target.name)
    if target.exists():
        os.replace(target, incoming / f"{target.name}.before")
    os.replace(incoming / target.name, target)
    shutil.rmtree(incoming, ignore_errors=True)


class _Started:
    """A :class:`~fedaug.report.runner.GridWatch` that notes which cells started and tells ``watch``, if any."""

    def __init__(self, watch: GridWatch | None) -> None:
        self.watch, self.labels = watch, set[str]()

    def planned(self, cells: Sequence[Cell], scheduler: str, jobs: int | None) -> None:
        if self.watch is not None:
            self.watch.planned(cells, scheduler, jobs)

    def connected(self, cluster: str, jobs: int) -> None:
        if self.watch is not None:
            self.watch.connected(cluster, jobs)

    def started(self, label: str) -> None:
        self.labels.add(label)
        if self.watch is not None:
            self.watch.started(label)

    def round_done(self, label: str, update: RoundUpdate) -> None:
        if self.watch is not None:
            self.watch.round_done(label, update)


def run_on_ray(cells: list[Cell], out: Path, target: RayCells, record: Callable[[CellOutcome], None],
               keep_going: bool, watch: GridWatch | None) -> None:
    """Run ``cells`` on the Ray cluster of ``target`` (module docstring), telling ``record`` each outcome and
    ``watch`` the plan (before this process connects: starting a Ray takes seconds) and the cluster reached.
    A Ray that ``local`` started for this call is stopped when it returns (:func:`~fedaug.core.cluster.session`).

    Stops submitting at the first failed cell and cancels the cells that have not started (those
    running finish), unless ``keep_going``; Ctrl-C cancels every cell (a running one stops where it
    is, and resumes next time).

    Raises:
        ConfigError: no cluster at ``target.address``, or Ray is not installed.
    """
    seen = _Started(watch)
    seen.planned(cells, f"--ray {target.address}", None)
    with session(target.address) as (ray, cluster):
        least = min((cell_resources(c)["num_cpus"] for c in cells), default=1.0)
        seen.connected(cluster, max(1, int(ray.cluster_resources().get("CPU", 1.0) // max(least, 1.0))))
        _run_tasks(ray, cells, out, target, record, keep_going, seen)


def _run_tasks(ray: Any, cells: list[Cell], out: Path, target: RayCells, record: Callable[[CellOutcome], None],
               keep_going: bool, seen: _Started) -> None:
    """:func:`run_on_ray`'s cells, this process connected to the cluster: settle or submit each, then
    collect the tasks as they end."""
    from ray.util.queue import Queue

    out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    token_file = out / f".ray-token-{token[:8]}"
    token_file.write_text(token)
    events, ended = Queue(actor_options={"num_cpus": 0}), set[str]()
    task = ray.remote(run_cell_task)
    pending: dict[Any, Cell] = {}
    failed = False
    try:
        for cell in cells:
            if failed and not keep_going:
                break
            outcome = _settle(cell)
            if outcome is not None:
                record(outcome)
                failed |= outcome.status == "failed"
                continue
            run = find_run(cell.dir)
            shipped = None if run is None or target.files == "shared" else (run.name, pack_dir(run))
            pending[task.options(**cell_resources(cell), max_retries=RETRIES).remote(
                cell, target.files, str(token_file), token, shipped, software(), events)] = cell
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            deliver(events, seen, ended)
            for ref in done:
                cell = pending.pop(ref)
                outcome = _collect(ray, ref, cell)
                deliver(events, seen, ended, until_end_of=cell.label)
                (cell.dir / ".lock").unlink(missing_ok=True)
                record(outcome)
                failed |= outcome.status == "failed"
            if failed and not keep_going:
                for ref, cell in list(pending.items()):
                    if cell.label not in seen.labels:
                        ray.cancel(ref)
                        (cell.dir / ".lock").unlink(missing_ok=True)
                        del pending[ref]
    finally:
        for ref, cell in pending.items():  # left only where this process is interrupted
            ray.cancel(ref)
            (cell.dir / ".lock").unlink(missing_ok=True)
        token_file.unlink(missing_ok=True)
        ray.kill(events.actor)


def _settle(cell: Cell) -> CellOutcome | None:
    """The cell's outcome where it needs no task (busy, finished, reused, or failed on its config), else
    ``None``, with its lock held for the task."""
    lock = cell.dir / ".lock"
    if not claim(lock):
        return CellOutcome(cell, "busy", None, 0.0)
    try:
        outcome = settle(cell)
    except FedaugError as exc:
        outcome = CellOutcome(cell, "failed", None, 0.0, str(exc))
    if outcome is not None:
        lock.unlink(missing_ok=True)
    return outcome


def _collect(ray: Any, ref: Any, cell: Cell) -> CellOutcome:
    """A finished task's outcome, its shipped files put in place; a task Ray lost (after its retries)
    is a failed cell that the next ``fedaug compare`` resumes."""
    try:
        outcome, blob = ray.get(ref)
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError) as exc:
        return CellOutcome(cell, "failed", None, 0.0, f"its Ray task was lost after {RETRIES} retries "
                           f"({type(exc).__name__}); run fedaug compare again to resume it")
    if blob is not None:
        receive(cell, outcome, blob)
    return outcome
