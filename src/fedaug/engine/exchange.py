"""The server side of one phase, the same for every phase: build, count, send, validate, count.

For each client asked, the server builds a fresh message from the server state of every component
that takes part in the phase (:meth:`~fedaug.methods.component.Component.downlink`) and counts its
bytes as downlink; the fleet runs the phase wherever the client is; each reply is counted as uplink
and checked in full against the phase's uplink specs before anything in it is used. A reply that
fails is rejected with its reason, and a client that errs or times out is dropped with its reason:
the phase goes on with the others (DESIGN.md invariants 3 and 5). Folding the accepted replies is
the caller's: aggregation for training and the query, the evaluation summary for evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedaug.core.errors import PayloadError
from fedaug.core.payload import Message, Spec, message_nbytes, validate_part
from fedaug.engine.fleet import RECORD_NAME, Dropped, Fleet, Reply
from fedaug.methods.component import Component, Phase, State

#: how a phase's parts are named in rejection messages.
WHAT = {"train": "uplink", "query": "post-aggregation uplink", "evaluate": "evaluation reply"}


@dataclass
class PhaseResult:
    """One phase's outcome.

    Args:
        replies: the accepted replies, by client id.
        rejected: ``{"client", "phase", "reason"}`` of each reply that failed its check.
        dropped: :meth:`Dropped.record` of each client that did not answer.
        down, up: bytes per message part (component name, or ``meters``), per direction.
    """

    replies: dict[int, Reply] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)

    def comm(self) -> dict[str, Any]:
        """The phase's traffic as round records show it."""
        return {"down": self.down, "up": self.up, "down_total": sum(self.down.values()),
                "up_total": sum(self.up.values())}


def exchange(phase: Phase, r: int, lr: float, client_ids: Sequence[int], fleet: Fleet,
             senders: Sequence[Component], server: Mapping[str, State], reply_specs: Mapping[str, Spec]
             ) -> PhaseResult:
    """Run ``phase`` of round ``r`` on ``client_ids`` through ``fleet``.

    Args:
        phase: ``"train"``, ``"query"`` or ``"evaluate"``.
        r, lr: the round and its learning rate.
        client_ids: the clients to ask.
        fleet: reaches the clients.
        senders: the components that take part in the phase; each sends its downlink part.
        server: ``{component name: server state}``.
        reply_specs: ``{part name: spec}`` every reply must meet (a missing part is an empty one).

    Returns:
        The accepted replies, the rejected and dropped clients with reasons, and the bytes.
    """
    out = PhaseResult(down={c.name: 0 for c in senders}, up={name: 0 for name in reply_specs})

    def message(cid: int) -> Message:
        built = {c.name: c.downlink(server[c.name], cid, phase) for c in senders}
        for name, nbytes in message_nbytes(built).items():
            out.down[name] += nbytes
        return built

    for cid, answer in fleet.run(phase, r, lr, client_ids, message):
        if isinstance(answer, Dropped):
            out.dropped.append(answer.record(cid, phase))
            continue
        for name in reply_specs:
            part = answer.message.get(name, {})
            out.up[name] += message_nbytes({name: part})[name] if isinstance(part, Mapping) else 0
        try:
            for name, spec in reply_specs.items():
                validate_part(answer.message.get(name, {}), spec, f"round {r}: {WHAT[phase]} of client {cid}, part '{name}'")
        except PayloadError as exc:
            out.rejected.append({"client": cid, "phase": RECORD_NAME[phase], "reason": str(exc)})
            continue
        out.replies[cid] = answer
    return out
