"""The comparison numbers equal the run records, computed here independently of fedaug.report."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest
from scipy import stats

from fedaug.core.errors import ConfigError
from fedaug.report.results import Run, load_results, summarize, summarize_cell
from fedaug.report.grid import KIND_MEANINGS, KINDS, load_grid
from fedaug.report.table import (about_blocks, comparison_csv, comparison_tables, overview_table, results_table,
                                 write_tables)
from fedaug.report.document import to_markdown

METHODS = ("fedavg", "fedavg-lr-0.2")
ROOT = Path(__file__).resolve().parents[2]


def records(grid, method, seed):
    """(summary, metrics.jsonl rows) of one cell, read with json only."""
    (run,) = (grid / "default" / method / f"seed{seed}").glob("*-*")
    return json.loads((run / "summary.json").read_text()), [json.loads(x) for x in (run / "metrics.jsonl").open()]


def test_summary_equals_the_records(tiny_grid):
    s = summarize(load_results([tiny_grid]))["settings"]["default"]
    assert s["metric"] == "acc" and s["clients"] == ["client0", "client1", "client2"] and s["baseline"] == "FedAvg"
    for label, method in zip(("FedAvg", "FedAvg lr 0.2"), METHODS):
        c = s["methods"][label]
        recs = [records(tiny_grid, method, seed) for seed in (0, 1)]
        finals = [r[0]["final"]["eval"]["mean"]["test_acc"] for r in recs]
        bests = [r[0]["best"]["eval"]["mean"]["test_acc"] for r in recs]
        assert c["n"] == 2 and c["seeds"] == [0, 1]
        assert c["final"]["values"] == finals and c["final"]["mean"] == pytest.approx(statistics.mean(finals))
        assert c["final"]["std"] == pytest.approx(statistics.stdev(finals))
        assert c["best"]["values"] == bests and c["best"]["std"] == pytest.approx(statistics.stdev(bests))
        for client in s["clients"]:
            per = [r[0]["final"]["eval"]["clients"][client]["test"]["acc"] for r in recs]
            assert c["clients_final"][client]["values"] == per
        totals = [r[0]["comm_total"]["down"] + r[0]["comm_total"]["up"] for r in recs]
        assert c["comm_bytes"]["total"] == pytest.approx(statistics.mean(totals)) and totals[0] > 0
        assert c["comm_bytes"]["down"] == pytest.approx(statistics.mean(sum(x["comm"]["down_total"] for x in r[1])
                                                                        for r in recs))
        curves = [[x["eval"]["mean"]["test_acc"] for x in r[1]] for r in recs]
        assert c["curve"]["rounds"] == [1, 2, 3]
        assert c["curve"]["mean"] == pytest.approx([statistics.mean(v) for v in zip(*curves)])
        assert c["curve"]["std"] == pytest.approx([statistics.stdev(v) for v in zip(*curves)])
        assert c["seconds"] == pytest.approx(statistics.mean(sum(x["time"]["train_s"] + x["time"]["eval_s"]
                                                                 for x in r[1]) for r in recs))
    base = [records(tiny_grid, "fedavg", seed)[0]["final"]["eval"]["mean"]["test_acc"] for seed in (0, 1)]
    other = s["methods"]["FedAvg lr 0.2"]["final"]["values"]
    vs = s["methods"]["FedAvg lr 0.2"]["vs_baseline"]["final"]
    assert vs["n"] == 2 and vs["diff"] == pytest.approx(statistics.mean(o - b for o, b in zip(other, base)))
    if vs["p"] is not None:
        assert vs["p"] == pytest.approx(stats.ttest_rel(other, base).pvalue)
        ci = stats.ttest_rel(other, base).confidence_interval(0.95)
        assert (vs["ci_low"], vs["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert "vs_baseline" not in s["methods"]["FedAvg"]


def test_markdown_table_shows_the_summary_numbers(tiny_grid):
    summary = summarize(load_results([tiny_grid]))
    md = to_markdown(comparison_tables(summary))
    c = summary["settings"]["default"]["methods"]["FedAvg lr 0.2"]
    f, b = c["final"], c["best"]
    vs = c["vs_baseline"]["final"]
    row = next(line for line in md.splitlines() if line.startswith("| FedAvg lr 0.2 | 2 |"))
    ci = f"\\[{100 * vs['ci_low']:+.2f}, {100 * vs['ci_high']:+.2f}\\]"  # Markdown escapes the brackets
    assert f"| {100 * f['mean']:.2f} ± {100 * f['std']:.2f} | {100 * vs['diff']:+.2f} | {ci} | {vs['text']} |" in row
    assert f"| {100 * b['mean']:.2f} ± {100 * b['std']:.2f} |" in row
    assert f"| {c['comm_bytes']['total'] / 1e6:.3f} |" in row
    assert "| FedAvg | 2 |" in md and "| baseline | - | - |" in md
    assert md.count("| method | client0 | client1 | client2 | mean over clients |") == 2


def test_csv_has_the_unrounded_numbers(tiny_grid):
    summary = summarize(load_results([tiny_grid]))
    rows = list(csv.DictReader(io.StringIO(comparison_csv(summary))))
    assert [r["method"] for r in rows] == ["FedAvg", "FedAvg lr 0.2"]
    c = summary["settings"]["default"]["methods"]["FedAvg lr 0.2"]
    assert float(rows[1]["final_mean"]) == c["final"]["mean"] and float(rows[1]["best_std"]) == c["best"]["std"]
    assert float(rows[1]["final_client1"]) == c["clients_final"]["client1"]["mean"]
    assert rows[0]["final_diff"] == "" and rows[1]["pairs"] == "2" and rows[0]["seeds"] == "0 1"
    vs = c["vs_baseline"]["best"]
    assert (float(rows[1]["best_ci_low"]), float(rows[1]["best_ci_high"])) == (vs["ci_low"], vs["ci_high"])


def test_write_tables_and_missing_cells(tiny_grid, tmp_path):
    files = write_tables(tiny_grid)
    assert json.loads(files["json"].read_text()) == json.loads(json.dumps(summarize(load_results([tiny_grid]))))
    assert "kind: stand-in" in files["markdown"].read_text().lower()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "grid.json").write_text((tiny_grid / "grid.json").read_text())
    summary = summarize(load_results([empty]))
    assert summary["settings"]["default"]["methods"]["FedAvg"] == {"n": 0}
    assert len(summary["missing"]) == 4 and summary["missing"][0] == "default | FedAvg | seed 0: not started"
    assert "| FedAvg | 0 | not run |" in to_markdown(comparison_tables(summary))


def test_loose_run_directories_group_by_config(tiny_grid, tmp_path):
    runs = sorted(tiny_grid.glob("default/*/seed*/*-*"))
    res = load_results(runs[::-1])
    assert res.methods == ["fedavg-lr-0.2", "fedavg"] and res.baseline == "fedavg-lr-0.2"
    assert [r.seed for r in res.cell_runs("default", "fedavg")] == [0, 1]
    assert load_results([tiny_grid / "default"]).methods == ["fedavg", "fedavg-lr-0.2"]  # searched for runs
    with pytest.raises(ConfigError, match=r"runs '.*' and '.*' have the same config and seed 0"):
        load_results([runs[0], runs[0]])
    with pytest.raises(ConfigError, match="is a grid directory; give it alone"):
        load_results([tiny_grid, runs[0]])
    with pytest.raises(ConfigError, match="no run directories under"):
        load_results([tmp_path])


def test_methods_that_share_a_name_are_told_apart_by_their_config(tiny_grid, tmp_path):
    for k, run in enumerate(sorted(tiny_grid.glob("default/*/seed0/*-*"))):
        shutil.copytree(run, tmp_path / f"r{k}")
        cfg = tmp_path / f"r{k}" / "config.toml"
        cfg.write_text(re.sub(r'name = ".*"', 'name = "same"', cfg.read_text()))
    assert load_results([tmp_path]).methods == ["same", "same (train.lr=0.2)"]


def test_null_in_the_records_a_non_finite_number_reads_as_nan(tiny_grid, tmp_path):
    """fedaug writes NaN/inf as null (strict JSON); the tables show nan rather than fail."""
    for seed in (0, 1):
        (run,) = tiny_grid.glob(f"default/fedavg/seed{seed}/*-*")
        shutil.copytree(run, tmp_path / f"s{seed}")
    summary = json.loads((tmp_path / "s0" / "summary.json").read_text())
    summary["final"]["eval"]["mean"]["test_acc"] = None
    summary["final"]["eval"]["clients"]["client1"]["test"]["acc"] = None
    (tmp_path / "s0" / "summary.json").write_text(json.dumps(summary))
    recs = [json.loads(x) for x in (tmp_path / "s0" / "metrics.jsonl").read_text().splitlines()]
    recs[-1]["eval"]["mean"]["test_acc"] = None
    (tmp_path / "s0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    c = summarize(load_results([tmp_path]))["settings"]["default"]["methods"]["fedavg"]
    assert math.isnan(c["final"]["values"][0]) and math.isnan(c["final"]["mean"])
    assert math.isnan(c["clients_final"]["client1"]["values"][0]) and not math.isnan(c["best"]["mean"])
    assert math.isnan(c["curve"]["mean"][-1]) and not math.isnan(c["curve"]["mean"][0])
    assert "| fedavg | 2 | nan ± nan |" in to_markdown(comparison_tables(summarize(load_results([tmp_path]))))


def test_run_table_shows_client_names_literally():
    ev = {"clients": {"site|A *x*\nB": {"test": {"acc": 0.5, "n": 10}}}, "mean": {"test_acc": 0.5},
          "pooled": {"test_acc": 0.5, "n": 10}}
    table = results_table({"metric": "acc", "final": {"round": 2, "eval": ev},
                           "best": {"round": 2, "by": "val", "eval": ev}})
    assert r"| site\|A \*x\* B | 50.00 | 50.00 | 10 |" in table.splitlines()


def test_per_client_columns_follow_client_ids_not_string_order():
    names = [f"client-{i}" for i in range(12)]
    stored = {n: {"test": {"acc": i / 100}} for i, n in sorted(enumerate(names), key=lambda t: t[1])}
    summary = {"metric": "acc", "clients": names, "final": {"eval": {"clients": stored}}}
    run = Run(path=None, setting="default", method="m", seed=0, config={}, summary=summary, rounds=[])
    scores = run.client_scores("final")
    assert list(scores) == names and scores["client-10"] == 0.10


def test_a_client_without_an_accepted_final_evaluation_scores_nan_and_the_cell_still_summarizes():
    """A run that went on with a poisoned model (issue 41: the round kept the previous state) may end
    with some clients' evaluations rejected: their score is NaN, the others' are kept."""
    names = ["a", "b"]
    def run(seed, stored):
        summary = {"metric": "acc", "clients": names, "final": {"eval": {"clients": stored, "mean": {"test_acc": 0.5}}},
                   "best": {"eval": {"clients": stored, "mean": {"test_acc": 0.5}}}}
        return Run(path=None, setting="default", method="m", seed=seed, config={}, summary=summary,
                   rounds=[{"round": 1, "comm": {"down_total": 1, "up_total": 1}, "time": {"train_s": 1.0}}])
    partial = run(0, {"b": {"test": {"acc": 0.4}}})
    assert list(partial.client_scores("final")) == names and math.isnan(partial.client_scores("final")["a"])
    cell = summarize_cell([run(1, {n: {"test": {"acc": 0.6}} for n in names}), partial], None)
    assert cell["clients_final"]["b"]["values"] == [0.6, 0.4] and math.isnan(cell["clients_final"]["a"]["mean"])


def test_overview_has_a_row_per_setting_and_a_column_per_method():
    def cell(values, diff=None, p=None, ci=(None, None)):
        c = {"n": len(values), "final": {"mean": statistics.mean(values), "std": statistics.stdev(values),
                                         "values": values}}
        if diff is not None:
            c["vs_baseline"] = {"final": {"diff": diff, "p": p, "ci_low": ci[0], "ci_high": ci[1]}}
        return c

    summary = {"grid": {"seeds": [0, 1, 2]}, "settings": {
        "Dir(0.5)": {"metric": "acc", "methods": {"FedAvg": cell([0.60, 0.62, 0.64]),
                                                  "FLea": cell([0.70, 0.71, 0.72], 0.09, 0.012345, (0.0466, 0.1334))}},
        "Dir(0.1)": {"metric": "acc", "methods": {"FedAvg": cell([0.50, 0.54]), "FLea": {"n": 0}}},
        "Qua(3)": {"metric": "acc", "methods": {"FedAvg": cell([0.4, 0.5, 0.6]), "FLea": cell([0.5, 0.6], -0.01)}},
    }}
    table = overview_table(summary)
    assert table.header == ["setting (final test acc, %)", "FedAvg", "FLea"]
    assert table.rows == [["Dir(0.5)", "62.00 ± 2.00", "71.00 ± 1.00 (+9.00 [+4.66, +13.34], p 0.0123)"],
                          ["Dir(0.1)", "52.00 ± 2.83 [n=2]", "-"],
                          ["Qua(3)", "50.00 ± 10.00", "55.00 ± 7.07 (-1.00, p n/a) [n=2]"]]


def test_spread_across_clients_equals_the_records(tiny_grid):
    """Each run's std / worst client / worst 10 % equal numpy on its clients' test accuracies; the
    comparison's columns are their mean ± std over seeds."""
    summary = summarize(load_results([tiny_grid]))
    c = summary["settings"]["default"]["methods"]["FedAvg lr 0.2"]
    per_seed = []
    for seed in (0, 1):
        summ, _ = records(tiny_grid, "fedavg-lr-0.2", seed)
        accs = [v["test"]["acc"] for v in summ["final"]["eval"]["clients"].values()]
        spread = summ["final"]["eval"]["spread"]["test_acc"]
        assert spread["std"] == pytest.approx(statistics.pstdev(accs), abs=1e-12)
        assert spread["min"] == min(accs) == spread["worst10"]  # 3 clients: the worst 10 % is one client
        per_seed.append(spread)
    for stat in ("std", "min", "worst10"):
        assert c["spread_final"][stat]["values"] == [s[stat] for s in per_seed]
    worst = c["spread_final"]["min"]
    row = next(line for line in to_markdown(comparison_tables(summary)).splitlines()
               if line.startswith("| FedAvg lr 0.2 | 2 |"))
    assert f"| {100 * worst['mean']:.2f} ± {100 * worst['std']:.2f} |" in row
    rows = list(csv.DictReader(io.StringIO(comparison_csv(summary))))
    assert float(rows[1]["final_worst10_mean"]) == c["spread_final"]["worst10"]["mean"]
    assert rows[1]["finetuned_final_mean"] == ""  # the grid did not fine-tune: no column, an empty CSV field
    assert "fine-tuned" not in to_markdown(comparison_tables(summary)).split("\n\n")[0]


