"""What the fleets that run clients from this process share: the per-client states kept here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from fedaug.core.payload import state_nbytes
from fedaug.engine.protocol import Reply
from fedaug.methods.component import Phase, State


class StatesHere:
    """The per-client states of a fleet whose clients run from this process (one worker here, or worker
    processes it feeds): kept here between rounds, checkpointed with the server (invariant 2)."""

    def __init__(self) -> None:
        self.client_states: dict[int, dict[str, State]] = {}

    def keep(self, client_id: int, reply: Reply) -> None:
        """Keep a training reply's new state (whatever the server makes of the upload)."""
        if reply.state:
            self.client_states[client_id] = reply.state
        else:
            self.client_states.pop(client_id, None)

    def delivered(self, phase: Phase, replies: Iterable[tuple[int, Reply]]) -> Iterator[tuple[int, Reply]]:
        """``replies`` passed on, a training phase's states kept (:meth:`keep`); if the phase breaks off,
        the fleet is closed first: a remote worker may be mid-client, and none of its answers can be
        trusted to arrive."""
        try:
            for cid, reply in replies:
                if phase == "train":
                    self.keep(cid, reply)
                yield cid, reply
        except BaseException:
            self.close()
            raise

    def state_bytes(self) -> dict[int, int]:
        return {cid: state_nbytes(st) for cid, st in self.client_states.items()}

    def checkpoint(self) -> dict[int, dict[str, State]]:
        return self.client_states

    def restore(self, states: dict[int, dict[str, State]]) -> None:
        self.client_states = states

    def close(self) -> None:
        """Release what the fleet holds beyond the states (worker processes); nothing by default."""
