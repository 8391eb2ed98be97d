"""One writer per run directory: an exclusive ``flock`` on ``<run dir>/lock`` (issue 21).

Why ``flock`` and not a pid file created with ``O_EXCL``: the kernel drops a ``flock`` when its
holder dies, however it dies (SIGKILL, the OOM killer, a power cut ends every holder), so a lock
left by a dead process can never block a run, and no guess is needed about whether a recorded pid
is still the writer (pids are reused; a pid on another host cannot be checked at all). The lock
is per open file description, so it also excludes a second writer in the same process. Linux
supports it on local filesystems and on NFS (emulated with POSIX locks, shared between clients).

The file holds the holder's pid, host and start time (JSON), for the refusal message and for
operators; the holder deletes it on release. A file that is still there when the lock is free was
left by a writer that was killed: it is taken over with a warning naming that writer. A holder that
changed nothing (a refused resume) releases with :meth:`RunLock.release_untouched`, which leaves
the file as it found it: none, or the killed writer's record.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

from fedaug.core.errors import CheckpointError

LOCK = "lock"


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a releasing holder unlinks it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_bytes(fd: int) -> bytes:
    """The whole lock file open as ``fd``."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder record in the lock file (``{}`` when empty or unreadable)."""
    try:
        holder = json.loads(_read_bytes(fd))
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if "pid" not in holder:
        return "another process"
    this = " (this process)" if holder["pid"] == os.getpid() and holder.get("host") == socket.gethostname() else ""
    return f"pid {holder['pid']}{this} on host {holder.get('host', '?')}, since {holder.get('started', '?')}"


def _release(path: Path, fd: int, owner: int) -> None:
    """Delete the lock file (when it is still ours and this is the process that took it), then
    close ``fd``, which drops the lock."""
    try:
        if os.getpid() == owner and _same_file(fd, path):
            path.unlink()
    finally:
        os.close(fd)


class RunLock:
    """The exclusive writer lock of one run directory; see the module docstring.

    Take it with :meth:`acquire`; it is released by :meth:`release`, when the object is garbage
    collected, at interpreter exit, and by the kernel when the process ends in any other way.

    >>> import tempfile
    >>> lock = RunLock.acquire(tempfile.mkdtemp())
    >>> lock.release()
    """

    def __init__(self, path: Path, fd: int, found: bytes | None = None) -> None:
        self.path = path
        self._fd, self._found = fd, found
        self._finalizer = weakref.finalize(self, _release, path, fd, os.getpid())

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str]) -> "RunLock":
        """Lock ``directory`` for this process, without waiting.

        Raises:
            CheckpointError: another process (or another lock in this one) holds it; the message
                names the holder's pid and host and says what to do.
        """
        directory = Path(directory)
        path = directory / LOCK
        while True:
            try:
                fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), True
            except FileExistsError:
                try:
                    fd, created = os.open(path, os.O_RDWR), False
                except FileNotFoundError:
                    continue  # its holder released (and deleted) it in between: create it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise CheckpointError(
                    f"run directory '{directory}' is in use by {_describe(holder)}; only one process may write a "
                    f"run directory: wait for that one to finish, or stop it (kill {holder.get('pid', '<its pid>')}) "
                    f"and then run 'fedaug resume {directory}' again") from None
            except OSError as exc:  # a filesystem without locks (some FUSE mounts): warn, do not stop the run
                warnings.warn(f"run directory '{directory}' cannot be locked ({exc}); make sure no other process "
                              "writes to it", stacklevel=2)
                break
            if _same_file(fd, path):
                break
            os.close(fd)  # the holder released (and deleted) it while we opened it: take the new file
        found = None if created else _read_bytes(fd)
        previous = _read_holder(fd)
        if previous:
            warnings.warn(f"run directory '{directory}' was locked by {_describe(previous)}, which ended without "
                          "releasing it (killed?); taking the lock over", stacklevel=2)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        return cls(path, fd, found)

    @property
    def held(self) -> bool:
        """Whether this lock is still held (not yet released)."""
        return self._finalizer.alive

    def release(self) -> None:
        """Release the lock and delete its file (idempotent)."""
        self._finalizer()

    def release_untouched(self) -> None:
        """Release the lock and leave its file as :meth:`acquire` found it: none, or the record of the
        killed writer it took over, byte for byte (a refused resume changes nothing in the directory)."""
        if self._found is None or not self.held:
            self.release()
            return
        self._finalizer.detach()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, self._found, 0)
        finally:
            os.close(self._fd)