def test_runs_that_recorded_no_spread_get_no_spread_columns(tiny_grid):
    """Runs from before issue 40 have no spread across clients: the comparison table leaves the columns out
    rather than show "nan ± nan", also where newer seeds recorded it (a mean over some seeds is not the other
    columns' mean); every run recording it brings them back."""
    summary = summarize(load_results([tiny_grid]))
    cells = summary["settings"]["default"]["methods"].values()
    kept = {id(stat): list(stat["values"]) for c in cells for stat in c["spread_final"].values()}
    for c in cells:
        for stat in c["spread_final"].values():
            stat["values"] = [math.nan] * len(stat["values"])
    header = to_markdown(comparison_tables(summary)).splitlines()[0]
    assert "std over clients" not in header and "worst client" not in header and header.endswith("| time (s/run) |")
    next(iter(cells))["spread_final"]["min"]["values"][0] = 0.5  # one run that recorded it: still out
    assert to_markdown(comparison_tables(summary)).splitlines()[0] == header
    for c in cells:
        for stat in c["spread_final"].values():
            stat["values"] = kept[id(stat)]
    header = to_markdown(comparison_tables(summary)).splitlines()[0]
    assert "| std over clients final (%) | worst client final (%) | mean of the worst 10 % of clients final (%) |" \
        in header


