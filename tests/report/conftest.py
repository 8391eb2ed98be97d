"""A tiny grid (2 methods x 2 seeds on synthetic data); tests/conftest.py holds it finished (``tiny_grid``); the
tiny grid stating a paper scale; a clock for time limits; the records of a grid's cells."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fedaug.engine.records.rundir import read_records
from fedaug.report.grid import GridSpec, PaperScale, parse_grid


def tiny_grid_raw(**extra: Any) -> dict[str, Any]:
    """A grid file's contents: 2 methods (different learning rates) x 2 seeds, ~1 s per cell."""
    return {
        "description": "tiny test grid", "kind": "stand-in", "reproduces": "nothing (a test)", "seeds": [0, 1],
        "common": {
            "data": {"name": "synthetic", "options": {"num_clients": 3, "samples_per_client": 48, "num_classes": 4,
                                                      "size": 8}},
            "model": {"name": "small_cnn", "options": {"width": 8}},
            "train": {"rounds": 3, "local_steps": 2, "batch_size": 16, "lr": 0.05},
            "checkpoint_every": 1, "threads": 1,
        },
        "methods": {"FedAvg": {}, "FedAvg lr 0.2": {"train": {"lr": 0.2}}},
        **extra,
    }


def tiny_spec(**extra: Any) -> GridSpec:
    return parse_grid(tiny_grid_raw(**extra), "tiny")


class TickClock:
    """A clock for time limits (:class:`fedaug.report.deadline.Deadline`) that does not depend on speed: its
    readings are 1, 2, 3, ... seconds (``step``, 2 ``step``, ... in general), one more at each reading, so what a
    limit stops is fixed by the number of readings (picklable: a worker process reads its own copy)."""

    def __init__(self, step: float = 1.0) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def records_by_cell(out: Path) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Every cell's round records under the grid directory ``out`` without their wall times (``time``: no two
    runs take the same), by (setting, method, seed) directory."""
    return {p.relative_to(out).parts[:3]: [{k: v for k, v in r.items() if k != "time"} for r in read_records(p)[0]]
            for p in sorted(out.glob("*/*/seed*/*/metrics.jsonl"))}


def declared(spec: GridSpec, rounds: int | tuple[int, ...], local_epochs: int | tuple[int, ...]) -> GridSpec:
    """``spec`` stating the paper scale ``rounds`` x ``local_epochs`` (counts, or the counts of the paper's
    datasets; ``()``: "not stated"), as a grid file's ``paper_*`` keys do."""
    return replace(spec, paper=PaperScale(_counts(rounds), _counts(local_epochs), ()))


def _counts(value: int | tuple[int, ...]) -> tuple[int, ...]:
    """A count, or counts, as :class:`PaperScale` holds them: sorted."""
    return tuple(sorted(value)) if isinstance(value, tuple) else (value,)


def declared_spec(rounds: int | tuple[int, ...], local_epochs: int | tuple[int, ...], **extra: Any) -> GridSpec:
    """The tiny grid (:func:`tiny_spec`) stating the paper scale ``rounds`` x ``local_epochs``."""
    return declared(tiny_spec(**extra), rounds, local_epochs)
