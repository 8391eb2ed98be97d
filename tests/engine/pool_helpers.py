"""Components for the worker-pool tests, importable by the worker processes (which unpickle the recipe)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from fedaug.core.payload import Part
from fedaug.methods.component import ClientCtx, Component, State


class KillOnce(Component):
    """Kills the process it runs in (SIGKILL) when it trains ``client`` in round ``round``, once: the
    marker file it creates first makes a rerun (a resume) go through. Exchanges nothing."""

    name = "kill_once"
    role = "objective"

    def __init__(self, *, client: int, round: int, marker: str) -> None:
        self.client, self.round, self.marker = client, round, marker

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        if ctx.training and (ctx.client_id, ctx.round) == (self.client, self.round) and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


class RaiseIn(Component):
    """Raises a ``ValueError`` naming the client when it trains ``client``."""

    name = "raise_in"
    role = "objective"

    def __init__(self, *, client: int) -> None:
        self.client = client

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        if ctx.training and ctx.client_id == self.client:
            raise ValueError(f"client {ctx.client_id} refuses")


class UnbuildableInWorkers(Component):
    """Builds in the server process but not in a worker process (its unpickling raises)."""

    name = "unbuildable"
    role = "objective"

    def __init__(self) -> None:
        self.where = "server"  # a state to unpickle

    def __setstate__(self, state: dict) -> None:
        raise ValueError("this component cannot be built in a worker process")


class StallOnce(Component):
    """Stalls the first client it trains in round ``round`` (for up to ``seconds``), writing its id into
    ``marker`` (created once, atomically) so that a test sees the round under way and kills the node; a
    rerun (a resume) finds the marker and goes through. Exchanges nothing."""

    name = "stall_once"
    role = "objective"

    def __init__(self, *, round: int, marker: str, seconds: float = 120.0) -> None:
        self.round, self.marker, self.seconds = round, marker, seconds

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        if not ctx.training or ctx.round != self.round:
            return
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(str(ctx.client_id))
        time.sleep(self.seconds)


def exit_with_dynamo_imported() -> None:
    """Exits 1 where ``torch._dynamo`` is imported in this process, else 0: in a fork server's child, whether the
    server's preload imported it."""
    sys.exit(int("torch._dynamo" in sys.modules))
