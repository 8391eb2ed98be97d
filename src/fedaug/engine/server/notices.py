"""A notice a run gives once, when its own records show a trap it can name: evaluation at chance while
the training loss falls, on a model whose BatchNorm layers keep running statistics (docs/data.md,
"Few steps per round: BatchNorm's running statistics").

Evaluation normalises with the running statistics, which start at mean 0 and variance 1 and move a
``momentum`` (PyTorch: 0.1) of the way to each training batch's statistics; a round moves them by one
client's local steps, however many clients train (FedAvg averages the clients' statistics). With a
few steps per round they keep much of their initial values for many rounds: the weights fit the
training batches, which normalise with their own statistics, while evaluation mis-scales every
layer's features and predicts one class. The watch reads only round records, so a resumed run
replays the records it continues (:meth:`ChanceWatch.replay`) and gives the notice where an
uninterrupted run gives it.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

#: consecutive evaluations at chance before the notice
CHANCE_EVALUATIONS = 3
#: how far above chance (1 / number of classes) the mean test accuracy may be and still count as chance
CHANCE_MARGIN = 0.02
#: the notice's ``kind`` in the round record and the summary
BATCHNORM_LAG = "batchnorm_lag"


def running_stats_momentum(model: nn.Module) -> float | None:
    """The smallest ``momentum`` of ``model``'s BatchNorm layers that keep exponential running statistics
    (the slowest to forget their initial values); ``None`` where none does (no BatchNorm, or each has
    ``track_running_stats=False`` or ``momentum=None``, a cumulative average)."""
    momenta = [m.momentum for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
               and m.track_running_stats and m.momentum is not None]
    return min(momenta) if momenta else None


@dataclass
class ChanceWatch:
    """Watches a classification run's round records and gives one notice when the mean test accuracy
    has been at chance (at most ``1 / num_classes + CHANCE_MARGIN``) for :data:`CHANCE_EVALUATIONS`
    evaluations in a row while the round's training loss is below half a uniform guess's
    (``ln(num_classes) / 2``: the model fits its training batches).

    Attributes:
        num_classes: the task's classes.
        momentum: the model's BatchNorm momentum (:func:`running_stats_momentum`).
        streak: evaluations at chance in a row so far.
        updates: the running statistics' updates so far: per round, the mean local steps of the
            clients that trained.
        notices: the notice given, if any: ``{"round", "kind", "text"}``.
    """

    num_classes: int
    momentum: float
    streak: int = 0
    updates: float = 0.0
    notices: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, metric: str, num_classes: int, model: nn.Module) -> ChanceWatch | None:
        """The watch of a run with this task ``metric`` and ``model``; ``None`` unless it classifies
        (``metric == "acc"``) with a model that keeps BatchNorm running statistics."""
        momentum = running_stats_momentum(model)
        return cls(num_classes, momentum) if metric == "acc" and momentum is not None else None

    def observe(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Take one round's record (as the server builds it, or as ``metrics.jsonl`` holds it: a loss
        or accuracy may be NaN or ``None``); return the notice the first time the condition holds."""
        steps = [c["steps"] for c in record["train"]["clients"].values()]
        if steps:
            self.updates += statistics.mean(steps)
        if "eval" not in record:
            return None
        acc = record["eval"]["mean"]["test_acc"]
        at_chance = acc is not None and acc <= 1 / self.num_classes + CHANCE_MARGIN
        self.streak = self.streak + 1 if at_chance else 0
        loss = record["train"]["loss"]
        fits = loss is not None and loss < math.log(self.num_classes) / 2  # False for NaN
        if self.notices or self.streak < CHANCE_EVALUATIONS or not fits:
            return None
        notice = {"round": record["round"], "kind": BATCHNORM_LAG,
                  "text": self._text(record["round"], acc, loss, statistics.mean(steps) if steps else 0.0)}
        self.notices.append(notice)
        return notice

    def _text(self, r: int, acc: float, loss: float, steps: float) -> str:
        left = (1 - self.momentum) ** self.updates
        return (f"round {r}: the mean test accuracy has stayed at chance ({100 * acc:.2f} %, {self.num_classes} "
                f"classes) for {self.streak} evaluations while the training loss fell to {loss:.3f}. Evaluation "
                "normalises with the BatchNorm running statistics, which start at mean 0 and variance 1 and move "
                f"by momentum {self.momentum:g} per local step; a round moves them by one client's steps "
                f"({steps:g} this round), however many clients train. After {self.updates:g} such steps "
                f"{100 * left:.0f} % of the initial values remain, so evaluation mis-scales the features that "
                "training normalised with each batch's own statistics. Give the clients more steps per round "
                "(train.local_epochs, train.local_steps or a smaller train.batch_size) or more rounds "
                "(docs/data.md, \"Few steps per round: BatchNorm's running statistics\").")

    def note(self, record: dict[str, Any]) -> None:
        """:meth:`observe` a round of this process: a notice goes into the record (``notice``) and
        is shown once (a :class:`UserWarning`)."""
        notice = self.observe(record)
        if notice is not None:
            record["notice"] = notice
            warnings.warn(notice["text"], UserWarning, stacklevel=2)

    def replay(self, records: Iterable[dict[str, Any]]) -> None:
        """Start again from ``records``, the rounds a resumed run continues: :meth:`observe` each,
        showing nothing (a notice given then was shown and recorded then)."""
        self.streak, self.updates, self.notices = 0, 0.0, []
        for record in records:
            self.observe(record)
