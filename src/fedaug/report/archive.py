"""Keeping a grid's finished runs without their checkpoints: a copy small enough to commit beside
the code, from which tables and results pages are written again, and which ``fedaug compare``
counts as done once it is copied back (``fedaug archive``; docs/compare_and_report.md).

An archived run directory holds the run's ``config.toml``, ``summary.json``, ``report.md``,
``metrics.aside.jsonl`` and ``environment.jsonl`` (where it ran) as they are and its ``metrics.jsonl``
gzipped (``metrics.jsonl.gz``, which :func:`fedaug.engine.records.rundir.read_records` reads); its
checkpoints, locks and temporary files stay behind. Only finished runs (holding ``summary.json``) are copied,
so an archived run is never resumed, unless ``keep_unfinished`` asks for the unfinished ones too: each cell's
run that a time limit stopped (its newest run directory, without ``summary.json``, with a checkpoint) is copied
with its ``metrics.jsonl`` as it is and its newest checkpoint only, so that ``fedaug compare`` resumes it once
it is copied back (a grid run in pieces on short GPU slots: ``benchmarks/paper_scale_gpu.sh``). An unfinished
run in the destination is replaced by a copy that has got further, or by the run finished (without
checkpoints). The grid's ``grid.json`` is copied, its ``invocations.jsonl`` merged line by line (the
wall times a results page sums are kept, none counted twice), and ``table.md``/``.csv``/``.json``
are written for the archived cells. The copy goes either way with the same call: from a grid's
output directory to the archive, and from the archive back to an output directory. Archives of several grids
travel as one gzipped tarball (:func:`write_tarball`, :func:`merge_tarball`).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedaug.core.errors import ConfigError
from fedaug.core.serialize import atomic_write_bytes, atomic_write_text
from fedaug.engine.records.rundir import (ASIDE, CKPT_DIR, CONFIG, ENVIRONMENT, METRICS, METRICS_GZ, REPORT, SUMMARY,
                                          RunDir)
from fedaug.report.runner import GRID_FILE, INVOCATIONS, find_run
from fedaug.report.table import write_tables

#: the files of a finished run that an archive keeps as they are
KEPT = (CONFIG, SUMMARY, REPORT, ASIDE, ENVIRONMENT)


@dataclass(frozen=True)
class Archived:
    """What :func:`archive_grid` did: runs ``copied`` (``unfinished`` of them unfinished, each with its newest
    checkpoint), runs ``present`` already (the same summary, or an unfinished run as far along or finished; in the
    destination, or in the archive ``known``), unfinished runs ``replaced`` (by a copy that got further, or by the
    run finished), and the invocation lines ``merged`` into the destination's ``invocations.jsonl``."""

    copied: int
    present: int
    merged: int
    unfinished: int = 0
    replaced: int = 0


def finished_run_dirs(root: Path) -> list[Path]:
    """Every finished run directory under ``root`` (it holds ``summary.json`` and ``config.toml``), sorted."""
    return sorted(p.parent for p in Path(root).rglob(SUMMARY) if (p.parent / CONFIG).is_file())


def newest_checkpoint(run: Path) -> int:
    """The round of the run directory's newest checkpoint (0: it has none)."""
    saved = RunDir(run).checkpoints()
    return saved[-1][0] if saved else 0


def unfinished_run_dirs(root: Path) -> list[Path]:
    """Every run under ``root`` that a cell resumes: its cell's newest run directory (:func:`find_run`), without
    ``summary.json``, with a checkpoint; sorted."""
    runs = {find_run(p.parent.parent.parent) for p in Path(root).rglob(f"{CKPT_DIR}/round_*.pt")}
    return sorted(r for r in runs if r is not None and not (r / SUMMARY).is_file() and newest_checkpoint(r))


def _copy_run(src: Path, dest: Path) -> None:
    """Copy one run's kept files to ``dest``: a finished run's records gzipped; an unfinished run's records as
    they are (its resume appends to them) and its newest checkpoint. The directory appears whole or not at all
    (written as ``.NAME.partial``, then renamed; one it replaces is renamed away first, then deleted; hidden
    names, which sort before every run directory's name, the newest of which a cell takes for its run)."""
    partial, old = (dest.with_name(f".{dest.name}.{suffix}") for suffix in ("partial", "replaced"))
    for leftover in (partial, old):  # what a killed archive left
        shutil.rmtree(leftover, ignore_errors=True)
    partial.mkdir()
    for name in KEPT:
        if (src / name).is_file():
            shutil.copy2(src / name, partial / name)
    if not (src / SUMMARY).is_file():
        if (src / METRICS).is_file():
            shutil.copy2(src / METRICS, partial / METRICS)
        _, checkpoint = RunDir(src).checkpoints()[-1]
        (partial / CKPT_DIR).mkdir()
        shutil.copy2(checkpoint, partial / CKPT_DIR / checkpoint.name)
    elif (src / METRICS).is_file():  # mtime 0: the same records give the same bytes
        atomic_write_bytes(partial / METRICS_GZ, gzip.compress((src / METRICS).read_bytes(), 9, mtime=0))
    elif (src / METRICS_GZ).is_file():
        shutil.copy2(src / METRICS_GZ, partial / METRICS_GZ)
    if dest.exists():
        os.replace(dest, old)
    os.replace(partial, dest)
    shutil.rmtree(old, ignore_errors=True)


