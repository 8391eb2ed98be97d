"""The notice of evaluation at chance while the training loss falls (engine/server/notices.py, issue 61 item 3):
the rule on hand-made records, the BatchNorm momentum it quotes, and a run that gives it once, in its
warning, its records, its summary and its report, resumed or not."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from torch import nn

from fedaug.cli.main import main
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.server.notices import BATCHNORM_LAG, ChanceWatch, running_stats_momentum
from fedaug.models import build_model
from tests.cli.test_own_data import interrupt_at

DOCS = Path(__file__).resolve().parents[2] / "docs" / "data.md"
HEADING = "Few steps per round: BatchNorm's running statistics"


def record(r: int, acc: float | None, loss: float | None, steps: tuple[int, ...] = (2, 2, 2),
           evaluated: bool = True) -> dict:
    """A round record with what the watch reads (as the server builds it, or metrics.jsonl holds it)."""
    rec = {"round": r, "train": {"loss": loss, "clients": {str(k): {"loss": loss, "steps": s}
                                                           for k, s in enumerate(steps)}}}
    if evaluated:
        rec["eval"] = {"mean": {"test_acc": acc}}
    return rec


#: the image-folder run of docs/data.md: 3 classes, 2 steps a round, at chance from round 2
TEXTURES = [record(1, 0.4321, 0.793), record(2, 1 / 3, 0.374), record(3, 1 / 3, 0.194), record(4, 1 / 3, 0.152),
            record(5, 1 / 3, 0.117)]


def test_the_notice_comes_once_at_the_third_evaluation_at_chance_with_the_steps_and_the_share_left():
    watch = ChanceWatch(3, 0.1)
    notices = [watch.observe(rec) for rec in TEXTURES]
    assert [n is not None for n in notices] == [False, False, False, True, False]
    notice = notices[3]
    assert notice["round"] == 4 and notice["kind"] == BATCHNORM_LAG and watch.notices == [notice]
    assert watch.updates == 10 and watch.streak == 4
    text = notice["text"]
    assert text.startswith("round 4: the mean test accuracy has stayed at chance (33.33 %, 3 classes) for 3 "
                           "evaluations while the training loss fell to 0.152.")
    assert "momentum 0.1 per local step" in text and "(2 this round)" in text
    assert f"After 8 such steps {100 * 0.9 ** 8:.0f} % of the initial values remain" in text  # 0.9^8 = 0.43
    assert "43 %" in text and "train.local_epochs" in text and f'(docs/data.md, "{HEADING}").' in text


def test_docs_have_the_section_the_notice_names():
    assert f"### {HEADING}\n" in DOCS.read_text()


@pytest.mark.parametrize(("records", "notice_round"), [
    # (acc, loss) per round, 3 classes: chance is 1/3, "at chance" up to 1/3 + 0.02; the loss must be < ln(3)/2 = 0.549
    ([(0.35, 0.5), (1 / 3 + 0.02, 0.5), (0.2, 0.5)], 3),             # 1/3 + 0.02 counts as chance
    ([(0.36, 0.5), (0.3, 0.5), (0.3, 0.5)], None),                   # 1/3 + 0.027 does not: two in a row only
    ([(0.3, 0.5), (0.9, 0.5), (0.3, 0.5), (0.3, 0.5)], None),        # a good evaluation starts the count again
    ([(0.3, 0.6), (0.3, 0.6), (0.3, 0.6), (0.3, 0.54)], 4),          # at chance, but the loss is not low until round 4
    ([(0.3, 0.5), (0.3, 0.5), (0.3, math.nan)], None),               # a NaN loss (no upload) is not a low loss
    ([(0.3, 0.5), (0.3, 0.5), (0.3, None)], None),                   # ... nor null, as metrics.jsonl writes it
    ([(0.3, 0.5), (None, 0.5), (0.3, 0.5), (0.3, 0.5)], None),       # no accepted evaluation is not chance
])
def test_the_rule(records, notice_round):
    watch = ChanceWatch(3, 0.1)
    given = [rec["round"] for rec in (record(r, a, loss) for r, (a, loss) in enumerate(records, 1))
             if watch.observe(rec)]
    assert given == ([notice_round] if notice_round else [])


def test_rounds_without_an_evaluation_count_their_steps_but_not_towards_the_streak():
    watch = ChanceWatch(3, 0.1)
    recs = [record(1, 0.3, 0.5, steps=(1, 3)), record(2, None, 0.5, steps=(4,), evaluated=False),
            record(3, 0.3, 0.5, steps=(2, 2)), record(4, None, 0.5, steps=(), evaluated=False),
            record(5, 0.3, 0.4, steps=(1, 2))]
    assert [watch.observe(rec) is not None for rec in recs] == [False, False, False, False, True]
    assert watch.updates == 2 + 4 + 2 + 1.5  # the mean steps of each round's trained clients; none in round 4
    assert "(1.5 this round)" in watch.notices[0]["text"] and "After 9.5 such steps" in watch.notices[0]["text"]


def test_replay_gives_the_state_the_records_gave_and_shows_nothing():
    straight = ChanceWatch(3, 0.1)
    for rec in TEXTURES:
        straight.observe(rec)
    resumed = ChanceWatch(3, 0.1, streak=7, updates=99.0)  # whatever it held: replay starts again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.replay(TEXTURES[:4])
    assert resumed.notices == straight.notices and resumed.updates == 8
    assert resumed.observe(TEXTURES[4]) is None and resumed == straight


class _Net(nn.Module):
    def __init__(self, *norms: nn.Module) -> None:
        super().__init__()
        self.norms = nn.ModuleList(norms)


@pytest.mark.parametrize(("model", "momentum"), [
    (build_model("small_cnn", 3, 3, width=8), 0.1),
    (build_model("mlp", 1, 3), None),                                               # no BatchNorm
    (_Net(nn.BatchNorm2d(4, momentum=0.3), nn.BatchNorm1d(4, momentum=0.05)), 0.05),  # the slowest
    (_Net(nn.BatchNorm2d(4, momentum=None)), None),                                  # a cumulative average
    (_Net(nn.BatchNorm2d(4, track_running_stats=False), nn.GroupNorm(2, 4)), None),  # no running statistics
])
def test_running_stats_momentum(model, momentum):
    assert running_stats_momentum(model) == momentum
    assert (ChanceWatch.of("acc", 3, model) is None) == (momentum is None)
    assert ChanceWatch.of("dice", 3, model) is None  # segmentation: no chance level to sit at


# --- a run: 3 synthetic classes whose inputs are small, one local step a round (docs/data.md's trap, in ~1 s) --


def run_args(tmp_path: Path, rounds: int, *extra: str) -> list[str]:
    return ["run", "data.name=synthetic", "data.options.num_clients=3", "data.options.samples_per_client=32",
            "data.options.num_classes=3", "data.options.size=8", "data.options.noise=0.1", "model.options.width=8",
            f"train.rounds={rounds}", "train.local_steps=1", "train.batch_size=16", "train.lr=0.2", "seed=0",
            "threads=1", "checkpoint_every=1", f"out_dir={tmp_path / 'runs'}", "-q", "--format", "json", *extra]


def noticed(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "stayed at chance" in str(w.message)]


def comparable(run_dir: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in RunDir(run_dir).rounds()]


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[dict, list[str]]:
    """The run of 7 rounds uninterrupted: its summary and the notices it showed."""
    tmp = tmp_path_factory.mktemp("full")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(run_args(tmp, 7)) == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return json.loads((run_dir / "summary.json").read_text()), noticed(caught)


def test_a_run_at_chance_with_a_falling_loss_says_so_once_in_its_output_records_summary_and_report(full):
    summary, shown = full
    records = RunDir(summary["run_dir"]).rounds()
    # the trap itself: every evaluation at chance, the loss below ln(3)/2 = 0.549 from round 5 on
    assert all(r["eval"]["mean"]["test_acc"] <= 1 / 3 + 0.02 for r in records[:5])
    assert records[3]["train"]["loss"] > math.log(3) / 2 > records[4]["train"]["loss"]
    assert [r["round"] for r in records if "notice" in r] == [5]
    notice = records[4]["notice"]
    assert shown == [notice["text"]] and summary["notices"] == [notice]
    assert "(1 this round)" in notice["text"] and f"After 5 such steps {100 * 0.9 ** 5:.0f} %" in notice["text"]
    report = (Path(summary["run_dir"]) / "report.md").read_text()
    assert report.count("## Notice (round 5)") == 1 and "After 5 such steps 59 %" in report


@pytest.mark.parametrize("stop", [4, 7])
def test_a_resumed_run_gives_the_notice_where_and_as_often_as_the_uninterrupted_one(tmp_path, monkeypatch, full,
                                                                                   stop):
    """Interrupted before the notice's round (4), the resumed process shows it; after it (7), it shows nothing
    again; the records and the summary's notices equal the uninterrupted run's either way."""
    summary, _ = full
    interrupt_at(monkeypatch, stop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(run_args(tmp_path, 7)) == 130
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert len(noticed(caught)) == (1 if stop > 5 else 0)
    monkeypatch.undo()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["resume", str(run_dir), "-q", "--format", "json"]) == 0
    assert noticed(caught) == ([] if stop > 5 else [summary["notices"][0]["text"]])
    assert comparable(str(run_dir)) == comparable(summary["run_dir"])
    assert json.loads((run_dir / "summary.json").read_text())["notices"] == summary["notices"]
