"""experiments/results_page.py on the tiny finished grid: the claims table and each section's verdicts."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

from fedaug.report.claims import Claim, judge
from fedaug.report.results import load_grid_results, summarize
from tests.experiments.scripts import load_script
from tests.report.conftest import tiny_spec


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
    compare = tmp_path / "compare"
    shutil.copytree(tiny_grid, compare / "tiny")
    claim = Claim("the higher learning rate is ahead", "FedAvg lr 0.2", ("FedAvg",))
    monkeypatch.setattr(page, "TABLES", [("Tiny table: a test", "tiny", False), ("Other: not run", "other", False)])
    monkeypatch.setattr(page, "CLAIMS", {"tiny": [claim], "other": [Claim("x", "a", ("b",))]})
    monkeypatch.setattr(page, "load_grid", lambda name: tiny_spec())
    monkeypatch.setattr("sys.argv", ["results_page.py", "--compare", str(compare), "--out", str(tmp_path / "r.md")])
    page.main()
    text = (tmp_path / "r.md").read_text()
    verdict = judge(claim, summarize(load_grid_results(compare / "tiny")))
    # the overview row and the section's sentence carry the verdict computed from the grid itself
    assert f"| Tiny table | the higher learning rate is ahead | FedAvg lr 0.2 | {verdict.verdict} (" in text
    assert "| Other | x | a | not run yet |" in text
    assert f"Verdict: {verdict.verdict}; claimed direction in " in text


def test_a_reading_is_printed_only_for_the_runs_it_was_written_against(tiny_grid, tmp_path, monkeypatch, capsys):
    page = load_script("results_page")
    compare = tmp_path / "compare"
    shutil.copytree(tiny_grid, compare / "tiny")
    monkeypatch.setattr(page, "TABLES", [("Tiny table: a test", "tiny", False)])
    monkeypatch.setattr(page, "CLAIMS", {})
    monkeypatch.setattr(page, "load_grid", lambda name: tiny_spec())
    monkeypatch.setattr("sys.argv", ["results_page.py", "--compare", str(compare), "--out", str(tmp_path / "r.md")])
    results = load_grid_results(compare / "tiny")
    pinned = page.fingerprint(results)
    assert len(pinned) == 12 and pinned == page.fingerprint(load_grid_results(compare / "tiny"))

    monkeypatch.setattr(page, "READINGS", {"tiny": (pinned, "the higher rate wins here.")})
    page.main()
    assert "Reading: the higher rate wins here." in (tmp_path / "r.md").read_text()
    assert "warning" not in capsys.readouterr().err

    # a reading written against other numbers (a rerun moved one score) is withheld, and the script says so
    monkeypatch.setattr(page, "READINGS", {"tiny": ("0123456789ab", "the higher rate wins here.")})
    page.main()
    text = (tmp_path / "r.md").read_text()
    assert "the higher rate wins here." not in text
    assert f"Reading: pending (none is written yet for these runs, fingerprint {pinned})." in text
    assert f"warning: tiny is complete but has no reading for its runs (fingerprint {pinned})" in capsys.readouterr().err


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
