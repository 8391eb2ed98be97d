"""Atomic writes and checked loads."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest
import torch

from fedaug.core.errors import CheckpointError
from fedaug.core.serialize import (atomic_write_json, atomic_write_text, load_tensors, remove_temporaries,
                                   save_tensors, to_json)


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


@pytest.mark.parametrize("damage", [lambda b: b[:50], lambda b: b"garbage", lambda b: b""],
                         ids=["truncated", "garbage", "empty"])
def test_corrupted_and_missing_checkpoints_raise_checkpoint_error(tmp_path, damage):
    path = tmp_path / "c.pt"
    save_tensors(path, {"w": torch.ones(100)})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError,
                       match=r"'.*c\.pt' is corrupt or not a fedaug checkpoint \(.*\); delete it$") as info:
        load_tensors(path)
    assert "weights_only" not in str(info.value)  # torch's advice (run the file's pickled code) is not ours
    with pytest.raises(CheckpointError, match="does not exist"):
        load_tensors(tmp_path / "none.pt")


class Foreign:
    """A class no fedaug checkpoint holds."""


def test_a_pickled_foreign_class_is_named_without_torchs_advice(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"w": torch.ones(2), "x": Foreign()}, path)  # what torch.save makes of a user's object
    with pytest.raises(CheckpointError, match=r"'.*c\.pt' is corrupt or not a fedaug checkpoint \(it holds a "
                                              r"tests\.core\.test_serialize\.Foreign object, which fedaug never "
                                              r"writes\); go back") as info:
        load_tensors(path, fix="go back")
    assert "weights_only" not in str(info.value)


@pytest.mark.parametrize("obj, where, kind", [
    ({"server": {"dev": torch.device("cpu")}}, r"\['server'\]\['dev'\]", "torch.device"),
    ({"s": [1, {2, 3}]}, r"\['s'\]\[1\]", "builtins.set"),
    ({1.5: torch.ones(1)}, "a key of the top level", "builtins.float"),
    (torch.float32, "the top level", "torch.dtype"),
])
def test_objects_torch_would_load_but_fedaug_never_writes_are_refused(tmp_path, obj, where, kind):
    path = tmp_path / "c.pt"
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match=rf"is not a fedaug checkpoint: {where} holds a {kind} \(.*\), and "
                                              r"fedaug checkpoints hold only dicts, lists, tensors, numbers and "
                                              r"strings; delete it"):
        load_tensors(path)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        save_tensors(tmp_path / "b.pt", {"w": torch.ones(1)})
    finally:
        os.umask(old)
    assert [stat.S_IMODE((tmp_path / n).stat().st_mode) for n in ("a.txt", "b.pt")] == [mode, mode]


def test_temporaries_a_killed_write_left_are_removed_and_nothing_else(tmp_path):
    kept = ["round_000006.pt", ".hidden", "notes.tmp", ".round_000006.pt.tmp", ".x.toolong123.tmp"]
    left = [".round_000006.pt.1a2b3c4d.tmp", ".metrics.jsonl.k_9z8y7x.tmp"]  # ours; tempfile.mkstemp's of before
    for name in kept + left:
        (tmp_path / name).write_text("x")
    assert sorted(p.name for p in remove_temporaries(tmp_path)) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert remove_temporaries(tmp_path / "missing") == []


def refuse_constant(name: str) -> float:
    raise ValueError(f"bare {name} in JSON")


def test_json_is_strict_non_finite_floats_become_null(tmp_path):
    obj = {"loss": math.nan, "up": math.inf, "down": -math.inf, "ok": 0.5, "nested": [(1, math.nan)]}
    expected = {"loss": None, "up": None, "down": None, "ok": 0.5, "nested": [[1, None]]}
    assert json.loads(to_json(obj), parse_constant=refuse_constant) == expected
    atomic_write_json(tmp_path / "s.json", obj)
    assert json.loads((tmp_path / "s.json").read_text(), parse_constant=refuse_constant) == expected
    assert obj["loss"] != obj["loss"]  # the caller's object is not changed
