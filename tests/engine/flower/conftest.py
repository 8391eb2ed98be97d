"""Fixtures of the Flower adapter's tests: tiny synthetic configs and the in-process engine's records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedaug.config.schema import RunConfig, validate
from tests.conftest import tiny_raw

METHODS = {
    "fedfa": {"augs": ["fedfa"]},
    "flea": {"augs": ["flea"]},
    "fedavg-bn-local": {"options": {"fedavg": {"bn": "local"}}},
}


def flower_cfg(out_dir: Path, method: str = "fedfa", num_clients: int = 3, **train: Any) -> RunConfig:
    """A synthetic run (2 rounds unless ``train`` says) of ``method`` (a key of :data:`METHODS`) over
    ``num_clients`` clients."""
    raw = tiny_raw(**{"rounds": 2, "local_steps": 2, **train})
    raw["data"]["options"]["num_clients"] = num_clients
    raw["method"] = METHODS[method]
    raw["out_dir"] = str(out_dir)
    raw["name"] = method
    return validate(raw)


def records(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run directory's round records without their wall-clock times."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


@pytest.fixture
def tmp_cfg(tmp_path):
    """``flower_cfg`` writing under this test's temporary directory."""
    return lambda *args, **kw: flower_cfg(tmp_path / "runs", *args, **kw)
