"""Experiment tracking: each round's scalars, the resolved config and the run's files, to TensorBoard,
MLflow and W&B offline runs (``[log]``; the optional ``tracking`` extra, imported only when a run asks
for it; W&B: :mod:`fedaug.engine.records.wandb_log`).

The run directory stays the record: a tracking backend is a copy for the tools researchers already
look at (``tensorboard --logdir runs``, ``mlflow ui``). A backend that fails (an unwritable store, a
server that went away) warns once and is dropped; the run goes on and its own records are complete.
A resumed run continues the same MLflow run (its id is kept in the run directory's
``tracking.json``) and logs only the rounds the store does not hold yet; TensorBoard's writer is
reopened with ``purge_step`` at the first round after the checkpoint, so its readers drop the
events of rounds that the resumed run records again (no duplicate steps). A resumed run's W&B offline
run keeps the W&B run id recorded in ``tracking.json`` and logs the rounds after the checkpoint.

Tracking writes only where the user pointed it: the run directory (``tb/``, ``tracking.json``) and
the MLflow store. A sqlite store's experiments keep their artifacts beside the database file
(:func:`artifact_location`), never in ``./mlruns`` of whatever directory the command runs from.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from fedaug.config.load import flatten
from fedaug.config.schema import RunConfig
from fedaug.core.errors import ConfigError
from fedaug.core.paths import absolute_uri
from fedaug.core.serialize import atomic_write_json
from fedaug.engine.records.wandb_log import WandbBackend

#: the run directory's record of where it is tracked (the MLflow run id, to continue it on resume)
TRACKING_FILE = "tracking.json"
#: the subdirectory of the run directory that holds TensorBoard's event files
TB_DIR = "tb"
#: what each backend needs installed, and the extra that installs it
PACKAGES = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow",), "wandb": ("wandb",)}
_UNSAFE = re.compile(r"[^\w\-. /]")
#: URI schemes (before any ``+driver``) of the databases MLflow's client writes to directly
_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
_SQLITE = "sqlite:///"


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _eval_scalars(ev: Mapping[str, Any], metric: str, prefix: str) -> dict[str, float]:
    """One evaluation's scalars under ``prefix``: mean, pooled, spread and every client's figures."""
    out = {f"{prefix}/{k}/mean": v for k, v in ev["mean"].items()}
    out.update({f"{prefix}/test_{metric}/pooled": ev["pooled"][f"test_{metric}"],
                f"{prefix}/test_loss/pooled": ev["pooled"]["test_loss"]})
    for key, stats in ev.get("spread", {}).items():
        out.update({f"{prefix}/{key}/{stat}": v for stat, v in stats.items()})
    for name, res in ev["clients"].items():
        for split in ("val", "test"):
            out.update({f"{prefix}/{split}_{k}/client/{name}": res[split][k] for k in (metric, "loss")})
    return out


def round_scalars(record: Mapping[str, Any], metric: str) -> dict[str, float]:
    """The scalars of one round record (``metrics.jsonl``), by tracking key.

    Keys: ``lr``; ``train/loss`` and ``train/<term>`` (each loss term, mean over the round's
    clients); ``comm/<down|up>/<part>`` and ``comm/<down|up>_total`` (bytes); ``clients/sampled``,
    ``clients/rejected``, ``clients/dropped``; ``privacy/epsilon``; ``time/train_s``,
    ``time/eval_s``, ``time/round_s``; with an evaluation ``eval/<split>_<m>/mean``,
    ``eval/test_<m>/pooled``, ``eval/<split>_<m>/<std|min|worst10>``,
    ``eval/<split>_<m|loss>/client/<name>`` (and ``finetuned/...`` the same after fine-tuning),
    ``eval/comm/<down|up>_total``. Non-finite and missing values are left out; characters MLflow
    refuses in a key (outside letters, digits, ``_-. /``) become ``_``.
    """
    out: dict[str, Any] = {"lr": record["lr"], "train/loss": record["train"]["loss"]}
    clients = list(record["train"]["clients"].values())
    for term in sorted({k for c in clients for k in c} - {"loss", "steps"}):
        values = [c[term] for c in clients if term in c]
        out[f"train/{term}"] = sum(values) / len(values)
    for direction in ("down", "up"):
        out.update({f"comm/{direction}/{part}": n for part, n in record["comm"][direction].items()})
        out[f"comm/{direction}_total"] = record["comm"][f"{direction}_total"]
    out.update({"clients/sampled": len(record["sampled"]), "clients/rejected": len(record["rejected"]),
                "clients/dropped": len(record["dropped"])})
    if "privacy" in record:
        out["privacy/epsilon"] = record["privacy"]["epsilon"]
    times = record["time"]
    out.update({f"time/{k}": v for k, v in times.items()})
    out["time/round_s"] = times.get("train_s", 0.0) + times.get("eval_s", 0.0)
    if "eval" in record:
        ev = record["eval"]
        out.update(_eval_scalars(ev, metric, "eval"))
        if "finetuned" in ev:
            out.update(_eval_scalars(ev["finetuned"], metric, "finetuned"))
        out.update({f"eval/comm/{d}_total": ev["comm"][f"{d}_total"] for d in ("down", "up") if "comm" in ev})
        out["clients/evaluated"] = len(ev["clients"])
    return {_UNSAFE.sub("_", k): float(v) for k, v in out.items() if _finite(v)}


class Backend(Protocol):
    """One tracking destination."""

    name: str

    def log_params(self, params: Mapping[str, str]) -> None: ...
    def log_round(self, step: int, scalars: Mapping[str, float]) -> None: ...
    def log_files(self, paths: Iterable[Path]) -> None: ...
    def close(self, status: str) -> None: ...


class TensorBoardBackend:
    """Event files in ``<run dir>/tb`` (``torch.utils.tensorboard``), one scalar series per key.

    Args:
        log_dir: where the event files go.
        resume_from: ``None`` for a fresh run; for a resume, the checkpoint's round: the writer
            purges the steps after it (readers drop those events of the earlier files).
    """

    name = "tensorboard"

    def __init__(self, log_dir: Path, resume_from: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir), purge_step=None if resume_from is None else resume_from + 1)

    def log_params(self, params: Mapping[str, str]) -> None:
        table = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + table, 0)

    def log_round(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_files(self, paths: Iterable[Path]) -> None:
        for p in paths:
            if p.suffix in (".json", ".md", ".toml"):
                self.writer.add_text(p.name, "```\n" + p.read_text() + "\n```", 0)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


class MlflowBackend:
    """One MLflow run per run directory (``MlflowClient``: a local ``sqlite:///`` or ``file:`` store
    needs no server); build it with :meth:`start`.

    Args:
        client: an ``MlflowClient`` (:func:`_client`).
        run_id: the MLflow run.
        last: the last round the store holds (later rounds only are logged).
    """

    name = "mlflow"

    def __init__(self, client: Any, run_id: str, last: int = 0) -> None:
        self.client, self.run_id, self.last = client, run_id, last

    @classmethod
    def start(cls, uri: str, experiment: str, run_name: str, run_id: str | None,
              tags: Mapping[str, str]) -> "MlflowBackend":
        """A new run in ``experiment`` (created if missing, its artifacts at :func:`artifact_location`), or
        the run ``run_id`` continued: set running again, logging only rounds after the last one its store
        holds."""
        client = _client(uri)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id, max((m.step for m in client.get_metric_history(run_id, "train/loss")),
                                           default=0))
        found = client.get_experiment_by_name(experiment)
        exp_id = (found.experiment_id if found is not None
                  else client.create_experiment(experiment, artifact_location=artifact_location(uri)))
        return cls(client, client.create_run(exp_id, run_name=run_name, tags=dict(tags)).info.run_id)

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_round(self, step: int, scalars: Mapping[str, float]) -> None:
        if step <= self.last:  # a resumed run: the store holds this round already
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in scalars.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000])
        self.last = step

    def log_files(self, paths: Iterable[Path]) -> None:
        for p in paths:
            self.client.log_artifact(self.run_id, str(p))

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


def artifact_location(uri: str) -> str | None:
    """Where a new MLflow experiment in the store ``uri`` keeps its artifacts.

    ``sqlite:///<dir>/<name>.db``: the folder ``<dir>/<name>-artifacts`` beside the database, as an
    absolute ``file://`` URI (a relative path is taken from the working directory, as for the database).
    A file store (``file:...`` or a path) and a tracking server (``http://...``): ``None``, MLflow's own
    choice (inside the file store; the server's artifact store).

    Raises:
        ConfigError: another database (``postgresql://``, an in-memory sqlite): MLflow would keep its
            artifacts in ``./mlruns`` of the working directory.
    """
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme not in _DATABASES:
        return None
    db = unquote(uri[len(_SQLITE):].split("?")[0]) if uri.startswith(_SQLITE) else ""
    if db in ("", ":memory:"):
        raise ConfigError(f"log.mlflow = {uri!r}: MLflow would put this store's artifacts in ./mlruns of the working "
                          "directory; use sqlite:///FILE (artifacts beside FILE), a file store (file:DIR) or a "
                          "tracking server (http://host:5000) in front of that database")
    path = Path(db).resolve()
    return (path.parent / f"{path.stem}-artifacts").as_uri()


def same_uri(a: str, b: str) -> bool:
    """Whether two MLflow URIs name the same store, a relative path in either taken from the current
    directory (a run made before configs recorded them absolute: docs/cli.md, "Paths in a config").

    >>> same_uri("sqlite:///m.db", f"sqlite:///{Path.cwd() / 'm.db'}"), same_uri("sqlite:///m.db", "file:m.db")
    (True, False)
    """
    return absolute_uri(a, Path.cwd()) == absolute_uri(b, Path.cwd())


def check_tracking(cfg: RunConfig) -> None:
    """Fail before a run starts when ``[log]`` asks for a backend whose package is not installed, or for
    an MLflow store whose artifacts would land outside it (:func:`artifact_location`).

    Raises:
        ConfigError: naming the key, the missing package and the install command; or the store and the fix.
    """
    if cfg.log.mlflow:
        artifact_location(cfg.log.mlflow)
    asked = [name for name, on in (("tensorboard", cfg.log.tensorboard), ("mlflow", bool(cfg.log.mlflow)),
                                   ("wandb", cfg.log.wandb == "offline")) if on]
    missing = [(name, pkg) for name in asked for pkg in PACKAGES[name] if find_spec(pkg) is None]
    if missing:
        raise ConfigError("; ".join(f"log.{name} needs the '{pkg}' package, which is not installed" for name, pkg in
                                    missing) + "; install it with: pip install 'fedaug[tracking]' (or set it off)")


class Tracker:
    """The run's tracking backends; every call on a backend is guarded (:meth:`_guard`).

    Build it with :meth:`open`; a tracker with no backend does nothing.
    """

    def __init__(self, backends: list[Backend], metric: str, path: Path | None = None) -> None:
        self.backends, self.metric, self.path = backends, metric, path

    @classmethod
    def open(cls, cfg: RunConfig, run_dir: Path | None, metric: str, resume_from: int | None = None,
             tags: Mapping[str, str] | None = None) -> "Tracker":
        """The backends ``cfg.log`` asks for, for the run in ``run_dir`` (none without a run
        directory).

        Args:
            resume_from: ``None`` for a fresh run (its resolved config is logged as parameters);
                for a resume, the round of its checkpoint (0 without one): the MLflow run recorded
                in ``tracking.json`` continues, TensorBoard purges the steps after it.
            tags: the MLflow run's tags (a ``fedaug compare`` cell's grid, setting, method, seed).
        """
        tracker = cls([], metric, run_dir)
        if run_dir is None or not (cfg.log.tensorboard or cfg.log.mlflow or cfg.log.wandb == "offline"):
            return tracker
        check_tracking(cfg)
        state_file = run_dir / TRACKING_FILE
        state = json.loads(state_file.read_text()) if state_file.is_file() else {}
        if cfg.log.tensorboard:
            tracker._add("tensorboard", lambda: TensorBoardBackend(run_dir / TB_DIR, resume_from))
        if cfg.log.mlflow:
            known = state.get("mlflow", {})
            same = isinstance(known.get("uri"), str) and same_uri(known["uri"], cfg.log.mlflow)
            run_id = known.get("run_id") if same and resume_from is not None else None
            backend = tracker._add("mlflow", lambda: MlflowBackend.start(
                cfg.log.mlflow, cfg.log.mlflow_experiment, run_dir.name, run_id,
                {"fedaug.run_dir": str(run_dir), **(tags or {})}))
            if isinstance(backend, MlflowBackend):
                state["mlflow"] = {"uri": cfg.log.mlflow, "run_id": backend.run_id}
                atomic_write_json(state_file, state)
        if cfg.log.wandb == "offline":
            run_id = state.get("wandb", {}).get("run_id") or WandbBackend.new_id()
            config = flatten(cfg.to_dict())
            if tracker._add("wandb", lambda: WandbBackend.start(run_dir, cfg.log.wandb_project, run_id, config,
                                                                 resume_from, tags or {})) is not None:
                state["wandb"] = {"run_id": run_id}
                atomic_write_json(state_file, state)
        if resume_from is None:
            params = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in flatten(cfg.to_dict()).items()}
            tracker._call(lambda b: b.log_params(params))
            tracker._call(lambda b: b.log_files([run_dir / "config.toml"]) if b.name == "tensorboard" else None)
        return tracker

    def _add(self, name: str, build: Callable[[], Backend]) -> Backend | None:
        try:
            backend = build()
        except Exception as exc:  # noqa: BLE001 - any failure of a tracker must not stop the run
            self._warn(name, exc)
            return None
        self.backends.append(backend)
        return backend

    def _warn(self, name: str, exc: BaseException) -> None:
        warnings.warn(f"tracking to {name} failed ({type(exc).__name__}: {exc}); the run goes on without it, "
                      "its run directory holds every record", stacklevel=3)

    def _call(self, action: Callable[[Backend], object]) -> None:
        """Run ``action`` on every backend; one that raises warns once and is dropped."""
        for backend in list(self.backends):
            try:
                action(backend)
            except Exception as exc:  # noqa: BLE001 - any failure of a tracker must not stop the run
                self._warn(backend.name, exc)
                self.backends.remove(backend)

    def log_round(self, record: Mapping[str, Any]) -> None:
        """Log one round record's :func:`round_scalars` at step = its round."""
        if self.backends:
            scalars = round_scalars(record, self.metric)
            self._call(lambda b: b.log_round(record["round"], scalars))

    def log_files(self, paths: Iterable[Path]) -> None:
        """Log the run's files (``summary.json``, ``report.md``, ``config.toml``) that exist."""
        present = [p for p in paths if p.is_file()]
        self._call(lambda b: b.log_files(present))

    def close(self, status: str = "FINISHED") -> None:
        """End every backend's run (``"FINISHED"``, or ``"FAILED"`` when the run stopped on an error)."""
        self._call(lambda b: b.close(status))
        self.backends = []


def log_run_files(run_dir: Path, files: Iterable[Path]) -> None:
    """Add files written after the run (the CLI's ``report.md``) to the MLflow run that
    ``run_dir``'s ``tracking.json`` names, if any (guarded like every tracking call)."""
    state_file = run_dir / TRACKING_FILE
    known = json.loads(state_file.read_text()).get("mlflow", {}) if state_file.is_file() else {}
    if "run_id" not in known:
        return
    tracker = Tracker([], "")
    tracker._add("mlflow", lambda: MlflowBackend(_client(known["uri"]), known["run_id"]))
    tracker.log_files(files)


def _client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri``, with MLflow's own usage telemetry off unless the user set it
    (nothing leaves the machine that the user did not name)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)
