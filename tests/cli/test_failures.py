"""Every failure ends in one message (issue 41): a foreign checkpoint, a full disk, Ctrl-C and SIGTERM."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedaug.cli.main import main
from fedaug.core.serialize import save_tensors
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.records.runlock import LOCK
from tests.cli.test_cli import write_cfg


def one_error(err: str) -> str:
    """The single ``fedaug: error:`` line of ``err`` (a traceback or a second line fails the test)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedaug: error: "), err
    return lines[0].removeprefix("fedaug: error: ")


def finished_run(tmp_path, capsys, rounds: int = 2) -> Path:
    assert main(["run", str(write_cfg(tmp_path, rounds=rounds)), "-q"]) == 0
    return Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("run directory: "))


@pytest.mark.parametrize("foreign, why", [
    ({"weights": torch.zeros(2)}, r"its format is None, not 1"),
    ([torch.zeros(2), 3], r"it holds a list, not a dict"),
    ({"format": 1, "round": 2}, r"it lacks 'config', 'server', 'clients', 'best', 'last_eval', 'comm_total'"),
])
def test_resuming_from_a_foreign_checkpoint_exits_2_with_fedaugs_message(tmp_path, capsys, foreign, why):
    run_dir = finished_run(tmp_path, capsys)
    newest = RunDir(run_dir).checkpoints()[-1][1]
    save_tensors(newest, foreign)
    assert main(["resume", str(run_dir), "-q"]) == 2
    assert re.fullmatch(rf"checkpoint '{re.escape(str(newest))}' is not a fedaug checkpoint \({why}\); delete it and "
                        r"resume again to continue from the previous checkpoint, round_000001.pt",
                        one_error(capsys.readouterr().err))


def test_a_full_disk_exits_2_naming_the_file_and_the_run_resumes_once_there_is_space(tmp_path, capsys, monkeypatch):
    def full(path, payload):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("fedaug.engine.records.rundir.save_tensors", full)
    assert main(["run", str(write_cfg(tmp_path, rounds=2)), "-q"]) == 2
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert one_error(capsys.readouterr().err) == (
        f"cannot write '{run_dir}/checkpoints/round_000001.pt': No space left on device; the records and checkpoints "
        f"written before are intact and the run is resumable: free space on its disk, then run 'fedaug resume "
        f"{run_dir}'")
    monkeypatch.setattr("fedaug.engine.records.rundir.save_tensors", save_tensors)
    assert main(["resume", str(run_dir), "-q"]) == 0
    assert [r["round"] for r in RunDir(run_dir).rounds()] == [1, 2]


def _unshare_works() -> str | None:
    """Why a private mount namespace with a tmpfs cannot be made here (``None``: it can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -rm cannot mount a tmpfs here: {probe.stderr.strip()}"


@pytest.mark.skipif(_unshare_works() is not None, reason=str(_unshare_works()))
def test_a_real_full_disk_a_64k_tmpfs_exits_2_with_one_message_and_the_run_resumes_after_it_grows(tmp_path):
    """The run writes into a 64 kB tmpfs in a private mount namespace (a 19 kB checkpoint, kept twice, plus
    its temporary copy fill it in round 3); once the tmpfs is remounted at 16 MB the resume finishes."""
    cfg = write_cfg(tmp_path, rounds=5)
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    python = f"{sys.executable} -m fedaug"
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} && cd {disk}"
              f" && {python} run {cfg} -q out_dir={disk} 2> {out}.run.err; echo $? > {out}.run.rc"
              f"; mount -o remount,size=16m {disk}"
              f" && {python} resume {disk}/* -q > /dev/null 2> {out}.resume.err; echo $? > {out}.resume.rc"
              f"; cp -r {disk}/. {out}")
    subprocess.run(["unshare", "-rm", "sh", "-c", script], check=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    err = Path(f"{out}.run.err").read_text()
    assert Path(f"{out}.run.rc").read_text().strip() == "2", err
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    inside = f"{disk}/{run_dir.name}"
    assert re.fullmatch(rf"cannot write '{re.escape(inside)}/\S+': No space left on device; the records and "
                        rf"checkpoints written before are intact and the run is resumable: free space on its disk, "
                        rf"then run 'fedaug resume {re.escape(inside)}'", one_error(err))
    assert Path(f"{out}.resume.rc").read_text().strip() == "0", Path(f"{out}.resume.err").read_text()
    assert [r["round"] for r in RunDir(run_dir).rounds()] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("sig, rc, what", [(signal.SIGINT, 130, "interrupted"),
                                           (signal.SIGTERM, 143, r"terminated \(SIGTERM\)")])
def test_ctrl_c_and_sigterm_end_with_one_message_naming_the_run_directory(tmp_path, sig, rc, what):
    cfg = write_cfg(tmp_path, rounds=200)
    proc = subprocess.Popen([sys.executable, "-m", "fedaug", "run", str(cfg), "-q"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "runs").glob("*/checkpoints/round_000001.pt")):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert proc.returncode == rc
    saved = max(r for r, _ in RunDir(run_dir).checkpoints())
    assert re.fullmatch(rf"fedaug: {what}; round {saved} of 200 is saved \(its checkpoint\): continue from round "
                        rf"{saved + 1} with 'fedaug resume {re.escape(str(run_dir))}'", err.strip()), err
    assert not (run_dir / LOCK).exists()  # the writer lock was released
