"""experiments/results_page.py on the tiny finished grid: the claims table, each section's verdicts and the
scale each verdict states."""

from __future__ import annotations

import difflib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_rel

from fedaug.core.errors import ConfigError
from fedaug.report.claims import Claim, judge
from fedaug.report.document import md_text
from fedaug.report.grid import PaperScale, slug
from fedaug.report.paper_scale import at_scale
from fedaug.report.results import load_grid_results, summarize
from fedaug.report.runner import run_grid
from tests.experiments.scripts import load_script
from tests.report.conftest import tiny_spec

#: the tiny grid as a page section: declared against a paper that trained 400 rounds x 1 local epoch
PAPER = {"paper_rounds": 400, "paper_local_epochs": 1, "paper_datasets": ["office_caltech10"]}


def tiny_page(page, tiny_grid, tmp_path, monkeypatch, claims, tables=(("Tiny table: a test", "tiny", False),),
              paper=PAPER):
    """Point the page at a copy of the tiny grid (as grid "tiny", declaring ``paper``) and return the compare dir."""
    compare = tmp_path / "compare"
    shutil.copytree(tiny_grid, compare / "tiny")
    monkeypatch.setattr(page, "TABLES", list(tables))
    monkeypatch.setattr(page, "CLAIMS", claims)
    monkeypatch.setattr(page, "load_grid", lambda name: tiny_spec(**paper))
    monkeypatch.setattr("sys.argv", ["results_page.py", "--compare", str(compare), "--out", str(tmp_path / "r.md")])
    return compare


def test_every_shipped_claim_names_methods_and_settings_of_its_grid():
    page = load_script("results_page")
    from fedaug.report.grid import load_grid

    assert set(page.CLAIMS) <= {grid for _, grid, _ in page.TABLES}
    for grid, claims in page.CLAIMS.items():
        spec = load_grid(grid)
        for claim in claims:
            assert {claim.method, *claim.against} <= set(spec.methods), (grid, claim)
            assert set(claim.settings) <= set(spec.settings), (grid, claim)


def test_the_page_judges_each_claim_of_a_finished_grid(tiny_grid, tmp_path, monkeypatch):
    page = load_script("results_page")
    claim = Claim("the higher learning rate is ahead", "FedAvg lr 0.2", ("FedAvg",))
    compare = tiny_page(page, tiny_grid, tmp_path, monkeypatch, {"tiny": [claim], "other": [Claim("x", "a", ("b",))]},
                        [("Tiny table: a test", "tiny", False), ("Other: not run", "other", False)])
    page.main()
    text = (tmp_path / "r.md").read_text()
    verdict = judge(claim, summarize(load_grid_results(compare / "tiny")))
    # the overview row and the section's sentence carry the verdict computed from the grid itself, with its
    # seeds (2 finished per cell), the runs' 3 rounds of 2 local steps against the paper's 400 x 1, and the data
    assert (f"| Tiny table | the higher learning rate is ahead | FedAvg lr 0.2 | 2 | 3 x 2 steps (400 x 1) | stand-in "
            f"| {verdict.verdict} (") in text
    assert "| table | claim | method | seeds | rounds x local epochs (paper's) | data | verdict |" in text
    assert "| Other | x | a | - | - (400 x 1) | - | not run yet |" in text
    assert f"Verdict: {verdict.verdict}; claimed direction in " in text
    assert "one shipped comparison grid (`fedaug list grids`; docs/compare\\_and\\_report.md) on the shared" in text
    assert "one torch thread per run), 2 seeds per cell." in text


