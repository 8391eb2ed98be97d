"""Every recorded 2-round run replays to the same records, bit for bit (issue 19, Must show 1).

The records in ``records/`` were written by ``python -m tests.engine.replay.cases`` at bb05886 (main
before the phase/axis refactor of issue 19). A difference here means a change altered the numerics of an
existing method: fix it, or, if the change is intended, record it in the CHANGELOG and rewrite the records in a
commit that says so.
"""

from __future__ import annotations

import json

import pytest

from tests.engine.replay.cases import CASES, RECORDS, run_case


@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_run_replays_exactly(case):
    expected = json.loads((RECORDS / f"{case}.json").read_text())
    assert run_case(case) == expected
