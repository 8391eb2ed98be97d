"""Every recorded 2-round run replays to the same records, bit for bit (issue 19, Must show 1).

The records in ``records/`` were written by ``python -m tests.engine.replay.cases`` at bb05886 (main
before the phase/axis refactor of issue 19). A difference here means a change altered the numerics of an
existing method: fix it, or, if the change is intended, record it in the CHANGELOG and rewrite the records in a
commit that says so.

Two changes of the records' *structure* since then are intended and checked here, not hidden:

- evaluation is an exchange like training, so each evaluation record gains its traffic (``eval.comm``);
- a legacy ``base = "<local objective>"`` (``fedprox``, ``moon``, ...) is FedAvg + that objective, so the
  weights' bytes are listed under ``fedavg`` and the objective's own entry is 0 (the totals are unchanged).
"""

from __future__ import annotations

import json

import pytest

from fedaug.methods.recipe import METHODS
from tests.engine.replay.cases import CASES, RECORDS, run_case


def as_recorded(records: list[dict], legacy_base: str | None) -> list[dict]:
    """``records`` in the bb05886 structure: without ``eval.comm``, legacy weights under the objective."""
    for rec in records:
        comm = rec["eval"].pop("comm")
        assert comm["up_total"] > 0 and set(comm["up"]) == {"meters"}
        if legacy_base is not None:
            for direction in ("down", "up"):
                parts = rec["comm"][direction]
                assert parts[legacy_base] == 0
                parts[legacy_base] = parts.pop("fedavg")
    return records


@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_run_replays_exactly(case):
    base = CASES[case][0]
    legacy = base if METHODS.get(base).role == "objective" else None
    expected = json.loads((RECORDS / f"{case}.json").read_text())
    assert as_recorded(run_case(case), legacy) == expected
