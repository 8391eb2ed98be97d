"""Nests of tensors between the server process and a worker process (:mod:`fedaug.engine.fleet.processes`): the
structure pickled over a :class:`multiprocessing.connection.Connection`, the tensors' bytes through
a shared-memory arena (a file in ``/dev/shm``, mapped by both processes).

Each end writes the tensors it sends into its own arena (one copy) and the other end copies them out
(one copy): a pipe would take a copy into the kernel, one out, and a system call per 64 KiB. An
arena is reused for every message; the exchange is strictly request and reply, so an arena is never
written again before the other end has read it. A larger arena, when one is needed, is announced
in the message that first uses it; the receiver maps it and removes its name at once (both mappings
stay valid), so nothing is left in ``/dev/shm`` once both ends have seen it.

A tensor object sent earlier on the same :class:`Channel` (same object, same version counter) is
sent again as a reference: the in-process engine sends every client of a phase the same server
tensors (the global weights), and a worker process then receives them once per phase, not once per
client. :meth:`Channel.reset` forgets what was sent (at the start of every phase, on both ends).
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import uuid
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

_NEW, _SEEN = "t", "s"
#: tensors start at multiples of this many bytes in an arena (any dtype's alignment)
ALIGN = 64
#: the smallest arena (bytes); a larger one doubles at least
MIN_ARENA = 1 << 20
#: an arena's file name: the prefix, the pid of the process that wrote it, a random part
ARENA_PREFIX = "fedaug-arena-"
#: where arenas live: shared memory where the system has it
ARENA_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class Channel:
    """One end of a connection between the server process and a worker process.

    Args:
        conn: the connection (a pipe end).
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._sent: dict[int, tuple[Tensor, int, int]] = {}  # id -> (tensor kept alive, version, index)
        self._count = 0  # tensors sent since the last reset
        self._received: list[Tensor] = []
        self._out: Tensor | None = None  # the arena this end writes
        self._in: Tensor | None = None  # the other end's arena, mapped here
        self._created: list[Path] = []  # arena files this end made that the other end may not have removed yet
        self._cleanup = weakref.finalize(self, _unlink, self._created)

    def close(self) -> None:
        """Close the connection and remove what this end left in ``/dev/shm`` (idempotent)."""
        self.conn.close()
        self._cleanup()

    def reset(self) -> None:
        """Forget every tensor sent and received so far (both ends call it at the same point)."""
        self._sent.clear()
        self._count = 0
        self._received.clear()

    def send(self, obj: Any, remember: bool = True) -> None:
        """Send ``obj`` (any picklable nest; its tensors on any device arrive on the CPU).

        Args:
            remember: keep its tensors (alive, until :meth:`reset`) to send them again as references;
                ``False`` for what is sent once (a worker's replies): only their bytes travel.
        """
        body = io.BytesIO()
        pickler = _Pickler(body, self, remember)
        pickler.dump(obj)
        fresh, end = pickler.fresh, pickler.end
        arena = None
        if self._out is None or self._out.numel() < end:
            if end:
                arena = self._new_arena(max(end, MIN_ARENA, 2 * (0 if self._out is None else self._out.numel())))
        out = self._out
        for t, offset in fresh:
            if t.numel():
                n = t.numel() * t.element_size()
                out[offset:offset + n].view(t.dtype).view(t.shape).copy_(t.detach())  # type: ignore[index]
        self.conn.send_bytes(pickle.dumps((arena, body.getvalue()), protocol=pickle.HIGHEST_PROTOCOL))

    def _new_arena(self, size: int) -> tuple[str, int]:
        path = ARENA_DIR / f"{ARENA_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        self._out = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        self._created.append(path)
        if len(self._created) > 1:  # the older ones were announced, so mapped and removed by the other end
            _unlink(self._created[:-1])
            del self._created[:-1]
        return str(path), size

    def recv(self) -> Any:
        """Receive what the other end sent (raises :class:`EOFError` when it has closed)."""
        arena, body = pickle.loads(self.conn.recv_bytes())
        if arena is not None:
            path, size = arena
            self._in = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            _unlink([Path(path)])
        return _Unpickler(io.BytesIO(body), self).load()


class _Pickler(pickle.Pickler):
    """Pickles a nest with its tensors left out: each new one gets an offset in the sender's arena
    (:attr:`fresh`, up to :attr:`end` bytes), each one sent before unchanged a reference."""

    def __init__(self, file: io.BytesIO, channel: Channel, remember: bool) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.channel, self.remember = channel, remember
        self.fresh: list[tuple[Tensor, int]] = []
        self.end = 0

    def persistent_id(self, x: Any) -> Any:
        if not isinstance(x, Tensor):
            return None
        ch = self.channel
        seen = ch._sent.get(id(x))
        if seen is not None and seen[0] is x and seen[1] == x._version:
            return (_SEEN, seen[2])
        if self.remember:
            ch._sent[id(x)] = (x, x._version, ch._count)
        ch._count += 1
        offset, nbytes = self.end, x.numel() * x.element_size()
        self.end += -(-nbytes // ALIGN) * ALIGN
        self.fresh.append((x, offset))
        return (_NEW, str(x.dtype).removeprefix("torch."), tuple(x.shape), offset)


class _Unpickler(pickle.Unpickler):
    """Unpickles what :class:`_Pickler` wrote, copying each new tensor out of the sender's arena."""

    def __init__(self, file: io.BytesIO, channel: Channel) -> None:
        super().__init__(file)
        self.channel = channel

    def persistent_load(self, pid: Any) -> Tensor:
        ch = self.channel
        if pid[0] == _SEEN:
            return ch._received[pid[1]]
        _, dtype, shape, offset = pid
        t = torch.empty(shape, dtype=getattr(torch, dtype))
        if t.numel():
            n = t.numel() * t.element_size()
            t.copy_(ch._in[offset:offset + n].view(t.dtype).view(t.shape))  # type: ignore[index]
        ch._received.append(t)
        return t


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue


def remove_arenas(pid: int) -> None:
    """Remove the arena files process ``pid`` made (after it died: it cannot remove them itself)."""
    _unlink(list(ARENA_DIR.glob(f"{ARENA_PREFIX}{pid}-*")))
