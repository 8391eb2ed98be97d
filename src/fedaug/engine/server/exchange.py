"""The server side of one phase, the same for every phase: build, count, send, validate, count.

For each client asked, the server builds a fresh message from the server state of every component
that takes part in the phase (:meth:`~fedaug.methods.component.Component.downlink`) and counts its
bytes as downlink; the fleet runs the phase wherever the client is; each reply is counted as uplink
and checked in full before anything in it is used: every part against its spec (names, shapes
known from round 1, dtypes, value ranges, finite values within the part's magnitude bound,
``trust.max_abs``) and the training metrics (finite numbers, ``loss`` and ``steps`` present). A
reply that fails, or that the fleet could not decode (:class:`Malformed`), is rejected with its
reason, and a client that errs or times out is dropped with its reason: the phase goes on with the
others (DESIGN.md invariants 3 and 5; docs/engine.md, "The trust boundary"). Folding the accepted
replies is the caller's: aggregation for training and the query, the evaluation summary for
evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedaug.core.errors import PayloadError
from fedaug.core.payload import Against, Message, Spec, message_nbytes, part_nbytes, validate_part
from fedaug.engine.protocol import Dropped, Fleet, Malformed, Rejected, Reply
from fedaug.methods.component import Component, Phase, State

#: how a phase's parts are named in rejection messages.
WHAT = {"train": "uplink", "query": "post-aggregation uplink", "evaluate": "evaluation reply"}
#: the training metrics every reply reports; at most :data:`MAX_METRICS` names in all
REQUIRED_METRICS, MAX_METRICS = ("loss", "steps"), 64


def metrics_problems(metrics: object) -> list[str]:
    """Every way a training reply's ``metrics`` fail: a dict of at most :data:`MAX_METRICS` string
    names to finite numbers, with :data:`REQUIRED_METRICS`, ``steps`` a non-negative integer."""
    if not isinstance(metrics, Mapping):
        return [f"metrics must be a dict of numbers, got {type(metrics).__name__}"]
    out = [f"metrics lack {k!r}" for k in REQUIRED_METRICS if k not in metrics]
    if len(metrics) > MAX_METRICS:
        out.append(f"metrics hold {len(metrics)} names, more than {MAX_METRICS}")
    for k, v in metrics.items():
        if not isinstance(k, str) or len(k) > 100:
            out.append(f"metric name {str(k)[:40]!r} is not a string of at most 100 characters")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            out.append(f"metric {k!r} must be a finite number, got {str(v)[:40]}")
    steps = metrics.get("steps")
    if isinstance(steps, (int, float)) and not isinstance(steps, bool) and (steps < 0 or steps != int(steps)):
        out.append(f"metric 'steps' must be a non-negative integer, got {steps}")
    return out


@dataclass
class PhaseResult:
    """One phase's outcome.

    Args:
        replies: the accepted replies, by client id.
        rejected: :meth:`Rejected.record` of each reply that failed its check.
        dropped: :meth:`Dropped.record` of each client that did not answer.
        down, up: bytes per message part (component name, or ``meters``), per direction.
        distances: with ``against_sent``, per accepted client, per part, each entry's distance to what
            the server sent (:class:`~fedaug.core.payload.Against`).
        specs: the specs the replies were checked against, by part name (what each entry is: its
            :attr:`~fedaug.core.payload.TensorSpec.kind`).
    """

    replies: dict[int, Reply] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)
    distances: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    specs: dict[str, Spec] = field(default_factory=dict)

    def comm(self) -> dict[str, Any]:
        """The phase's traffic as round records show it."""
        return {"down": self.down, "up": self.up, "down_total": sum(self.down.values()),
                "up_total": sum(self.up.values())}


