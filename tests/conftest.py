"""Shared fixtures: a tiny synthetic config that trains in well under a second per round."""

from __future__ import annotations

from typing import Any

import pytest

from fedaug.config.schema import RunConfig, validate


def tiny_raw(**train: Any) -> dict[str, Any]:
    """A nested config dict for a 3-client synthetic run with a narrow small CNN."""
    return {
        "seed": 7,
        "data": {"name": "synthetic", "options": {"num_clients": 3, "samples_per_client": 48,
                                                   "num_classes": 4, "size": 8}},
        "model": {"name": "small_cnn", "options": {"width": 8}},
        "train": {"rounds": 3, "local_steps": 3, "batch_size": 16, "lr": 0.05, **train},
        "eval": {"every": 1},
        "checkpoint_every": 1,
    }


@pytest.fixture
def tiny_cfg(tmp_path) -> RunConfig:
    raw = tiny_raw()
    raw["out_dir"] = str(tmp_path / "runs")
    return validate(raw)
