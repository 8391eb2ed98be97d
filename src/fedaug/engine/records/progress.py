"""A one-line-per-round progress display: round, elapsed time, ETA and the latest metric."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """Prints ``round r/R  elapsed  ETA  metric`` to ``stream`` after every round (nothing if quiet).

    Args:
        total: number of rounds of the whole run.
        start: the last round already done (resumed runs).
        quiet: print nothing.
    """

    def __init__(self, total: int, start: int = 0, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.total, self.start, self.quiet = total, start, quiet
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()

    def update(self, round: int, metric: str) -> None:
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.t0
        done = round - self.start
        eta = elapsed / done * (self.total - round) if done else 0.0
        self.stream.write(
            f"round {round:>{len(str(self.total))}}/{self.total}  elapsed {_clock(elapsed)}  "
            f"eta {_clock(eta)}  {metric}\n"
        )
        self.stream.flush()