def _merge_lines(src: Path, dest: Path) -> int:
    """Append to ``dest`` the lines of ``src`` it lacks (order kept); returns how many."""
    if not src.is_file():
        return 0
    have = dest.read_text().splitlines() if dest.is_file() else []
    new = [line for line in src.read_text().splitlines() if line.strip() and line not in have]
    if new:
        atomic_write_text(dest, "".join(line + "\n" for line in [*have, *new]))
    return len(new)


def _needs_copy(run: Path, target: Path) -> bool:
    """Whether the run ``run`` goes to ``target``: nothing is there, or an unfinished run that ``run`` has got
    further than (finished, or a newer checkpoint); ``False`` where ``target`` holds the same finished run, or
    the run as far along or finished.

    Raises:
        ConfigError: ``target`` holds another finished run (their summaries differ).
    """
    if not (target / CONFIG).is_file():
        return True
    if not (target / SUMMARY).is_file():
        return (run / SUMMARY).is_file() or newest_checkpoint(run) > newest_checkpoint(target)
    if not (run / SUMMARY).is_file() or json.loads((target / SUMMARY).read_text()) == json.loads(
            (run / SUMMARY).read_text()):
        return False
    raise ConfigError(f"'{target}' holds another run than '{run}' (their summaries differ); move one "
                      "of them away, or archive into another directory")


def archive_grid(src: Path, dest: Path, *, keep_unfinished: bool = False, known: Path | None = None) -> Archived:
    """Copy the finished runs of the grid directory ``src`` to ``dest`` without their checkpoints, and with
    ``keep_unfinished`` its unfinished runs with their newest checkpoint (see the module docstring); runs already
    in ``dest`` are left alone, but for unfinished ones that ``src`` has got further. With ``known`` (an archive of
    the grid), only the runs that ``known`` lacks or holds less far along are copied: what ``src`` adds to it.

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
    runs = finished_run_dirs(src) + (unfinished_run_dirs(src) if keep_unfinished else [])
    new = [run for run in runs if known is None or _needs_copy(run, Path(known) / run.relative_to(src))]
    todo = [(run, target) for run in new if _needs_copy(run, target := dest / run.relative_to(src))]
    replaced = sum((target / CONFIG).is_file() for _, target in todo)
    dest.mkdir(parents=True, exist_ok=True)
    for run, target in todo:
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_run(run, target)
    shutil.copy2(src / GRID_FILE, dest / GRID_FILE)
    merged = _merge_lines(src / INVOCATIONS, dest / INVOCATIONS)
    write_tables(dest)
    return Archived(len(todo), len(runs) - len(todo), merged,
                    sum(not (run / SUMMARY).is_file() for run, _ in todo), replaced)


def write_tarball(grids: Sequence[Path], path: Path) -> None:
    """Write the archived grid directories ``grids`` (:func:`archive_grid`'s output) into one gzipped tarball at
    ``path``, each under its directory's name (written to a temporary sibling, then renamed; the directory of
    ``path`` is created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with tarfile.open(partial, "w:gz") as tar:
        for grid in grids:
            tar.add(grid, arcname=Path(grid).name)
    os.replace(partial, path)


def merge_tarball(path: Path, dest: Path) -> dict[str, Archived]:
    """Merge each archived grid of the tarball ``path`` (:func:`write_tarball`) into ``dest/<grid name>``
    (:func:`archive_grid`), its unfinished runs kept: a tarball carries them so that they can be continued.

    Returns:
        What was done, by grid name.

    Raises:
        ConfigError: ``path`` is not a tarball, holds a member that would land outside its grid directories
            (an absolute path, ``..``, a link), or holds no grid directory (nothing is merged then), or a grid's
            merge fails (:func:`archive_grid`; the grids before it are merged).
    """
    if not tarfile.is_tarfile(path):
        raise ConfigError(f"'{path}' is neither a grid directory nor a tarball of archived grids")
    with tempfile.TemporaryDirectory(prefix="fedaug-archive-") as tmp:
        with tarfile.open(path) as tar:
            try:
                tar.extractall(tmp, filter="data")
            except tarfile.FilterError as exc:
                raise ConfigError(f"'{path}' holds a member fedaug does not extract ({exc}); it is not a tarball of "
                                  "archived grids") from None
        grids = sorted(p for p in Path(tmp).iterdir() if (p / GRID_FILE).is_file())
        if not grids:
            raise ConfigError(f"'{path}' holds no grid directory (one with {GRID_FILE} at the tarball's top level)")
        return {grid.name: archive_grid(grid, Path(dest) / grid.name, keep_unfinished=True) for grid in grids}
