"""The run directory: resolved config, per-round JSON Lines, checkpoints, summary and report."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from fedaug.config.load import dump_toml
from fedaug.config.schema import RunConfig
from fedaug.core.errors import CheckpointError
from fedaug.core.serialize import atomic_write_json, atomic_write_text, load_tensors, save_tensors

CONFIG, METRICS, SUMMARY, REPORT, CKPT_DIR = "config.toml", "metrics.jsonl", "summary.json", "report.md", "checkpoints"
_CKPT = re.compile(r"round_(\d{6})\.pt$")


class RunDir:
    """One run's directory (DESIGN.md, "Run directory"); every write is atomic or append-fsynced.

    Args:
        path: the directory (created if missing).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, out_dir: str | os.PathLike[str], name: str) -> "RunDir":
        """A new, unique ``out_dir/name-YYYYmmdd-HHMMSS[-k]`` directory."""
        base = Path(out_dir) / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, k = base, 1
        while True:
            try:
                path.mkdir(parents=True)
                return cls(path)
            except FileExistsError:
                path, k = base.with_name(f"{base.name}-{k}"), k + 1

    @classmethod
    def start(cls, cfg: RunConfig, out_dir: str | os.PathLike[str] | None = None) -> "RunDir":
        """A new run directory for ``cfg`` under ``out_dir`` (default ``cfg.out_dir``), holding its
        resolved config."""
        run = cls.create(out_dir if out_dir is not None else cfg.out_dir,
                         cfg.name or f"{cfg.data.name}-{cfg.method.base}")
        run.write_config(cfg)
        return run

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "RunDir":
        """An existing run directory; it must hold a ``config.toml``."""
        run = cls(path)
        if not (run.path / CONFIG).is_file():
            raise CheckpointError(
                f"'{run.path}' is not a fedaug run directory (no {CONFIG}); "
                "give the directory that 'fedaug run' printed"
            )
        return run

    # --- config -------------------------------------------------------------------------------
    def write_config(self, cfg: RunConfig) -> None:
        atomic_write_text(self.path / CONFIG, dump_toml(cfg.to_dict()))

    # --- per-round records --------------------------------------------------------------------
    def append_round(self, record: dict[str, Any]) -> None:
        """Append one JSON line and fsync it."""
        with open(self.path / METRICS, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def rounds(self) -> list[dict[str, Any]]:
        """Every complete record, in order (a torn last line from a killed run is ignored)."""
        path = self.path / METRICS
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return out

    def truncate_rounds(self, last: int) -> None:
        """Keep the records of rounds ``<= last`` (rewritten atomically)."""
        kept = [r for r in self.rounds() if r["round"] <= last]
        atomic_write_text(self.path / METRICS, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(round, path)`` of every checkpoint, oldest first."""
        d = self.path / CKPT_DIR
        found = [(int(m.group(1)), p) for p in d.glob("round_*.pt") if (m := _CKPT.search(p.name))]
        return sorted(found)

    def save_checkpoint(self, round: int, payload: dict[str, Any], keep: int) -> None:
        """Write ``checkpoints/round_XXXXXX.pt`` atomically, then delete all but the ``keep`` newest."""
        save_tensors(self.path / CKPT_DIR / f"round_{round:06d}.pt", payload)
        for _, old in self.checkpoints()[:-keep]:
            old.unlink()

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint's payload, or ``None`` when there is none."""
        found = self.checkpoints()
        return load_tensors(found[-1][1]) if found else None

    # --- summary and report -------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.path / SUMMARY, summary)

    def write_report(self, markdown: str) -> None:
        atomic_write_text(self.path / REPORT, markdown)

    def read_summary(self) -> dict[str, Any] | None:
        path = self.path / SUMMARY
        return json.loads(path.read_text()) if path.is_file() else None
