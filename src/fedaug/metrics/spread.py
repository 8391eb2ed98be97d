"""How a metric spreads across clients: which clients lose, not only how the average does.

Fairness-style evaluation in federated learning reports, besides the mean over clients, their
standard deviation, the worst client and the mean of the worst 10 % (FL-bench; q-FFL, Li et al.,
ICLR 2020, Sec. 4 reports the worst 10 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: the share of clients whose mean is ``worst10``
WORST_SHARE = 0.1


def worst_count(num_clients: int, share: float = WORST_SHARE) -> int:
    """How many clients the worst ``share`` holds: ``ceil(share * num_clients)``, at least one.

    >>> [worst_count(n) for n in (1, 4, 10, 11, 20)]
    [1, 1, 1, 2, 2]
    """
    return max(1, math.ceil(share * num_clients - 1e-9))


def client_spread(values: Sequence[float]) -> dict[str, float | None]:
    """The spread of one metric (higher is better) over clients.

    Args:
        values: one value per client (e.g. each client's test accuracy); a NaN counts as the worst.

    Returns:
        ``{"std": population std over clients (ddof 0: the clients evaluated are the population
        the mean describes), "min": the worst client's value, "worst10": the mean of the worst
        :func:`worst_count` clients}``; every value ``None`` when ``values`` is empty, and NaN where
        a NaN value enters it.

    >>> client_spread([0.9, 0.5, 0.7, 0.8])
    {'std': 0.14790199457749043, 'min': 0.5, 'worst10': 0.5}
    """
    if not values:
        return {"std": None, "min": None, "worst10": None}
    n = len(values)
    ranked = sorted(values, key=lambda v: (not math.isnan(v), v))  # NaN first: a diverged client is the worst
    mean = sum(ranked) / n  # summed in rank order: the result does not depend on the clients' order
    std = math.sqrt(sum((v - mean) ** 2 for v in ranked) / n)
    worst = ranked[:worst_count(n)]
    return {"std": std, "min": ranked[0], "worst10": sum(worst) / len(worst)}
