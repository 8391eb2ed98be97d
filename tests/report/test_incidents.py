"""The per-round table of rejections, drop-outs, attacks and kept aggregates (issue 20): golden rows
from hand-written records, and the table in a real run's reports."""

from __future__ import annotations

from fedaug.cli.run_cmd import finish
from fedaug.config.schema import validate
from fedaug.engine.run import run_experiment
from fedaug.report.document import to_markdown
from fedaug.report.incidents import incidents_table, run_incidents
from fedaug.report.page import write_report
from tests.conftest import tiny_raw


def rec(r: int, **extra) -> dict:
    return {"round": r, "rejected": [], "dropped": [], **extra}


NAN = {"client": 1, "phase": "train",
       "reason": "round 2: uplink of client 1, part 'fedavg': 'w' holds 4 non-finite value(s) (NaN or inf)"}
ATTACK = {"kind": "nan", "clients": [1]}


def test_only_rounds_with_incidents_get_rows_and_equal_consecutive_rounds_share_one():
    records = [rec(1), rec(2, rejected=[NAN], attack=ATTACK), rec(3, rejected=[{**NAN, "reason": "round 3" + NAN["reason"][7:]}],
                                                                 attack=ATTACK),
               rec(4, rejected=[NAN], attack=ATTACK), rec(5),
               rec(6, dropped=[{"client": 2, "phase": "train", "reason": "timeout", "detail": "waited 30 s"}],
                   aggregate=[{"phase": "train", "kept": "previous", "reason": "fedavg.weights.w holds non-finite values"}],
                   eval={"rejected": [{"client": 0, "phase": "evaluate", "reason": "round 6: bad meters"}]})]
    rows = run_incidents(records)
    assert rows == [
        {"rounds": "2-4", "attack": "nan by 1", "rejected": "1 (train): part 'fedavg': 'w' holds 4 non-finite value(s) (NaN or inf)",
         "dropped": "", "aggregate": ""},
        {"rounds": "6", "attack": "", "rejected": "0 (evaluate): bad meters", "dropped": "2 (train): timeout, waited 30 s",
         "aggregate": "train: kept previous (fedavg.weights.w holds non-finite values)"},
    ]
    md = to_markdown([incidents_table(rows, ())])
    assert md.splitlines()[0] == "| rounds | attack | rejected | dropped | aggregate |"
    assert "| 2-4 | nan by 1 |" in md and "| 6 | - |" in md


def test_long_reasons_are_cut_and_a_clean_run_has_no_rows():
    long = {**NAN, "reason": "round 1: uplink of client 1, part 'fedavg': " + "x" * 500}
    (row,) = run_incidents([rec(1, rejected=[long])])
    assert len(row["rejected"]) < 140 and row["rejected"].endswith("…")
    assert run_incidents([rec(1), rec(2, eval={})]) == []


def test_a_run_with_an_attacker_shows_the_table_in_its_reports(tmp_path):
    raw = tiny_raw(rounds=2, min_clients=2)
    raw.update(out_dir=str(tmp_path / "runs"), attack={"kind": "nan", "clients": [2]}, name="attacked")
    summary, run_dir = run_experiment(validate(raw), quiet=True)
    finish(summary, run_dir, "json")  # what 'fedaug run' writes: the run's report.md
    assert "## Rejections, drop-outs and attacks" in (run_dir.path / "report.md").read_text()
    files = write_report([run_dir.path], tmp_path / "report")
    md, html = files["markdown"].read_text(), files["html"].read_text()
    for text in (md, html):
        assert "Rejections, drop-outs and attacks" in text and "nan by 2" in text
    assert "| attacked | 7 | 1-2 | nan by 2 | 2 (train): part 'fedavg':" in md.replace("\\'", "'")
    clean = {**tiny_raw(rounds=1), "out_dir": str(tmp_path / "clean")}
    _, clean_dir = run_experiment(validate(clean), quiet=True)
    assert "Rejections" not in write_report([clean_dir.path], tmp_path / "clean-report")["markdown"].read_text()