def test_a_claim_is_judged_on_the_seeds_its_cells_share_and_waits_below_two(tiny_grid, tmp_path, monkeypatch):
    """A grid with a missing cell: a claim whose cells still share 2 seeds is judged on them; one that
    shares fewer waits as "partial grid" and shows how many it shares."""
    page = load_script("results_page")
    claim = Claim("the higher learning rate is ahead", "FedAvg lr 0.2", ("FedAvg",))
    compare = tiny_page(page, tiny_grid, tmp_path, monkeypatch, {"tiny": [claim]})
    shutil.rmtree(compare / "tiny" / "default" / "fedavg" / "seed1")
    found = page.read_grid(compare / "tiny", "tiny")
    (verdict,) = found.verdicts
    assert found.summary["missing"] and verdict.seeds == (0,) and not found.judged(verdict) and not found.settled
    page.main()
    text = (tmp_path / "r.md").read_text()
    assert "| Tiny table | the higher learning rate is ahead | FedAvg lr 0.2 | 1 | 3 x 2 steps (400 x 1) | stand-in " \
           "| partial grid |" in text
    assert "Verdict:" not in text and "Reading:" not in text
    # the same claim on a grid whose missing cell it does not compare: judged, on 2 seeds
    monkeypatch.setattr(page, "CLAIMS", {"tiny": [Claim("x", "FedAvg lr 0.2", ("FedAvg lr 0.2",))]})
    found = page.read_grid(compare / "tiny", "tiny")
    assert found.verdicts[0].seeds == (0, 1) and found.judged(found.verdicts[0]) and found.settled


def test_a_reading_is_printed_only_for_the_runs_it_was_written_against(tiny_grid, tmp_path, monkeypatch, capsys):
    page = load_script("results_page")
    compare = tiny_page(page, tiny_grid, tmp_path, monkeypatch, {})
    results = load_grid_results(compare / "tiny")
    pinned = page.fingerprint(results)
    assert len(pinned) == 12 and pinned == page.fingerprint(load_grid_results(compare / "tiny"))

    # the generated scale sentence comes first (a grid without claims: its cells' seeds), then the written reading
    scale = ("Reading: Judged on 2 seeds per cell at 3 x 2 steps (rounds x local epochs) against the paper's 400 x 1, "
             "on stand-in data; this grid runs neither the paper's 400 x 1 training nor its datasets.")
    monkeypatch.setattr(page, "READINGS", {"tiny": (pinned, "the higher rate wins here.")})
    page.main()
    assert f"{scale} the higher rate wins here." in (tmp_path / "r.md").read_text()
    assert "warning" not in capsys.readouterr().err

    # a reading written against other numbers (a rerun moved one score) is withheld, and the script says so
    monkeypatch.setattr(page, "READINGS", {"tiny": ("0123456789ab", "the higher rate wins here.")})
    page.main()
    text = (tmp_path / "r.md").read_text()
    assert "the higher rate wins here." not in text
    assert f"{scale} Reading pending (none is written yet for these runs, fingerprint {pinned})." in text
    assert f"warning: tiny is judged but has no reading for its runs (fingerprint {pinned})" in capsys.readouterr().err


def test_the_fingerprint_changes_with_any_score(tiny_grid):
    page = load_script("results_page")
    results = load_grid_results(tiny_grid)
    run = results.runs[0]
    final = dict(run.summary["final"], eval={**run.summary["final"]["eval"], "mean": {
        **run.summary["final"]["eval"]["mean"], f"test_{run.metric}": run.score("final") + 1e-6}})
    moved = type(results)(results.meta, results.settings, results.methods, results.baseline,
                          [replace(run, summary={**run.summary, "final": final}), *results.runs[1:]])
    assert page.fingerprint(moved) != page.fingerprint(results)
    assert page.fingerprint(moved) == page.fingerprint(moved)


def test_the_page_says_where_the_runs_ran(tiny_grid):
    """Each (CPU, capability, threads) is counted; a run whose summary predates the record is counted as such."""
    page = load_script("results_page")
    results = load_grid_results(tiny_grid)
    env = results.runs[0].summary["environment"]
    here = f"{env['cpu']}, {env['cpu_capability']}, {env['threads']} thread(s)"
    assert page.machines(results) == f"{here}: {len(results.runs)} run(s)"
    old = {k: v for k, v in env.items() if k not in ("cpu", "cpu_capability", "threads")}
    cap = "AVX2" if env["cpu_capability"] != "AVX2" else "AVX512"  # a capability other than this machine's
    other = {**env, "cpu_capability": cap}
    mixed = type(results)(results.meta, results.settings, results.methods, results.baseline, [
        replace(results.runs[0], summary={**results.runs[0].summary, "environment": old}),
        replace(results.runs[1], summary={**results.runs[1].summary, "environment": other}), *results.runs[2:]])
    rest = len(results.runs) - 2
    assert rest >= 2
    ties = sorted([f"{env['cpu']}, {cap}, {env['threads']} thread(s): 1 run(s)", "CPU not recorded: 1 run(s)"])
    assert page.machines(mixed) == "; ".join([f"{here}: {rest} run(s)", *ties])  # most first, ties by name


