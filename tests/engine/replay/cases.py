"""The recorded 2-round runs that the engine must replay (issue 19, Must show 1; floats to float32 rounding).

Each case is a method recipe on the tiny synthetic federation of ``tests/conftest.py``; the FFA components
run their pure-PyTorch path (option ``kernel = "off"``, stated in each case's config), whose numbers do not
depend on the CPU or on a compiler.
``python -m tests.engine.replay.cases [case ...]`` (re)writes ``records/<case>.json`` in the recorded
structure (:func:`as_recorded`): run it only at a commit whose numbers are the reference, and say so in the
commit.

What "replays" means (:func:`differences`): the structure, every integer and string exactly, every float
(accuracies move in steps of 1/12 here, far above it) to :data:`REPLAY_RTOL`. The model's trajectory is the same on every CPU, but the reported losses are
float32 reductions (a batch mean, a sum over steps) whose summation order follows the CPU's vector width and
the thread count: on an AMD EPYC with AVX-512 and on one thread, every record differs from the one written on
the 2-core CI machine by one float32 rounding of such a sum (at most 1.4e-6 relative, over all 28 cases), and
nothing else. Any change to a method's numerics moves the numbers by orders of magnitude more.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from fedaug.config.schema import validate
from fedaug.engine.run import build_simulation
from fedaug.methods.recipe import METHODS
from tests.conftest import tiny_raw

RECORDS = Path(__file__).with_name("records")
#: relative tolerance for the records' floats: 7x the largest CPU/thread-count rounding measured (1.4e-6)
REPLAY_RTOL = 1e-5
#: absolute floor for floats near zero (a loss term of 1e-12 differs by rounding in its last digits)
REPLAY_ATOL = 1e-9

#: case name -> (base, augs, options); the eleven of the issue plus the other bases and augmentations.
CASES: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "fedavg": ("fedavg", [], {}),
    "fedbn": ("fedbn", [], {}),
    "scaffold": ("scaffold", [], {}),
    "feddyn": ("feddyn", [], {}),
    "fedfa": ("fedavg", ["fedfa"], {}),
    "vfda": ("fedavg", ["vfda"], {}),
    "fedrdn": ("fedavg", ["fedrdn"], {}),
    "flea": ("fedavg", ["flea"], {}),
    "fedmix": ("fedavg", ["fedmix"], {}),
    "ccvr": ("fedavg", ["ccvr"], {"ccvr": {"num_virtual": 8, "epochs": 2}}),
    "moon": ("moon", [], {}),
    "fedprox": ("fedprox", [], {"fedprox": {"mu": 0.1}}),
    "fedprox_fedfa_fedrdn": ("fedprox", ["fedrdn", "fedfa"], {"fedprox": {"mu": 0.1}}),
    "fedavgm": ("fedavgm", [], {}),
    "fedadam": ("fedadam", [], {}),
    "fednova": ("fednova", [], {}),
    "fedsam": ("fedsam", [], {}),
    "fedlc": ("fedlc", [], {}),
    "fedrs": ("fedrs", [], {}),
    "fedntd": ("fedntd", [], {}),
    "fedproto": ("fedproto", [], {}),
    "moon_local_bn": ("moon", ["mixup"], {"moon": {"bn": "local"}}),
    "feddecorr": ("fedavg", ["feddecorr"], {}),
    "mixstyle": ("fedavg", ["mixstyle"], {}),
    "moex": ("fedavg", ["moex"], {}),
    "manifold_mixup": ("fedavg", ["manifold_mixup"], {}),
    "feddata": ("fedavg", ["feddata"], {}),
    "scaffold_fedfa": ("scaffold", ["fedfa"], {}),
}
#: the components with FFA layers, whose ``kernel`` option chooses the computation path
FFA = ("fedfa", "vfda")


def case_config(name: str):
    """The validated config of case ``name``: 2 rounds, 2 of 3 clients sampled per round, eval every round."""
    base, augs, options = CASES[name]
    options = {**options, **{c: {"kernel": "off"} for c in augs if c in FFA}}  # the records' path
    raw = tiny_raw(rounds=2, participation=0.67)
    raw["method"] = {"base": base, "augs": augs, "options": options}
    return validate(raw)


def run_case(name: str) -> list[dict[str, Any]]:
    """The case's round records (times left out), as JSON would give them back."""
    cfg = case_config(name)
    sim = build_simulation(cfg)
    records = []
    for r in range(1, cfg.train.rounds + 1):
        rec = sim.run_round(r)
        rec["eval"] = sim.evaluate()
        rec.pop("time")
        records.append(rec)
    return json.loads(json.dumps(records))


