"""The run directory's writer lock: one holder, refusals that name it, nothing stale ever blocks."""

from __future__ import annotations

import errno
import gc
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from fedaug.core.errors import CheckpointError
from fedaug.engine.records.runlock import LOCK, RunLock

#: a process that takes the lock on argv[1], says so, then waits for a line on stdin (or kills itself)
HOLDER = textwrap.dedent("""
    import os, signal, sys
    from fedaug.engine.records.runlock import RunLock
    lock = RunLock.acquire(sys.argv[1])
    print("locked", flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()
""")


def holder(directory: str | os.PathLike[str], how: str) -> subprocess.Popen:
    """Start a :data:`HOLDER` process on ``directory`` and wait until it holds the lock (and, with
    ``how="kill"``, is about to die holding it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), how], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == "locked\n", proc.stderr.read()
    return proc


def test_a_second_lock_is_refused_naming_the_holder_until_the_first_is_released(tmp_path):
    first = RunLock.acquire(tmp_path)
    record = json.loads((tmp_path / LOCK).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["started"]
    with pytest.raises(CheckpointError, match=rf"run directory '{tmp_path}' is in use by pid {os.getpid()} \(this "
                                              rf"process\) on host .*, since .*; only one process may write a run "
                                              rf"directory: wait for that one to finish, or stop it \(kill "
                                              rf"{os.getpid()}\) and then run 'fedaug resume {tmp_path}' again"):
        RunLock.acquire(tmp_path)
    first.release()
    assert not (tmp_path / LOCK).exists() and not first.held
    first.release()  # idempotent
    RunLock.acquire(tmp_path).release()


def test_another_live_process_holding_the_lock_is_named(tmp_path):
    proc = holder(tmp_path, "wait")
    try:
        with pytest.raises(CheckpointError, match=rf"in use by pid {proc.pid} on host {socket.gethostname()}, "
                                                  rf"since .*kill {proc.pid}\)"):
            RunLock.acquire(tmp_path)
    finally:
        proc.communicate("\n", timeout=60)  # it exits normally: interpreter exit releases the lock
    assert proc.returncode == 0 and not (tmp_path / LOCK).exists()
    RunLock.acquire(tmp_path).release()


def test_the_lock_of_a_killed_process_is_taken_over_with_a_warning(tmp_path):
    proc = holder(tmp_path, "kill")
    proc.wait(timeout=60)
    assert proc.returncode == -9 and json.loads((tmp_path / LOCK).read_text())["pid"] == proc.pid  # left behind
    with pytest.warns(UserWarning, match=rf"was locked by pid {proc.pid} on host .*, which ended without releasing "
                                         r"it \(killed\?\); taking the lock over"):
        lock = RunLock.acquire(tmp_path)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()


def test_releasing_untouched_leaves_the_lock_file_as_it_was_found(tmp_path):
    lock = RunLock.acquire(tmp_path)  # none was there: none is left
    lock.release_untouched()
    assert not (tmp_path / LOCK).exists() and not lock.held
    stale = b'{"pid": 4242, "host": "gone", "started": "then"}\n'  # a killed writer's record
    (tmp_path / LOCK).write_bytes(stale)
    with pytest.warns(UserWarning, match="was locked by pid 4242 on host gone"):
        lock = RunLock.acquire(tmp_path)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release_untouched()
    assert (tmp_path / LOCK).read_bytes() == stale and not lock.held


def test_a_collected_lock_is_released(tmp_path):
    lock = RunLock.acquire(tmp_path)
    del lock
    gc.collect()
    assert not (tmp_path / LOCK).exists()
    RunLock.acquire(tmp_path).release()


def test_a_filesystem_without_locks_only_warns(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr("fedaug.engine.records.runlock.fcntl.flock", no_locks)
    with pytest.warns(UserWarning, match=rf"run directory '{tmp_path}' cannot be locked \(.*No locks available\); "
                                         "make sure no other process writes to it"):
        lock = RunLock.acquire(tmp_path)
    lock.release()
