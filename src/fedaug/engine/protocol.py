"""How the server reaches the clients: the :class:`Fleet` interface, a client's :class:`Reply` and
the record of a drop-out.

The server side of a round (:mod:`fedaug.engine.server.loop`) never runs a client itself; it hands each
phase (train, query, evaluate: :data:`~fedaug.methods.component.PHASES`) to a fleet, which runs the
clients wherever they are and yields one answer per client. The in-process engine's fleet runs
them on a worker model in this process; the Flower adapter's fleet sends Flower messages to
SuperNodes. A client that errs or does not answer in time is a :class:`Dropped`; the round goes on
with the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from fedaug.core.payload import Message, Part
from fedaug.methods.component import Phase, State
from fedaug.metrics.tasks import Meter

#: the name of the engine's own part of an evaluation reply: the client's meters (never a component's name).
METERS = "meters"
#: the splits every client evaluates, in the order of an evaluation reply's meters part
EVAL_SPLITS = ("val", "test")
#: the key prefix of the fine-tuned model's meters in an evaluation reply (``eval.finetune_steps``)
FINETUNED = "finetuned."
#: the prefix of a training downlink part inside an evaluation message (``eval.finetune_steps``)
FINETUNE_PREFIX = "finetune/"
#: how a phase is named in round records (the query keeps the name of its record entry).
RECORD_NAME: dict[Phase, str] = {"train": "train", "query": "after_aggregate", "evaluate": "evaluate"}


@dataclass(frozen=True)
class Reply:
    """What a client answers in one phase.

    Args:
        message: ``{component name: part}`` (train, query), or ``{METERS: part}`` (evaluate).
        metrics: training metrics (train only): loss, steps and each loss term.
        state: the client's new per-client state, where the fleet keeps it in this process (train
            only; else empty).
    """

    message: Message
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, State] = field(default_factory=dict)


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
        return {"client": client_id, "phase": RECORD_NAME[phase], "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class Rejected:
    """A client's answer the server refused (a part that failed its check, an update over the screen's limit).

    Args:
        reason: why, naming the round, the client and the part.
    """

    reason: str

    def record(self, client_id: int, phase: Phase) -> dict[str, Any]:
        """The entry of the round record's ``rejected`` list."""
        return {"client": client_id, "phase": RECORD_NAME[phase], "reason": self.reason}


@dataclass(frozen=True)
class Malformed:
    """A client's answer that could not be read as a :class:`Reply` (a Flower reply without its
    records, a value of the wrong type): the exchange rejects it with ``reason``, counting as uplink
    the bytes ``nbytes`` of each message part it carried (as far as they could be read)."""

    reason: str
    nbytes: dict[str, int] = field(default_factory=dict)


#: what a fleet yields for one client in one phase
Answer = Reply | Dropped | Malformed


class Fleet(Protocol):
    """The clients, as the server reaches them."""

    def run(self, phase: Phase, r: int, lr: float, client_ids: Sequence[int],
            message: Callable[[int], Message]) -> Iterable[tuple[int, Answer]]:
        """Run ``phase`` of round ``r`` on ``client_ids``; ``message(cid)`` builds a client's message
        (call it once per client, when it is needed). Yields ``(client id, answer)`` pairs, one per
        client asked, in any order."""
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


def meters_part(meters: Mapping[str, Meter]) -> Part:
    """``{"<split>.<count>": tensor}`` from each split's :meth:`Meter.state`: floats as float64 and
    integers as int64 0-d tensors, tensors as they are (exact round trip, :func:`meters_of`)."""
    out = {}
    for split, meter in meters.items():
        for key, value in meter.state().items():
            if isinstance(value, torch.Tensor):
                out[f"{split}.{key}"] = value
            else:
                out[f"{split}.{key}"] = torch.tensor(value, dtype=torch.int64 if isinstance(value, int) else torch.float64)
    return out