def test_the_wall_time_says_which_cells_no_finished_invocation_timed(tiny_grid, tmp_path):
    page = load_script("results_page")
    out = tmp_path / "tiny"
    shutil.copytree(tiny_grid, out)
    results = load_grid_results(out)
    assert len(results.runs) == 4
    assert page.wall_time(out, results).startswith("no fedaug compare invocation on this grid has finished yet; ")

    log = out / page.INVOCATIONS
    entry = {"finished": "2026-11-26T10:00:00+00:00", "command": "fedaug compare tiny", "jobs": 2, "failed": False}
    log.write_text(json.dumps({**entry, "wall_s": 120.0, "cells": {"ran": 4}}) + "\n")
    assert page.wall_time(out, results).startswith("2.0 min over 1 finished invocation(s) (4 ran); ")

    # the grid stopped after three cells (the machine went away); a second invocation ran the last one
    log.write_text(json.dumps({**entry, "wall_s": 90.0, "cells": {"done before": 3, "ran": 1}}) + "\n")
    assert page.wall_time(out, results).startswith(
        "1.5 min over 1 finished invocation(s) (1 ran; the other 3 cells by invocations that left no wall time: "
        "stopped before they finished, or older than the invocation log); ")


def test_the_scale_of_a_grid_comes_from_its_runs_and_the_papers_declaration(tiny_grid):
    page = load_script("results_page")
    results = load_grid_results(tiny_grid)
    assert page.trained_scale(results) == "3 x 2 steps"  # train.local_steps = 2: steps, not epochs
    epochs = [replace(r, config={**r.config, "train": {"rounds": 30 if r.seed else 20, "local_epochs": 1}})
              for r in results.runs]
    assert page.trained_scale(replace(results, runs=epochs)) == "20 x 1, 30 x 1"
    assert page.trained_scale(replace(results, runs=[])) == "-"
    assert page.data_source(results, PaperScale((400,), (1,), ("office_caltech10",))) == "stand-in"
    assert page.data_source(results, PaperScale((), (), ("synthetic",))) == "the paper's"  # the runs' data.name
    assert page.data_source(replace(results, runs=[]), PaperScale((), (), ("synthetic",))) == "stand-in"
    same = [replace(r, config={**r.config, "train": {"rounds": 400, "local_epochs": 1}}) for r in results.runs]
    assert page.paper_trained(replace(results, runs=same), PaperScale((400, 500), (1,), ()))
    assert not page.paper_trained(replace(results, runs=epochs), PaperScale((400, 500), (1,), ()))
    assert not page.paper_trained(results, PaperScale((3,), (2,), ()))  # 2 local steps are not 2 epochs


def test_every_grid_of_the_page_declares_the_papers_scale(monkeypatch):
    page = load_script("results_page")
    from fedaug.report.grid import load_grid

    for _, grid, _ in page.TABLES:
        paper = page.paper_scale(grid, load_grid(grid))
        assert paper.datasets or paper.text() == "not stated", grid  # VFDA's cardiac data have no loader
    with pytest.raises(ConfigError, match=r"grid 'tiny' declares no paper scale, which its section and claims state "
                                          r"their scale against; add paper_rounds, paper_local_epochs, paper_datasets"):
        page.paper_scale("tiny", tiny_spec())


def summary_of(**cells: dict[int, float]) -> dict:
    """A one-setting summary of cells given as {seed: final score} (what :func:`judge` reads)."""
    return {"settings": {"s": {"methods": {m: {"n": len(v), "seeds": list(v), "final": {"values": list(v.values())}}
                                           for m, v in cells.items()}}}}


