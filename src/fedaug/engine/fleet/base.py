"""What the fleets that run clients from this process share: the per-client states kept here."""

from __future__ import annotations

from fedaug.core.payload import state_nbytes
from fedaug.engine.protocol import Reply
from fedaug.methods.component import State


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

    def state_bytes(self) -> dict[int, int]:
        return {cid: state_nbytes(st) for cid, st in self.client_states.items()}

    def checkpoint(self) -> dict[int, dict[str, State]]:
        return self.client_states

    def restore(self, states: dict[int, dict[str, State]]) -> None:
        self.client_states = states

    def close(self) -> None:
        """Release what the fleet holds beyond the states (worker processes); nothing by default."""
