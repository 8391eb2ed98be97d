"""How the server reaches the clients: the :class:`Fleet` interface and the record of a drop-out.

The server side of a round (:mod:`fedaug.engine.server`) never trains a client itself; it hands each
phase to a fleet, which runs the clients wherever they are and yields one answer per client. The
in-process engine's fleet trains them on a worker model in this process; the Flower adapter's
fleet sends Flower messages to SuperNodes. A client that errs or does not answer in time is a
:class:`Dropped`; the round goes on with the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fedaug.core.payload import Message, Part
from fedaug.engine.local import ClientResult
from fedaug.methods.component import State
from fedaug.metrics.tasks import Meter

Phase = Literal["train", "after_aggregate", "evaluate"]


@dataclass(frozen=True)
class Dropped:
    """A client that did not answer a phase.

    Args:
        reason: ``"error"`` (it answered with an error) or ``"timeout"`` (no answer in time).
        detail: the error's text, or what the server waited for.
    """

    reason: Literal["error", "timeout"]
    detail: str

    def record(self, client_id: int, phase: Phase) -> dict[str, Any]:
        """The entry of the round record's ``dropped`` list."""
        return {"client": client_id, "phase": phase, "reason": self.reason, "detail": self.detail}


class Fleet(Protocol):
    """The clients, as the server reaches them. Each method yields ``(client id, answer)`` pairs,
    one per client asked, in any order; an answer is the phase's result or a :class:`Dropped`."""

    def train(self, r: int, lr: float, client_ids: Sequence[int],
              downlink: Callable[[int], Message]) -> Iterable[tuple[int, ClientResult | Dropped]]:
        """Train ``client_ids`` in round ``r``; ``downlink(cid)`` builds a client's message (call it
        once per client, when the message is needed). A result's ``state`` is the client's new
        per-client state where the fleet keeps it in this process, else empty."""
        ...

    def query(self, r: int, client_ids: Sequence[int],
              downlink: Callable[[int], Part]) -> Iterable[tuple[int, Mapping[str, object] | Dropped]]:
        """The post-aggregation query: send each client the base's new part (``downlink(cid)``);
        an answer maps each querying component's name to the part the client returned."""
        ...

    def evaluate(self, r: int, server: Mapping[str, State]) -> Iterable[tuple[int, Mapping[str, Meter] | Dropped]]:
        """Evaluate the global model (``server``, the server state) on every client."""
        ...

    def state_bytes(self) -> dict[int, int]:
        """Bytes of each client's per-client state, for the clients that hold one."""
        ...

    def checkpoint(self) -> dict[int, dict[str, State]]:
        """The per-client states this process holds (empty where they live with the clients)."""
        ...

    def restore(self, states: dict[int, dict[str, State]]) -> None:
        """Continue from :meth:`checkpoint`'s output."""
        ...