def test_what_the_scale_leaves_open_is_counted_from_the_comparisons():
    page = load_script("results_page")
    base = {0: 0.60, 1: 0.62, 2: 0.58}
    clear = {0: 0.70, 1: 0.71, 2: 0.69}     # +10 points on every seed: resolved
    noisy = {0: 0.70, 1: 0.55, 2: 0.61}     # d = (+10, -7, +3) points: not resolved
    s = summary_of(A=base, B=clear, C=noisy)
    (v1, v2) = [judge(Claim("", m, ("A",)), s) for m in ("B", "C")]
    ci = ttest_rel([0.70, 0.55, 0.61], [0.60, 0.62, 0.58]).confidence_interval(0.95)
    reach = 100 * max(abs(ci.low), abs(ci.high))
    assert f"{reach:.1f}" == "23.2"  # the interval [-19.2, +23.2] reaches furthest on the positive side
    assert page.uncertainty([v1]) == "its one comparison is resolved at p < 0.05"
    assert page.uncertainty([v1, v2]) == (
        "1 of its 2 comparisons is not resolved at p < 0.05; its 95 % interval includes 0 and reaches out to 23.2 "
        "points, the largest difference, one way or the other, that these seeds cannot exclude")
    # the same comparison in two claims counts once; a comparison without common seeds has no interval
    v3 = judge(Claim("", "D", ("A",)), summary_of(A=base, D={5: 0.5}))
    assert page.uncertainty([v2, v2, v3]).startswith("none of its 2 comparisons is resolved at p < 0.05; its 95 % ")
    assert page.uncertainty([v1, v2, v3]).startswith("2 of its 3 comparisons are not resolved at p < 0.05; its 95 % ")
    assert page.uncertainty([v2, v3]).endswith(" (1 without an interval: under 2 common seeds, or equal differences)")


def test_the_scale_sentence_says_what_the_grid_leaves_out_of_the_papers_setting(tiny_grid, monkeypatch):
    page = load_script("results_page")
    monkeypatch.setattr(page, "CLAIMS", {})
    found = page.read_grid(tiny_grid, "tiny")
    head = "Judged on 2 seeds per cell at 3 x 2 steps (rounds x local epochs"
    assert page.scale_sentence(found, PaperScale((), (), ())) == (
        f"{head}; the paper's: not stated), on stand-in data; this grid does not use the paper's datasets.")
    assert page.scale_sentence(found, PaperScale((3,), (2,), ("synthetic",))) == (
        f"{head}) against the paper's 3 x 2, on the paper's data; this grid does not run the paper's 3 x 2 training.")
    epochs = replace(found.results, runs=[replace(r, config={**r.config, "train": {"rounds": 3, "local_epochs": 2}})
                                          for r in found.results.runs])
    assert page.scale_sentence(replace(found, results=epochs), PaperScale((3, 5), (2,), ("synthetic",))) == (
        "Judged on 2 seeds per cell at 3 x 2 (rounds x local epochs) against the paper's 3/5 x 2, on the paper's data.")


#: the tiny grid declared against a paper that its paper-scale variant trains in seconds: 4 rounds x 1 local epoch
SMALL_PAPER = {"paper_rounds": 4, "paper_local_epochs": 1, "paper_datasets": ["office_caltech10"]}
#: the claim the paper-scale tests judge at both scales
AHEAD = Claim("the higher learning rate is ahead", "FedAvg lr 0.2", ("FedAvg",))


@pytest.fixture(scope="module")
def paper_grid(tmp_path_factory) -> Path:
    """The tiny grid's paper-scale variant (``fedaug compare tiny --scale paper`` with seeds 0-2: 4 rounds x 1 local
    epoch), finished; read-only for tests: copy before changing it."""
    out = tmp_path_factory.mktemp("paper") / "tiny-paper-scale"
    run_grid(at_scale(tiny_spec(**SMALL_PAPER), "paper", seeds=(0, 1, 2)), out)
    return out


def finished_scores(out: Path, method: str) -> dict[int, float]:
    """seed -> final mean client test score of ``method``'s finished runs in the grid directory ``out``, read from
    their summary.json files alone."""
    scores = {}
    for summary in sorted((out / "default" / slug(method)).glob("seed*/*/summary.json")):
        record = json.loads(summary.read_text())
        scores[int(summary.parent.parent.name.removeprefix("seed"))] = \
            record["final"]["eval"]["mean"][f"test_{record['metric']}"]
    return scores


