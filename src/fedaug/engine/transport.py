"""Nests of tensors over a :class:`multiprocessing.connection.Connection`, for the worker processes of
:mod:`fedaug.engine.pool`: the structure pickled, each tensor's bytes sent as they lie in memory.

A tensor object sent earlier on the same :class:`Channel` (same object, same version counter) is
sent again as a reference: the in-process engine sends every client of a phase the same server
tensors (the global weights), and a worker process then receives them once per phase, not once per
client. :meth:`Channel.reset` forgets what was sent (at the start of every phase, on both ends).
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import Tensor

_NEW, _SEEN = "t", "s"


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
        fresh: list[Tensor] = []
        channel = self

        class _Pickler(pickle.Pickler):
            def persistent_id(self, x: Any) -> Any:
                if not isinstance(x, Tensor):
                    return None
                seen = channel._sent.get(id(x))
                if seen is not None and seen[0] is x and seen[1] == x._version:
                    return (_SEEN, seen[2])
                if remember:
                    channel._sent[id(x)] = (x, x._version, channel._count)
                channel._count += 1
                fresh.append(x)
                return (_NEW, str(x.dtype).removeprefix("torch."), tuple(x.shape), x.numel() * x.element_size())

        buffer = io.BytesIO()
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        self.conn.send_bytes(buffer.getbuffer())
        for t in fresh:
            if t.numel():
                data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                self.conn.send_bytes(memoryview(data.numpy()))

    def recv(self) -> Any:
        """Receive what the other end sent (raises :class:`EOFError` when it has closed)."""
        header = self.conn.recv_bytes()
        pending: list[tuple[Tensor, int]] = []
        channel = self

        class _Unpickler(pickle.Unpickler):
            def persistent_load(self, pid: Any) -> Tensor:
                if pid[0] == _SEEN:
                    return channel._received[pid[1]]
                _, dtype, shape, nbytes = pid
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                channel._received.append(t)
                pending.append((t, nbytes))
                return t

        obj = _Unpickler(io.BytesIO(header)).load()
        for t, nbytes in pending:  # the bytes follow the header, in the order the tensors were pickled
            if nbytes:
                self.conn.recv_bytes_into(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        return obj
