"""Every recorded 2-round run replays to the same records (issue 19, Must show 1): the same structure,
integers and strings, and floats to float32 rounding (``cases.differences``; the model's trajectory is
the same on every CPU, the reported loss reductions are not bit for bit).

The records in ``records/`` were written by ``python -m tests.engine.replay.cases`` at bb05886 (main
before the phase/axis refactor of issue 19). A difference here means a change altered the numerics of an
existing method: fix it, or, if the change is intended, record it in the CHANGELOG and rewrite the records in a
commit that says so. Rewritten since, as the CHANGELOG records: ``flea`` (dCor from a Gram matrix, float
rounding) and ``vfda`` (its default ``noise_scale`` became ``"std"``; with ``"variance"`` the run replays the
bb05886 record exactly).

Four changes of the records' *structure* since then are intended and checked here, not hidden:

- evaluation is an exchange like training, so each evaluation record gains its traffic (``eval.comm``);
- each training record gains its uploads' update norms (``updates``, issue 41; per part and kind since
  issue 48), all within the screening limits: the screening rejects or clips nothing of these honest runs
  (two uploads a round: it cannot; screen.py), whose other entries stay as recorded;
- each evaluation record gains the spread across clients (``eval.spread``: std, min, worst 10 %; issue 40);
- a legacy ``base = "<local objective>"`` (``fedprox``, ``moon``, ...) is FedAvg + that objective, so the
  weights' bytes are listed under ``fedavg`` and the objective's own entry is 0 (the totals are unchanged).
"""

from __future__ import annotations

import json

import pytest

from tests.engine.replay.cases import CASES, RECORDS, as_recorded, differences, legacy_base, run_case


@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_run_replays_exactly(case):
    expected = json.loads((RECORDS / f"{case}.json").read_text())
    got = run_case(case)
    assert all("updates" in rec for rec in got)  # FedProto's prototypes too (issue 48)
    assert differences(as_recorded(got, legacy_base(case)), expected) == []


def test_differences_name_each_leaf_that_moved_beyond_rounding():
    """The comparison passes float32 rounding and nothing more (with zero tolerances, nothing): a float moved by
    1e-4, an int that became a float, a changed string and a missing key are each reported with their path."""
    expected = [{"round": 1, "loss": 1.4361262321472168, "tiny": 1e-12, "name": "fedavg", "n": 12}]
    rounding = [{"round": 1, "loss": 1.4361263910929363, "tiny": 1.5e-12, "name": "fedavg", "n": 12}]
    assert differences(rounding, expected) == []
    assert differences(rounding, expected, rel_tol=0.0, abs_tol=0.0) == [  # bit for bit: rounding is a change
        "[0]/loss: 1.4361263910929363 != 1.4361262321472168", "[0]/tiny: 1.5e-12 != 1e-12"]
    moved = [{"round": 1, "loss": 1.4361262321472168 * (1 + 1e-4), "tiny": 1e-12, "name": "fedbn", "n": 12.0}]
    assert differences(moved, expected) == [
        f"[0]/loss: {moved[0]['loss']!r} != 1.4361262321472168", "[0]/name: 'fedbn' != 'fedavg'", "[0]/n: 12.0 != 12"]
    assert differences([{"round": 1}], expected) == [
        "[0]: keys ['round'] != ['loss', 'n', 'name', 'round', 'tiny']"]
    assert differences(expected * 2, expected) == ["/: 2 items != 1"]