def test_run_table_shows_the_spread_and_the_finetuned_figures():
    def ev(accs, spread):
        return {"clients": {f"c{i}": {"test": {"acc": a, "n": 10}} for i, a in enumerate(accs)},
                "mean": {"test_acc": sum(accs) / len(accs)}, "pooled": {"test_acc": 0.5, "n": 10 * len(accs)},
                "spread": {"test_acc": spread}}

    final = ev([0.9, 0.5], {"std": 0.2, "min": 0.5, "worst10": 0.5})
    final["finetuned"] = {"steps": 5, **ev([0.95, 0.75], {"std": 0.1, "min": 0.75, "worst10": 0.75})}
    table = results_table({"metric": "acc", "final": {"round": 4, "eval": final},
                           "best": {"round": 3, "by": "val", "eval": ev([0.8], {"std": 0.0, "min": 0.8,
                                                                               "worst10": 0.8})}}).splitlines()
    assert table[0] == ("| client | test acc final (round 4) | test acc best (round 3, by val) "
                        "| test acc fine-tuned 5 steps (round 4) | test n |")
    assert "| c0 | 90.00 | 80.00 | 95.00 | 10 |" in table
    assert "| c1 | 50.00 | - | 75.00 | 10 |" in table   # not evaluated at the best round (eval.clients = sampled)
    assert "| **mean over clients** | **70.00** | **80.00** | **85.00** |  |" in table
    assert "| std over clients | 20.00 | 0.00 | 10.00 |  |" in table
    assert "| worst client | 50.00 | 80.00 | 75.00 |  |" in table
    assert "| mean of the worst 10 % of clients | 50.00 | 80.00 | 75.00 |  |" in table


