"""The run directory's records: one writer, strict JSON, and no valid record lost to a bad line."""

from __future__ import annotations

import gc
import json
import math
import os
import warnings

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.errors import CheckpointError
from fedaug.core.serialize import save_tensors
from fedaug.engine.records.rundir import ASIDE, METRICS, RunDir, read_records
from fedaug.engine.records.runlock import LOCK
from tests.conftest import tiny_raw


def line(r: int, **extra) -> str:
    return json.dumps({"round": r, "comm": {"up_total": 10 * r}, **extra}, sort_keys=True) + "\n"


def run_with(tmp_path, text: str) -> RunDir:
    """A run directory whose metrics.jsonl holds ``text``."""
    (tmp_path / "config.toml").write_text("")
    (tmp_path / METRICS).write_text(text)
    return RunDir(tmp_path)


def aside(run: RunDir) -> list[dict]:
    return [json.loads(x) for x in (run.path / ASIDE).read_text().splitlines()]


def test_a_corrupt_line_is_skipped_with_a_warning_and_the_records_after_it_are_kept(tmp_path):
    run = run_with(tmp_path, line(1) + line(2) + '{"round": 3, "co\n' + line(4) + "[1, 2]\n" + line(5))
    with pytest.warns(UserWarning, match=r"metrics\.jsonl': skipped line 3: not JSON; line 5: not a round record; "
                                         r"the other records are used \('fedaug resume' moves such lines to "
                                         r"metrics\.aside\.jsonl\)"):
        assert [r["round"] for r in run.rounds()] == [1, 2, 4, 5]


def test_a_torn_last_line_is_ignored_without_a_warning(tmp_path):
    run = run_with(tmp_path, line(1) + line(2) + '{"round": 3, "comm": {"up')  # killed mid-write: no newline
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["round"] for r in run.rounds()] == [1, 2]
        run.truncate_rounds(2)
    assert (tmp_path / METRICS).read_text() == line(1) + line(2)
    assert aside(run) == [{"file": METRICS, "line": 3, "reason": "torn last line", "text": '{"round": 3, "comm": {"up'}]


def test_truncate_moves_bad_lines_aside_with_their_numbers_and_keeps_every_valid_record(tmp_path):
    bad = b'{"round": 2, "comm": \xff\x00\x00}'  # what a damaged disk block looks like
    (tmp_path / "config.toml").write_text("")
    (tmp_path / METRICS).write_bytes((line(1) + line(2)).encode() + bad + b"\n" + (line(3) + line(4)).encode())
    run = RunDir(tmp_path)
    with pytest.warns(UserWarning, match=r"moved line 3: not JSON to metrics\.aside\.jsonl; the valid records around "
                                         "them are kept"):
        run.truncate_rounds(3)
    assert (tmp_path / METRICS).read_text() == line(1) + line(2) + line(3)  # round 4: after the checkpoint
    assert aside(run) == [{"file": METRICS, "line": 3, "reason": "not JSON",
                           "text": '{"round": 2, "comm": \\xff\x00\x00}'}]


def test_a_round_recorded_twice_counts_once_the_last_record_kept(tmp_path):
    run = run_with(tmp_path, line(1) + line(2, n="old") + line(3, n="old") + line(2) + line(3))
    with pytest.warns(UserWarning, match=r"skipped line 2: round 2 is recorded again at line 4; line 3: round 3 is "
                                         "recorded again at line 5"):
        records = run.rounds()
    assert records == [json.loads(line(r)) for r in (1, 2, 3)]
    assert sum(r["comm"]["up_total"] for r in records) == 60  # not inflated by the copies
    with pytest.warns(UserWarning, match="moved line 2: round 2"):
        run.truncate_rounds(3)
    assert (tmp_path / METRICS).read_text() == line(1) + line(2) + line(3)
    assert [(e["line"], json.loads(e["text"])["n"]) for e in aside(run)] == [(2, "old"), (3, "old")]


