"""What a run directory has saved, in words: for the message of an interrupted run and for
``fedaug resume``, which say the round a resume continues from, or that none is saved and the run
starts over, or that it is finished."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Saved:
    """A run directory's state.

    Args:
        path: the run directory.
        kept: the rounds of its checkpoints, oldest first.
        rounds: the rounds the run is configured for.
        checkpoint_every: its ``checkpoint_every``.
        finished: it holds ``summary.json`` and its newest checkpoint is of the last round.
    """

    path: Path
    kept: tuple[int, ...]
    rounds: int
    checkpoint_every: int
    finished: bool

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> "Saved":
        """Read ``path`` (its ``config.toml``, checkpoints and summary); nothing is loaded or locked."""
        from fedaug.engine.records.rundir import RunDir, stored_config

        run = RunDir.open(path)
        cfg = stored_config(run.path)
        kept = tuple(r for r, _ in run.checkpoints())
        return cls(run.path, kept, cfg.train.rounds, cfg.checkpoint_every,
                   kept[-1:] == (cfg.train.rounds,) and run.read_summary() is not None)

    @property
    def round(self) -> int | None:
        """The round of the newest checkpoint (``None``: none yet)."""
        return self.kept[-1] if self.kept else None

    def interrupted(self) -> str:
        """What was saved and what ``fedaug resume`` will do, after an interruption."""
        if self.finished:
            return f"the run had finished (round {self.rounds} of {self.rounds}); its results are in '{self.path}'"
        if self.round is not None:
            return (f"round {self.round} of {self.rounds} is saved (its checkpoint): continue from round "
                    f"{self.round + 1} with 'fedaug resume {self.path}'")
        return (f"no round is saved yet (the first checkpoint comes after round "
                f"{min(self.checkpoint_every, self.rounds)}, checkpoint_every={self.checkpoint_every}): "
                f"'fedaug resume {self.path}' starts the run again from round 1; set checkpoint_every=1 to save "
                "every round")

    def resuming(self, from_round: int | None = None) -> str:
        """What a resume from the newest checkpoint (or from the one of ``from_round``) does; empty when
        ``from_round`` has no checkpoint (the resume refuses it, listing those kept)."""
        if from_round not in (None, 0, *self.kept):
            return ""
        start = self.round if from_round is None else from_round
        if from_round is None and self.finished:
            return (f"'{self.path}' is finished (round {self.rounds} of {self.rounds}); nothing is left to run, "
                    "its results follow")
        if not start:
            why = ("as asked (--from-round 0)" if from_round == 0 else
                   f"no checkpoint is saved (checkpoint_every={self.checkpoint_every})")
            return f"resuming '{self.path}' from round 1: {why}; rounds 1-{self.rounds} to run"
        return (f"resuming '{self.path}' from round {start}'s checkpoint: rounds {start + 1}-{self.rounds} to run"
                if start < self.rounds else
                f"resuming '{self.path}' from round {start}'s checkpoint, its last round: nothing is left to run")
