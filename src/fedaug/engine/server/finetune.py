"""The server's side of personalised evaluation (``eval.finetune_steps = k``, :mod:`fedaug.engine.client.finetune`):
the evaluation message carries, beside the evaluation parts, every training component's *training*
downlink under ``finetune/<name>`` (:func:`finetune_senders`), so that fine-tuning receives exactly what a
training round would (the global weights, FedFA's statistics, FLea's buffer, SCAFFOLD's controls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedaug.core.payload import Part
from fedaug.engine.protocol import FINETUNE_PREFIX
from fedaug.methods.component import Component, Phase, State
from fedaug.methods.recipe import Recipe


@dataclasses.dataclass(frozen=True)
class TrainingSender:
    """A component as a sender of its *training* downlink in the evaluation phase, under the name
    ``finetune/<name>`` (what :func:`~fedaug.engine.server.exchange.exchange` needs of a sender)."""

    component: Component

    @property
    def name(self) -> str:
        return FINETUNE_PREFIX + self.component.name

    def downlink(self, server: State, client_id: int, phase: Phase = "evaluate") -> Part:
        return self.component.downlink(server, client_id, "train")


def finetune_senders(recipe: Recipe, server: Mapping[str, State]) -> tuple[list[Any], dict[str, State]]:
    """The extra senders of a fine-tuning evaluation and the server states they read.

    Returns:
        ``(senders, states)``: one :class:`TrainingSender` per training participant, and
        ``{"finetune/<name>": server[name]}``.
    """
    senders = [TrainingSender(c) for c in recipe.participants("train")]
    return senders, {s.name: server[s.component.name] for s in senders}