def differences(got: Any, expected: Any, path: str = "", *, rel_tol: float = REPLAY_RTOL,
                abs_tol: float = REPLAY_ATOL) -> list[str]:
    """Where ``got`` differs from the record ``expected``: ``path: got != expected`` for each leaf.

    Dicts must have the same keys and lists the same length; floats agree within ``rel_tol`` (relative) or
    ``abs_tol`` (both 0: bit for bit); every other leaf (int, str, bool, None) is equal exactly. An int
    never equals a float (``3 != 3.0``: a count that became a mean is a change).
    """
    tol = {"rel_tol": rel_tol, "abs_tol": abs_tol}
    if isinstance(expected, dict) and isinstance(got, dict):
        if got.keys() != expected.keys():
            return [f"{path or '/'}: keys {sorted(got)} != {sorted(expected)}"]
        return [d for k in expected for d in differences(got[k], expected[k], f"{path}/{k}", **tol)]
    if isinstance(expected, list) and isinstance(got, list):
        if len(got) != len(expected):
            return [f"{path or '/'}: {len(got)} items != {len(expected)}"]
        return [d for i, (g, e) in enumerate(zip(got, expected)) for d in differences(g, e, f"{path}[{i}]", **tol)]
    if type(got) is float and type(expected) is float:
        same = math.isclose(got, expected, **tol)
    else:
        same = type(got) is type(expected) and got == expected
    return [] if same else [f"{path}: {got!r} != {expected!r}"]


def legacy_base(case: str) -> str | None:
    """The case's base when it is a local objective written as a base (``fedprox``), else ``None``."""
    base = CASES[case][0]
    return base if METHODS.get(base).role == "objective" else None


def as_recorded(records: list[dict], legacy_base: str | None) -> list[dict]:
    """``records`` in the bb05886 structure: without ``eval.comm``, ``updates`` (the update norms per part
    and kind, recorded since issues 41 and 48: every one within its limit, so nothing was screened) and
    ``eval.spread`` (issue 40: the spread across clients, whose numbers tests/metrics/test_spread.py
    checks), legacy weights under the objective."""
    for rec in records:
        updates = rec.pop("updates", None)  # absent where no part has an entry the screening sizes
        assert updates is None or updates.keys() == {"norm", "median", "limit"}  # nothing clipped or undecided
        for part, kinds in (updates or {"norm": {}})["norm"].items():
            for kind, norms in kinds.items():
                limit = updates["limit"][part][kind]
                assert set(norms) == {str(c) for c in rec["sampled"]}  # two a round: the median is the larger
                assert updates["median"][part][kind] == max(norms.values())
                assert limit is None or max(norms.values()) <= limit
        assert set(rec["eval"].pop("spread")) == {"val_acc", "test_acc"}
        comm = rec["eval"].pop("comm")
        assert comm["up_total"] > 0 and set(comm["up"]) == {"meters"}
        if legacy_base is not None:
            for direction in ("down", "up"):
                parts = rec["comm"][direction]
                assert parts[legacy_base] == 0
                parts[legacy_base] = parts.pop("fedavg")
    return records


if __name__ == "__main__":
    RECORDS.mkdir(exist_ok=True)
    for case in sys.argv[1:] or CASES:
        records = as_recorded(run_case(case), legacy_base(case))
        (RECORDS / f"{case}.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        print("wrote", case)
