"""Weights & Biases as a tracking backend, offline only (``[log] wandb = "offline"``; the tracking extra).

Each process that trains a run (its start, each resume) writes one offline W&B run under the run
directory's ``wandb/`` (``offline-run-<time>-<id>/run-<id>.wandb``), with the run directory's name
as the W&B run's name and one W&B run id per run directory (kept in ``tracking.json``), so a resumed
run's offline run continues the same W&B run when synced. Nothing is sent during a run: upload with
``wandb sync <run dir>/wandb/offline-run-*`` (oldest first), or read it back offline with
``wandb leet inspect --json <run dir>/wandb/offline-run-*/run-*.wandb``. W&B's console capture,
code saving and git probing are off, and so is its error reporting unless ``WANDB_ERROR_REPORTING``
is set: the run directory is the record, W&B a copy of its scalars.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: the subdirectory of the run directory that holds W&B's offline runs
WANDB_DIR = "wandb"


class WandbBackend:
    """One offline W&B run for this process's part of a run directory; build it with :meth:`start`.

    Args:
        run: the ``wandb`` run object.
        last: the last round a resumed run's checkpoint covered (later rounds only are logged).
    """

    name = "wandb"

    def __init__(self, run: Any, last: int = 0) -> None:
        self.run, self.last = run, last

    @staticmethod
    def new_id() -> str:
        """A W&B run id (8 lowercase letters and digits, as W&B makes them)."""
        return secrets.token_hex(4)

    @classmethod
    def start(cls, run_dir: Path, project: str, run_id: str, config: Mapping[str, Any], resume_from: int | None,
              tags: Mapping[str, str]) -> "WandbBackend":
        """Start the offline run ``run_id`` in ``run_dir/wandb`` with the resolved ``config`` (dotted keys,
        values as in ``config.toml``); ``resume_from``: a resume's checkpoint round, whose later rounds
        only are logged; ``tags``: a grid cell's tags, as ``key=value``."""
        os.environ.setdefault("WANDB_SILENT", "true")
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # nothing leaves the machine the user did not name
        import wandb

        (run_dir / WANDB_DIR).mkdir(exist_ok=True)
        settings = wandb.Settings(console="off", save_code=False, disable_git=True, silent=True)
        run = wandb.init(mode="offline", dir=str(run_dir), project=project, name=run_dir.name, id=run_id,
                         config=dict(config), resume="allow" if resume_from is not None else None,
                         tags=[f"{k}={v}" for k, v in tags.items()], settings=settings)
        return cls(run, resume_from or 0)

    def log_params(self, params: Mapping[str, str]) -> None:
        """Nothing: the config went in, with its types, when the run started (:meth:`start`)."""

    def log_round(self, step: int, scalars: Mapping[str, float]) -> None:
        if step <= self.last:
            return
        self.run.log(dict(scalars), step=step)
        self.last = step

    def log_files(self, paths: Iterable[Path]) -> None:
        """``summary.json``'s final and best results go into the W&B run's summary; other files stay
        in the run directory (an offline run's files are copies nobody reads)."""
        for p in paths:
            if p.name == "summary.json":
                summary = json.loads(p.read_text())
                for which in ("final", "best"):
                    ev = (summary.get(which) or {}).get("eval") or {}
                    self.run.summary.update({f"{which}/{k}": v for k, v in (ev.get("mean") or {}).items()
                                             if isinstance(v, (int, float))})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
