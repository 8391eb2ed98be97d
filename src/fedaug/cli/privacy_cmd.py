"""``fedaug privacy epsilon|exposure|dcor|attack <run dir>``: privacy analyses of a finished run
(the command line here; the analyses, which load runs, in :mod:`fedaug.cli.privacy_runs`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any


def int_at_least(lo: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= lo``, else an error naming the allowed range."""
    def parse(text: str) -> int:
        value = int(text) if text.strip().lstrip("+-").isdigit() else None
        if value is None or value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return value

    return parse


def train_sizes(text: str) -> list[int]:
    """An argparse ``type``: comma-separated integers ``>= 1``."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1 (e.g. 10,30,100), got {text!r}")
    return sizes


#: what the commands say of a run whose method declares no differential-privacy release
NO_GUARANTEE = "no formal guarantee (no DP release)"


def guarantee(records: Sequence[dict[str, Any]], round: int) -> dict[str, Any]:
    """The run's (eps, delta) after ``round`` from its records' ``privacy`` entries (written by the
    accountant, :mod:`fedaug.privacy.accountant`): ``{"epsilon", "delta", "guarantee"}``, the two
    numbers ``None`` and the text :data:`NO_GUARANTEE` when the run declares no release."""
    entry = next((r.get("privacy") for r in records if r["round"] == round), None)
    if entry is None:
        return {"epsilon": None, "delta": None, "guarantee": NO_GUARANTEE}
    eps = math.inf if entry["epsilon"] is None else entry["epsilon"]  # JSON null: a non-finite value
    scope = "" if entry["model_protected"] else "; model weights not covered"
    return {"epsilon": eps, "delta": entry["delta"],
            "guarantee": f"({eps:.3g}, {entry['delta']:g})-DP per {entry['unit']}{scope}"}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("privacy", help="privacy analyses of a run (exposure, dCor, attacks)",
                       description="Privacy analyses of shared features (FLea, KDD 2024, Sec. 4.4) and the "
                                   "differential-privacy guarantee of a run (docs/privacy.md).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = actions.add_parser("epsilon", help="the accountant's (epsilon, delta) per round, per release and in total")
    e = actions.add_parser("exposure", help="feature exposure eps(t) per round (FLea's buffer schedule)")
    d = actions.add_parser("dcor", help="dCor(raw, features) of the global model at every kept checkpoint")
    a = actions.add_parser("attack", help="reconstruction or context-identification attack on the final model")
    for q in (g, e, d, a):
        q.add_argument("run_dir", help="a run directory written by 'fedaug run'")
        q.add_argument("--format", choices=("table", "json"), default="table")
    for q in (d, a):
        q.add_argument("--stage", help="split stage (default: the run's flea.stage, else the model's first feature stage)")
        q.add_argument("--samples", type=int_at_least(2), default=512,
                       help="samples pooled over clients, >= 2 (default 512)")
    a.add_argument("--kind", choices=("reconstruction", "context"), required=True)
    a.add_argument("--epochs", type=int_at_least(1), default=20, help="decoder epochs (reconstruction)")
    a.add_argument("--train-sizes", type=train_sizes, default="10,30,100,300",
                   help="attacker training-set sizes (context); --samples must exceed the largest")
    a.add_argument("--png", help="save originals next to reconstructions here (reconstruction)")
    for q, action in ((g, "epsilon"), (e, "exposure"), (d, "dcor_rounds"), (a, "attack")):
        q.set_defaults(func=_analysis(action))


def _analysis(name: str) -> Callable[[argparse.Namespace], int]:
    """The command that runs :mod:`fedaug.cli.privacy_runs`'s ``name`` (imported when it runs)."""
    def run(args: argparse.Namespace) -> int:
        from fedaug.cli import privacy_runs

        return getattr(privacy_runs, name)(args)

    return run