def test_a_cell_of_one_seed_shows_its_value_without_a_spread(tiny_grid):
    """One seed has no spread: no "± 0.00" in any table (issue 61 item 8); two seeds keep theirs."""
    (run,) = (tiny_grid / "default" / "fedavg" / "seed0").glob("*-*")
    summary = summarize(load_results([run]))
    cell = summary["settings"]["default"]["methods"]["fedavg"]
    md = to_markdown(comparison_tables(summary))
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert cell["n"] == 1 and len(rows) > 6 and not [row for row in rows if "±" in row]
    final = json.loads((run / "summary.json").read_text())["final"]["eval"]
    assert f"| fedavg | 1 | {100 * final['mean']['test_acc']:.2f} | baseline |" in md
    assert f"| {100 * final['clients']['client2']['test']['acc']:.2f} |" in md
    assert "one seed: its value" in md
    two = to_markdown(comparison_tables(summarize(load_results([tiny_grid]))))
    assert re.search(r"\| FedAvg \| 2 \| \d+\.\d\d ± \d+\.\d\d \|", two)


def grid_file_of_the_docs() -> str:
    """The grid file that docs/compare_and_report.md ("Grid files") gives as the template to copy."""
    text = (ROOT / "docs" / "compare_and_report.md").read_text()
    return re.search(r"## Grid files\n\n```toml\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_grid_of_either_kind_is_not_said_to_run_on_data_fedaug_provides(tmp_path, kind):
    """The docs' template (kind = "stand-in"), copied as a user would, and its "paper" variant: the table
    states the kind as the grid declares it, and nothing about where the data come from."""
    path = tmp_path / "my_grid.toml"
    path.write_text(grid_file_of_the_docs().replace('kind = "stand-in"', f'kind = "{kind}"'))
    (line,) = [b.text for b in about_blocks(load_grid(str(path)).meta(), []) if b.text.startswith("Kind:")]
    assert line == f"Kind: {kind} ({KIND_MEANINGS[kind]})."
    assert "as the grid declares" in line and "fedaug" not in line and "offline" not in line


def test_a_kind_without_a_meaning_is_shown_as_it_is():
    (line,) = [b.text for b in about_blocks({"kind": "sketch", "seeds": [0], "baseline": "A"}, [])
               if b.text.startswith("Kind:")]
    assert line == "Kind: sketch."
