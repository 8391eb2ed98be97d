"""Keeping a grid's finished runs without their checkpoints: a copy small enough to commit beside
the code, from which tables and results pages are written again, and which ``fedaug compare``
counts as done once it is copied back (``fedaug archive``; docs/compare_and_report.md).

An archived run directory holds the run's ``config.toml``, ``summary.json``, ``report.md``,
``metrics.aside.jsonl`` and ``environment.jsonl`` (where it ran) as they are and its ``metrics.jsonl``
gzipped (``metrics.jsonl.gz``, which :func:`fedaug.engine.records.rundir.read_records` reads); its
checkpoints, locks and temporary files stay behind. Only finished runs (holding ``summary.json``) are copied, so an archived run is never
resumed. The grid's ``grid.json`` is copied, its ``invocations.jsonl`` merged line by line (the
wall times a results page sums are kept, none counted twice), and ``table.md``/``.csv``/``.json``
are written for the archived cells. The copy goes either way with the same call: from a grid's
output directory to the archive, and from the archive back to an output directory.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from fedaug.core.errors import ConfigError
from fedaug.core.serialize import atomic_write_bytes, atomic_write_text
from fedaug.engine.records.rundir import ASIDE, CONFIG, ENVIRONMENT, METRICS, METRICS_GZ, REPORT, SUMMARY
from fedaug.report.runner import GRID_FILE, INVOCATIONS
from fedaug.report.table import write_tables

#: the files of a finished run that an archive keeps as they are
KEPT = (CONFIG, SUMMARY, REPORT, ASIDE, ENVIRONMENT)


@dataclass(frozen=True)
class Archived:
    """What :func:`archive_grid` did: runs ``copied``, runs ``present`` already (same summary),
    and the invocation lines ``merged`` into the destination's ``invocations.jsonl``."""

    copied: int
    present: int
    merged: int


def finished_run_dirs(root: Path) -> list[Path]:
    """Every finished run directory under ``root`` (it holds ``summary.json`` and ``config.toml``), sorted."""
    return sorted(p.parent for p in Path(root).rglob(SUMMARY) if (p.parent / CONFIG).is_file())


def _copy_run(src: Path, dest: Path) -> None:
    """Copy one finished run's kept files to ``dest`` (its records gzipped); the directory appears
    whole or not at all (written as ``dest.partial``, then renamed)."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a copy a killed archive left
    partial.mkdir()
    for name in KEPT:
        if (src / name).is_file():
            shutil.copy2(src / name, partial / name)
    if (src / METRICS).is_file():  # mtime 0: the same records give the same bytes
        atomic_write_bytes(partial / METRICS_GZ, gzip.compress((src / METRICS).read_bytes(), 9, mtime=0))
    elif (src / METRICS_GZ).is_file():
        shutil.copy2(src / METRICS_GZ, partial / METRICS_GZ)
    os.replace(partial, dest)


def _merge_lines(src: Path, dest: Path) -> int:
    """Append to ``dest`` the lines of ``src`` it lacks (order kept); returns how many."""
    if not src.is_file():
        return 0
    have = dest.read_text().splitlines() if dest.is_file() else []
    new = [line for line in src.read_text().splitlines() if line.strip() and line not in have]
    if new:
        atomic_write_text(dest, "".join(line + "\n" for line in [*have, *new]))
    return len(new)


def archive_grid(src: Path, dest: Path) -> Archived:
    """Copy the finished runs of the grid directory ``src`` to ``dest`` without their checkpoints
    (see the module docstring); runs already in ``dest`` are left alone.

    Raises:
        ConfigError: ``src`` is not a grid directory, ``src`` and ``dest`` are the same, or a run
            in ``dest`` has the path of one in ``src`` but another summary (nothing is copied then).
    """
    src, dest = Path(src), Path(dest)
    if not (src / GRID_FILE).is_file():
        raise ConfigError(f"'{src}' is not a grid directory (no {GRID_FILE}); give the directory that "
                          "'fedaug compare' wrote (runs/compare/GRID) or an archive of one")
    if dest.resolve() == src.resolve():
        raise ConfigError(f"the archive '{dest}' is the grid directory itself; give another directory")
    runs = finished_run_dirs(src)
    todo, present = [], 0
    for run in runs:
        target = dest / run.relative_to(src)
        if not (target / SUMMARY).is_file():
            todo.append((run, target))
        elif json.loads((target / SUMMARY).read_text()) == json.loads((run / SUMMARY).read_text()):
            present += 1
        else:
            raise ConfigError(f"'{target}' holds another run than '{run}' (their summaries differ); move one "
                              "of them away, or archive into another directory")
    dest.mkdir(parents=True, exist_ok=True)
    for run, target in todo:
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_run(run, target)
    shutil.copy2(src / GRID_FILE, dest / GRID_FILE)
    merged = _merge_lines(src / INVOCATIONS, dest / INVOCATIONS)
    write_tables(dest)
    return Archived(len(todo), present, merged)