def expected_verdict(out: Path) -> tuple[str, str]:
    """:data:`AHEAD`'s verdict and its comparison in the page's words (Markdown) on the grid directory ``out``, from
    scipy on the seeds both methods finished (reproduced / reversed: p < 0.05 one way or the other)."""
    mine, theirs = finished_scores(out, AHEAD.method), finished_scores(out, "FedAvg")
    seeds = sorted(mine.keys() & theirs.keys())
    a, b = np.array([mine[s] for s in seeds]), np.array([theirs[s] for s in seeds])
    test = ttest_rel(a, b)
    ci = test.confidence_interval(0.95)
    diff = (a - b).mean()
    verdict = ("reproduced" if diff > 0 and test.pvalue < 0.05 else "reversed" if test.pvalue < 0.05
               else "not reproduced")
    words = md_text(f"{100 * diff:+.1f} vs FedAvg (95 % CI [{100 * ci.low:+.1f}, {100 * ci.high:+.1f}], p "
                    f"{test.pvalue:.3g} (n={len(seeds)}))")
    return f"{verdict} ({int(diff > 0)} of 1 comparisons in the claimed direction)", words


def only_added(before: str, after: str) -> bool:
    """Whether ``after`` is ``before`` with lines inserted, none changed or removed."""
    matcher = difflib.SequenceMatcher(a=before.splitlines(), b=after.splitlines(), autojunk=False)
    return all(tag in ("equal", "insert") for tag, *_ in matcher.get_opcodes())


def test_a_claim_judged_at_both_scales_shows_both_side_by_side(tiny_grid, paper_grid, tmp_path, monkeypatch,
                                                               capsys):
    page = load_script("results_page")
    compare = tiny_page(page, tiny_grid, tmp_path, monkeypatch, {"tiny": [AHEAD]}, paper=SMALL_PAPER)
    page.main()
    stand_in_only = (tmp_path / "r.md").read_text()
    assert "paper's scale" not in stand_in_only and "paper-scale" not in stand_in_only
    shutil.copytree(paper_grid, compare / "tiny-paper-scale")
    page.main()
    text = (tmp_path / "r.md").read_text()
    assert only_added(stand_in_only, text)  # the stand-in rows, tables, verdicts and reading stay as they were

    (small, small_words), (large, large_words) = expected_verdict(compare / "tiny"), expected_verdict(paper_grid)
    # the claim's two rows, one under the other: 2 seeds at 3 rounds of 2 local steps, 3 seeds at the paper's 4 x 1
    assert ("| Tiny table | the higher learning rate is ahead | FedAvg lr 0.2 | 2 | 3 x 2 steps (4 x 1) | stand-in "
            f"| {small} |\n| Tiny table | as above, at the paper's scale | FedAvg lr 0.2 | 3 | 4 x 1 (4 x 1) "
            f"| stand-in | {large} |\n") in text
    assert page.PAPER_NOTE.replace("_", "\\_") in text
    # the section: the stand-in verdict and reading, then the paper-scale archive's table, verdict and reading
    section = text.split("## Tiny table: a test\n", 1)[1]
    stand_in, scaled = section.split("At the paper's scale: grid `tiny-paper-scale` (`fedaug compare tiny --scale "
                                     "paper`, run in GPU pieces by `benchmarks/paper_scale_gpu.sh`, "
                                     "docs/benchmarks.md), the same cells at the paper's 4 x 1 (rounds x local "
                                     "epochs), on the same stand-in data.")
    assert f"Verdict: {small.split(' (')[0]}; claimed direction in " in stand_in and small_words in stand_in
    assert "Reading: Judged on 2 seeds at 3 x 2 steps (rounds x local epochs) against the paper's 4 x 1" in stand_in
    assert "Cells: complete." in scaled and "| FedAvg lr 0.2 |" in scaled
    assert f"Full per-client tables: `{(compare / 'tiny-paper-scale').as_posix()}/table.md`." in scaled
    assert f"Verdict at the paper's scale: {large.split(' (')[0]}; claimed direction in " in scaled
    assert large_words in scaled and "Verdict:" not in scaled
    assert ("Reading: Judged on 3 seeds at 4 x 1 (rounds x local epochs) against the paper's 4 x 1, on stand-in "
            "data; this grid does not use the paper's datasets; its one comparison is") in scaled
    assert "warning: tiny-paper-scale is judged but has no reading for its runs" in capsys.readouterr().err


