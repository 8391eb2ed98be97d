"""Your own images through the command line: an image folder trains, is interrupted, resumes to the
numbers of an uninterrupted run; what an interruption and a resume say; ``data describe`` with lists."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from fedaug.cli.main import main
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.server.loop import Server
from tests.data.image_folders import write_image_folder


@pytest.fixture
def images(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path / "cache"))
    return write_image_folder(tmp_path / "my images")


def run_args(tmp_path: Path, root: Path, *extra: str) -> list[str]:
    return ["run", "data.name=image_folder", f"data.options.root={root}", "data.options.size=12",
            "model.options.width=8", "train.rounds=3", "train.local_steps=2", "train.batch_size=8", "threads=1",
            f"out_dir={tmp_path / 'runs'}", "-q", "--format", "json", *extra]


def interrupt_at(monkeypatch: pytest.MonkeyPatch, stop: int) -> None:
    """Ctrl-C at the start of round ``stop`` (as a user would press it during that round)."""
    run_round = Server.run_round

    def interrupted(self: Server, r: int) -> dict:
        if r == stop:
            raise KeyboardInterrupt
        return run_round(self, r)

    monkeypatch.setattr(Server, "run_round", interrupted)


def rounds(run_dir: str) -> list[dict]:
    return [{k: r[k] for k in ("round", "train", "eval")} for r in RunDir(run_dir).rounds()]


def test_an_image_folder_trains_through_the_cli_and_resumes_to_the_uninterrupted_numbers(tmp_path, images, capsys,
                                                                                      monkeypatch):
    assert main(run_args(tmp_path, images, "checkpoint_every=1")) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["clients"] == ["Site A", "hôpital-2"] and done["name"] == "image_folder-fedavg"
    interrupt_at(monkeypatch, 3)
    assert main(run_args(tmp_path, images, "checkpoint_every=1")) == 130
    (run_dir,) = {str(p) for p in (tmp_path / "runs").iterdir()} - {done["run_dir"]}
    assert capsys.readouterr().err.strip() == (
        f"fedaug: interrupted; round 2 of 3 is saved (its checkpoint): continue from round 3 with "
        f"'fedaug resume {run_dir}'")
    monkeypatch.undo()
    assert main(["resume", run_dir, "--format", "json"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == f"fedaug: resuming '{run_dir}' from round 2's checkpoint: rounds 3-3 to run"
    assert json.loads(out.out)["final"] == done["final"] and rounds(run_dir) == rounds(done["run_dir"])
    assert main(["resume", run_dir, "--format", "json"]) == 0  # once more: it is finished, and says so
    assert capsys.readouterr().err.splitlines()[0] == (
        f"fedaug: '{run_dir}' is finished (round 3 of 3); nothing is left to run, its results follow")


def test_an_interruption_before_the_first_checkpoint_says_that_nothing_is_saved(tmp_path, images, capsys, monkeypatch):
    interrupt_at(monkeypatch, 2)
    assert main(run_args(tmp_path, images)) == 130  # checkpoint_every = 5 (the default): no round saved yet
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert capsys.readouterr().err.strip() == (
        f"fedaug: interrupted; no round is saved yet (the first checkpoint comes after round 3, checkpoint_every=5): "
        f"'fedaug resume {run_dir}' starts the run again from round 1; set checkpoint_every=1 to save every round")
    monkeypatch.undo()
    assert main(["resume", str(run_dir), "--format", "json"]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"fedaug: resuming '{run_dir}' from round 1: no checkpoint is saved (checkpoint_every=5); rounds 1-3 to run")
    assert [r["round"] for r in RunDir(run_dir).rounds()] == [1, 2, 3]


def test_data_describe_reads_lists_as_run_does(images, capsys):
    assert main(["data", "describe", "image_folder", f"root={images}", "size=8", "sites=[hôpital-2]",
                 "classes=[dög, cat (x)]"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("image_folder: classification, 2 classes (dög, cat (x)), input (3, 8, 8), 1 clients\n")
    assert "| hôpital-2 | hôpital-2 | 14 | 2 | 4 | 7 7 |" in out
    assert main(["data", "describe", "image_folder", f"root={images}", "sites=[Site B]"]) == 2
    assert "sites: 'Site B' is not a site folder" in capsys.readouterr().err


def test_a_relative_image_root_is_recorded_absolute_so_the_run_resumes_from_any_directory(tmp_path, images, capsys,
                                                                                        monkeypatch):
    monkeypatch.chdir(images.parent)
    assert main(run_args(tmp_path, Path(images.name), "checkpoint_every=1")) == 0  # root = "my images"
    done = json.loads(capsys.readouterr().out)
    with pytest.MonkeyPatch.context() as mp:
        interrupt_at(mp, 3)
        assert main(run_args(tmp_path, Path(images.name), "checkpoint_every=1")) == 130
    (run_dir,) = {str(p) for p in (tmp_path / "runs").iterdir()} - {done["run_dir"]}
    assert tomllib.loads((Path(run_dir) / "config.toml").read_text())["data"]["options"]["root"] == str(images.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where "my images" names nothing
    capsys.readouterr()
    assert main(["resume", run_dir, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["final"] == done["final"] and rounds(run_dir) == rounds(done["run_dir"])
