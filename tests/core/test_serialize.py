"""Atomic writes and checked loads."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import CheckpointError
from fedaug.core.serialize import atomic_write_text, load_tensors, save_tensors


def test_round_trip(tmp_path):
    obj = {"w": torch.arange(4.0), "n": 3, "nested": {"s": "x", "l": [1, 2]}}
    save_tensors(tmp_path / "a.pt", obj)
    back = load_tensors(tmp_path / "a.pt")
    assert torch.equal(back["w"], obj["w"]) and back["nested"] == obj["nested"]


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr("fedaug.core.serialize.os.replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_corrupted_and_missing_checkpoints_raise_checkpoint_error(tmp_path):
    path = tmp_path / "c.pt"
    save_tensors(path, {"w": torch.ones(100)})
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"corrupted or truncated.*delete it"):
        load_tensors(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_tensors(tmp_path / "none.pt")
