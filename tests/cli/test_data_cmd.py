"""``fedaug data describe``: table, JSON, plot and option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedaug.cli.data_cmd import parse_options
from fedaug.cli.main import main


def test_describe_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "labels.png"
    assert main(["data", "describe", "synthetic", "num_clients=3", "samples_per_client=20", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "synthetic: classification, 10 classes" in out and "| client0 | client0 | 20 | 5 | 5 |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_describe_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "describe", "synthetic", "num_clients=2", "samples_per_client=8", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["clients"]
    assert [r["train"] for r in rows] == [8, 8] and all(sum(r["train_labels"]) == 8 for r in rows)


def test_describe_bad_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "describe", "synthetic", "num_clientz=2"]) == 2
    assert "has no option 'num_clientz' (did you mean 'num_clients'?)" in capsys.readouterr().err


def test_parse_options() -> None:
    assert parse_options(["a=1", "b=x", "c=[1, 2]", "d=0.5"]) == {"a": 1, "b": "x", "c": [1, 2], "d": 0.5}
