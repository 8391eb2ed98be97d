"""Every recorded 2-round run replays to the same records, bit for bit (issue 19, Must show 1).

The records in ``records/`` were written by ``python -m tests.engine.replay.cases`` at bb05886 (main
before the phase/axis refactor of issue 19). A difference here means a change altered the numerics of an
existing method: fix it, or, if the change is intended, record it in the CHANGELOG and rewrite the records in a
commit that says so. Rewritten since, as the CHANGELOG records: ``flea`` (dCor from a Gram matrix, float
rounding) and ``vfda`` (its default ``noise_scale`` became ``"std"``; with ``"variance"`` the run replays the
bb05886 record exactly).

Two changes of the records' *structure* since then are intended and checked here, not hidden:

- evaluation is an exchange like training, so each evaluation record gains its traffic (``eval.comm``);
- a legacy ``base = "<local objective>"`` (``fedprox``, ``moon``, ...) is FedAvg + that objective, so the
  weights' bytes are listed under ``fedavg`` and the objective's own entry is 0 (the totals are unchanged).
"""

from __future__ import annotations

import json

import pytest

from tests.engine.replay.cases import CASES, RECORDS, as_recorded, legacy_base, run_case


@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_run_replays_exactly(case):
    expected = json.loads((RECORDS / f"{case}.json").read_text())
    assert as_recorded(run_case(case), legacy_base(case)) == expected
