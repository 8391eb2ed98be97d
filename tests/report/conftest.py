"""A tiny grid (2 methods x 2 seeds on synthetic data); tests/conftest.py holds it finished (``tiny_grid``)."""

from __future__ import annotations

from typing import Any

from fedaug.report.grid import GridSpec, parse_grid


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