@pytest.mark.parametrize("rounds, missing", [([1, 2, 3], "4-6"), ([1, 2, 4, 6], "3, 5"), ([], "1-6")])
def test_truncate_refuses_when_a_round_the_checkpoint_covers_has_no_record(tmp_path, rounds, missing):
    text = "".join(line(r) for r in rounds) + "not json\n"
    run = run_with(tmp_path, text)
    with pytest.raises(CheckpointError, match=rf"cannot resume '{tmp_path}': its newest checkpoint is at round 6, but "
                                              rf"metrics\.jsonl has no record of round {missing}, which the finished "
                                              r"run would lack; delete .*checkpoints/ to .*or restore the missing "
                                              "records"):
        run.truncate_rounds(6)
    assert (tmp_path / METRICS).read_text() == text and not (tmp_path / ASIDE).exists()  # nothing changed


def test_records_and_summary_are_strict_json_with_null_for_non_finite_numbers(tmp_path):
    run = run_with(tmp_path, "")
    run.append_round({"round": 1, "train": {"loss": math.nan}, "eval": {"loss": math.inf}})
    run.write_summary({"final": {"loss": -math.inf}, "ok": 1.5})

    def refuse(name):
        raise ValueError(name)

    assert [json.loads(x, parse_constant=refuse) for x in (tmp_path / METRICS).read_text().splitlines()] == [
        {"round": 1, "train": {"loss": None}, "eval": {"loss": None}}]
    assert json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse) == {"final": {"loss": None},
                                                                                           "ok": 1.5}
    assert run.rounds()[0]["train"]["loss"] is None


def test_start_and_open_for_writing_hold_the_lock_readers_do_not_need_it(tmp_path):
    cfg = validate({**tiny_raw(), "out_dir": str(tmp_path)})
    run = RunDir.start(cfg)
    assert json.loads((run.path / LOCK).read_text())["pid"] == os.getpid()
    with pytest.raises(CheckpointError, match=rf"'{run.path}' is in use by pid {os.getpid()} \(this process\)"):
        RunDir.open(run.path, write=True)
    assert RunDir.open(run.path).rounds() == []  # reading needs no lock
    assert run.lock() is run  # taking it again in the holder is a no-op
    run.close()
    assert not (run.path / LOCK).exists()
    with pytest.raises(KeyError), RunDir.open(run.path, write=True) as again:  # released on exceptions too
        raise KeyError(again.path)
    assert not (run.path / LOCK).exists()


def test_a_run_dir_nobody_closes_is_released_when_dropped(tmp_path):
    """What the Flower ServerApp relies on: it keeps RunDir.start's object until its run ends."""
    path = RunDir.start(validate({**tiny_raw(), "out_dir": str(tmp_path)})).path
    gc.collect()
    RunDir.open(path, write=True).close()


def test_taking_the_lock_removes_the_temporaries_of_a_killed_writer(tmp_path):
    run = run_with(tmp_path, line(1))
    (tmp_path / "checkpoints").mkdir()
    leftovers = [tmp_path / ".summary.json.0a1b2c3d.tmp", tmp_path / "checkpoints" / ".round_000002.pt.x1y2z3w4.tmp"]
    for p in leftovers:
        p.write_bytes(b"half")
    save_tensors(tmp_path / "checkpoints" / "round_000001.pt", {"round": 1})
    with RunDir.open(tmp_path, write=True):
        assert not any(p.exists() for p in leftovers)
    assert [r for r, _ in run.checkpoints()] == [1]


def test_a_corrupt_newest_checkpoint_names_the_one_a_resume_falls_back_to(tmp_path):
    run = run_with(tmp_path, "")
    for r in (3, 6):
        save_tensors(tmp_path / "checkpoints" / f"round_00000{r}.pt", {"round": r, "w": torch.ones(2)})
    (tmp_path / "checkpoints" / "round_000006.pt").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match=r"round_000006\.pt' is corrupt or not a fedaug checkpoint \(.*\); delete "
                                              r"it and resume again to continue from the previous checkpoint, "
                                              r"round_000003\.pt$"):
        run.load_latest()
    (tmp_path / "checkpoints" / "round_000003.pt").unlink()
    with pytest.raises(CheckpointError, match=r"continue from round 1 \(it is the only checkpoint\)$"):
        run.load_latest()


def test_read_records_of_a_missing_file(tmp_path):
    assert read_records(tmp_path / METRICS) == ([], [])
