"""A refused resume changes nothing (issue 61): ``fedaug resume`` and ``fedaug compare`` resuming a cell check the
lock, config, checkpoint, records, device, data and model before they touch the run directory, which keeps every
file byte for byte (and no file more or less) whichever of them refuses."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedaug.cli.main import main
from fedaug.config.load import dump_toml, read_toml
from fedaug.core.runtime import torch_threads
from fedaug.core.errors import CheckpointError, ConfigError, DataError
from fedaug.engine.records.rundir import CONFIG, METRICS, RunDir
from fedaug.engine.run import resume_experiment
from fedaug.report.runner import Cell, run_cell
from tests.conftest import DEFAULT_THREADS
from tests.data.image_folders import write_image_folder
from tests.engine.test_resume import interrupted
from tests.engine.test_runlock import holder


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Iterator[Path]:
    """The image folder the runs read (its images cached in the module's own cache)."""
    tmp = tmp_path_factory.mktemp("resume_refused")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDAUG_CACHE", str(tmp / "cache"))
        yield write_image_folder(tmp / "my images", per_class=6)


@pytest.fixture(scope="module")
def saved(images, tmp_path_factory) -> Path:
    """A 3-round image-folder run as a kill after round 2 leaves it, with a damaged record line (which a resume
    that goes ahead moves to metrics.aside.jsonl)."""
    raw = {"seed": 7, "data": {"name": "image_folder", "options": {"root": str(images), "size": 12}},
           "model": {"name": "small_cnn", "options": {"width": 8}},
           "train": {"rounds": 3, "local_steps": 2, "batch_size": 8, "lr": 0.05}}
    with torch_threads(DEFAULT_THREADS):  # as every test starts (a module fixture comes before that)
        _, part = interrupted(tmp_path_factory.mktemp("saved"), raw, 2)
    lines = (part / METRICS).read_text().splitlines(keepends=True)
    (part / METRICS).write_text(lines[0] + "\x00 damaged\n" + "".join(lines[1:]))
    return part


@pytest.fixture
def run(saved, tmp_path) -> Path:
    """A fresh copy of :func:`saved` for one test to damage."""
    return Path(shutil.copytree(saved, tmp_path / saved.name))


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (``None``) under ``directory``, by relative path."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}


def edit_config(run: Path, edit: Callable[[dict], None]) -> None:
    raw = read_toml(run / CONFIG)
    edit(raw)
    (run / CONFIG).write_text(dump_toml(raw))


def drop_record_of_round_1(run: Path) -> None:
    lines = (run / METRICS).read_text().splitlines(keepends=True)
    (run / METRICS).write_text("".join(lines[1:]))


#: (what is wrong, how the copy is damaged, resume_experiment's keywords, the error, its message)
REFUSALS = [
    ("corrupt newest checkpoint", lambda run: (run / "checkpoints" / "round_000002.pt").write_bytes(b"garbage"), {},
     CheckpointError, r"round_000002\.pt' is corrupt or not a fedaug checkpoint .*; delete it and resume again"),
    ("no checkpoint of --from-round", lambda run: None, {"from_round": 5},
     CheckpointError, r"has no checkpoint of round 5 \(.*rounds with one: 1, 2\)"),
    ("config.toml invalid", lambda run: edit_config(run, lambda raw: raw["train"].update(rounds=0)), {},
     ConfigError, r"'train\.rounds' must be >= 1, got 0"),
    ("config.toml of another experiment", lambda run: edit_config(run, lambda raw: raw["train"].update(lr=0.5)), {},
     CheckpointError, r"the checkpoint was written by a different config \(train\.lr: 0\.05 -> 0\.5\); resume with"),
    ("a model that cannot be built", lambda run: edit_config(run, lambda raw: raw["model"].update(name="no_such")),
     {}, ConfigError, r"unknown model 'no_such'"),
    ("records lack a round the checkpoint covers", drop_record_of_round_1, {},
     CheckpointError, r"metrics\.jsonl has no record of round 1"),
    ("a device this machine lacks", lambda run: None, {"device": "cuda:99"},
     ConfigError, r"device 'cuda:99' is not available on this machine"),
]


@pytest.mark.parametrize("damage, kwargs, error, match", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_refused_resume_leaves_the_run_directory_byte_for_byte(run, damage, kwargs, error, match):
    damage(run)
    before = snapshot(run)
    with pytest.raises(error, match=match):
        resume_experiment(str(run), quiet=True, **kwargs)
    assert snapshot(run) == before


@contextmanager
def moved_away(folder: Path) -> Iterator[None]:
    """``folder`` is not where a run recorded it, inside the block."""
    away = folder.with_name(f"{folder.name} (moved)")
    folder.rename(away)
    try:
        yield
    finally:
        away.rename(folder)


def test_a_missing_data_root_is_refused_by_the_cli_before_anything_changes(run, images, capsys):
    before = snapshot(run)
    with moved_away(images):
        assert main(["resume", str(run), "-q"]) == 2
    assert f"image_folder: no such directory (set the root option) under '{images}'" in capsys.readouterr().err
    assert snapshot(run) == before
    with pytest.warns(UserWarning, match=r"moved line 2: not JSON to metrics\.aside\.jsonl"):
        resume_experiment(str(run), quiet=True)  # the data back: the same directory resumes
    assert [r["round"] for r in RunDir(run).rounds()] == [1, 2, 3]


def test_a_run_another_process_writes_is_refused_before_anything_changes(run):
    with RunDir.open(run, write=True):  # a run or resume still going: its lock file is part of the directory now
        before = snapshot(run)
        with pytest.raises(CheckpointError, match=r"is in use by pid \d+ \(this process\)"):
            resume_experiment(str(run), quiet=True)
        assert snapshot(run) == before


def test_a_killed_writers_lock_and_temporaries_stay_when_the_resume_is_refused(run, images):
    proc = holder(run, "kill")  # a writer killed holding the lock: its lock file stays, naming it
    proc.wait(timeout=60)
    (run / f".{METRICS}.0f1e2d3c.tmp").write_bytes(b"half a record")  # and its unfinished writes
    (run / "checkpoints" / ".round_000003.pt.0a1b2c3d.tmp").write_bytes(b"half a checkpoint")
    before = snapshot(run)
    with moved_away(images), pytest.warns(UserWarning, match=rf"was locked by pid {proc.pid} .*taking the lock over"), \
            pytest.raises(DataError, match=r"image_folder: no such directory"):
        resume_experiment(str(run), quiet=True)
    assert snapshot(run) == before and json.loads((run / "lock").read_text())["pid"] == proc.pid


def test_compare_resuming_a_cell_whose_data_is_gone_fails_the_cell_and_leaves_its_run(run, images):
    cell = Cell("default", "FedAvg", 7, run.parent, read_toml(run / CONFIG))  # the cell of the run's grid
    before = snapshot(run)
    with moved_away(images):
        outcome = run_cell(cell)
    assert outcome.status == "failed" and "image_folder: no such directory" in outcome.error
    assert snapshot(run) == before