def check_answer(phase: Phase, r: int, cid: int, answer: Reply | Malformed, reply_specs: Mapping[str, Spec],
                 bound: Callable[[str], float | None], measured: Mapping[str, Against],
                 up: dict[str, int]) -> Rejected | None:
    """Count an answer's bytes into ``up`` and check it in full: every part against its spec (and its bound,
    measured against what was sent where ``measured`` has it), no unexpected part, a training reply's metrics.

    Returns:
        ``None`` where it passes; else why it is refused.
    """
    where = f"round {r}: {WHAT[phase]} of client {cid}"
    if isinstance(answer, Malformed) or not isinstance(answer.message, Mapping):
        for name, nbytes in (answer.nbytes if isinstance(answer, Malformed) else {}).items():
            if name in up:
                up[name] += nbytes
        return Rejected(f"{where}: {answer.reason if isinstance(answer, Malformed) else 'its message is not a dict of parts'}")
    for name in reply_specs:
        part = answer.message.get(name, {})
        up[name] += part_nbytes(part) if isinstance(part, Mapping) else 0
    try:
        for name, spec in reply_specs.items():
            validate_part(answer.message.get(name, {}), spec, f"{where}, part '{name}'", bound(name), measured.get(name))
        extra = sorted(set(answer.message) - set(reply_specs), key=str)
        if extra:
            raise PayloadError(f"{where}: unexpected part(s) {', '.join(map(repr, extra))}")
        problems = metrics_problems(answer.metrics) if phase == "train" else []
        if problems:
            raise PayloadError(f"{where}: " + "; ".join(problems))
    except PayloadError as exc:
        return Rejected(str(exc))
    return None


def exchange(phase: Phase, r: int, lr: float, client_ids: Sequence[int], fleet: Fleet,
             senders: Sequence[Component], server: Mapping[str, State], reply_specs: Mapping[str, Spec],
             bound: Callable[[str], float | None] = lambda part: None, against_sent: bool = False) -> PhaseResult:
    """Run ``phase`` of round ``r`` on ``client_ids`` through ``fleet``.

    Args:
        phase: ``"train"``, ``"query"`` or ``"evaluate"``.
        r, lr: the round and its learning rate.
        client_ids: the clients to ask.
        fleet: reaches the clients.
        senders: the components that take part in the phase; each sends its downlink part.
        server: ``{component name: server state}``.
        reply_specs: ``{part name: spec}`` every reply must meet (a missing part is an empty one).
        bound: the largest ``|value|`` a reply's part may hold, by part name (``None``: no bound);
            :meth:`~fedaug.config.schema.TrustConfig.bound`.
        against_sent: check each reply's parts against the parts sent to that client
            (:class:`~fedaug.core.payload.Against`): entries within bounds by their distance to what was
            sent (or, for an entry with no counterpart there, by their norm) are not read again, and the
            distances (the update norms' terms) are kept in :attr:`PhaseResult.distances`; one pass over
            every upload for both.

    Returns:
        The accepted replies, the rejected and dropped clients with reasons, and the bytes.
    """
    out = PhaseResult(down={c.name: 0 for c in senders}, up={name: 0 for name in reply_specs}, specs=dict(reply_specs))

    sent: dict[int, Message] = {}
    cache: dict[object, Any] = {}

    def message(cid: int) -> Message:
        built = {c.name: c.downlink(server[c.name], cid, phase) for c in senders}
        for name, nbytes in message_nbytes(built).items():
            out.down[name] += nbytes
        if against_sent:
            sent[cid] = built
        return built

    for cid, answer in fleet.run(phase, r, lr, client_ids, message):
        if isinstance(answer, Dropped):
            out.dropped.append(answer.record(cid, phase))
            continue
        built = sent.pop(cid, {})
        measured = ({name: Against(built.get(name, {}), cache) for name in reply_specs}
                    if against_sent and isinstance(answer, Reply) else {})
        refused = check_answer(phase, r, cid, answer, reply_specs, bound, measured, out.up)
        if refused is not None:
            out.rejected.append(refused.record(cid, phase))
            continue
        out.replies[cid] = answer  # type: ignore[assignment]
        if against_sent:
            out.distances[cid] = {name: m.distances for name, m in measured.items()}
    return out