def test_an_unfinished_paper_scale_archive_is_judged_on_what_finished_or_says_how_far_it_is(
        tiny_grid, paper_grid, tmp_path, monkeypatch):
    """Seed 2 stopped with a checkpoint in one cell and not started in the other: the claim is judged on seeds 0
    and 1; with seed 1 stopped too, its methods share one seed and the claim waits, saying how far its cells are."""
    page = load_script("results_page")
    compare = tiny_page(page, tiny_grid, tmp_path, monkeypatch, {"tiny": [AHEAD]}, paper=SMALL_PAPER)
    scaled = compare / "tiny-paper-scale"
    shutil.copytree(paper_grid, scaled)
    (stopped,) = (scaled / "default" / "fedavg" / "seed2").glob("*/summary.json")
    stopped.unlink()
    assert list(stopped.parent.glob("checkpoints/*"))  # the run stopped with a checkpoint, as a GPU piece leaves it
    shutil.rmtree(scaled / "default" / slug(AHEAD.method) / "seed2")
    page.main()
    text = (tmp_path / "r.md").read_text()
    verdict, words = expected_verdict(scaled)
    assert "(n=2))" in words
    row = f"| Tiny table | as above, at the paper's scale | FedAvg lr 0.2 | 2 | 4 x 1 (4 x 1) | stand-in | {verdict} |"
    assert row in text
    assert "Cells: running: 4 of 6 cells finished." in text
    assert f"Verdict at the paper's scale: {verdict.split(' (')[0]}; " in text and words in text
    assert text.count("Reading: ") == 2  # the claim is judged: the archive's reading (pending) under the stand-in's

    (seed1,) = (scaled / "default" / "fedavg" / "seed1").glob("*/summary.json")
    seed1.unlink()
    page.main()
    text = (tmp_path / "r.md").read_text()
    assert ("| Tiny table | as above, at the paper's scale | FedAvg lr 0.2 | 1 | 4 x 1 (4 x 1) | stand-in | running: "
            "3 of 6 cells finished |") in text
    assert "Cells: running: 3 of 6 cells finished." in text
    assert "Verdict at the paper's scale" not in text and text.count("Reading: ") == 1  # the stand-in's only


def test_running_counts_the_cells_the_claim_compares():
    """Of a two-setting grid with three seeds, a claim on one setting counts that setting's cells only."""
    page = load_script("results_page")
    cells = {"A": {"n": 3}, "B": {"n": 1}, "C": {"n": 0}}
    summary = {"grid": {"seeds": [0, 1, 2]}, "missing": ["..."],
               "settings": {"s": {"methods": cells}, "t": {"methods": {"A": {"n": 0}, "B": {"n": 0}, "C": {"n": 0}}}}}
    found = page.Finished(results=None, summary=summary, verdicts=[])
    assert page.running(found, Claim("", "A", ("B",), settings=("s",))) == "running: 4 of 6 cells finished"
    assert page.running(found, Claim("", "A", ("B", "C"))) == "running: 4 of 18 cells finished"


def test_a_paper_scale_directory_holding_another_grid_is_refused(tiny_grid, tmp_path, monkeypatch):
    page = load_script("results_page")
    compare = tiny_page(page, tiny_grid, tmp_path, monkeypatch, {"tiny": [AHEAD]}, paper=SMALL_PAPER)
    shutil.copytree(tiny_grid, compare / "tiny-paper-scale")  # the stand-in grid's runs, archived at the wrong name
    with pytest.raises(ConfigError, match=r"tiny-paper-scale' holds a grid whose grid\.json records no paper scale "
                                          r".*archive the output of 'fedaug compare tiny --scale paper' there"):
        page.main()
    assert not (tmp_path / "r.md").exists()
