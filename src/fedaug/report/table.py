"""Result tables: the per-client table of one run (printed at its end, written to ``report.md``)
and the comparison tables of a grid (``fedaug compare``, ``fedaug report``)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from fedaug.core.serialize import atomic_write_json, atomic_write_text
from fedaug.report.document import Block, Heading, Paragraph, Table, md_text, to_markdown
from fedaug.report.grid import DEFAULT_SETTING, KIND_MEANINGS
from fedaug.report.results import WHICH, load_grid_results, summarize, summary_methods, summary_metric
from fedaug.report.stats import interval_text


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


#: the rows of the spread across clients (``eval.spread``, :func:`fedaug.metrics.spread.client_spread`)
SPREAD_ROWS = (("std", "std over clients"), ("min", "worst client"), ("worst10", "mean of the worst 10 % of clients"))


def _spread(ev: dict[str, Any] | None, key: str, stat: str) -> str:
    """A spread figure of one evaluation, ``"-"`` where it has none (a run recorded before issue 40)."""
    return _pct((ev or {}).get("spread", {}).get(key, {}).get(stat))


def results_table(summary: dict[str, Any]) -> str:
    """A Markdown table of the test metric (%: accuracy, or foreground Dice for segmentation) per
    client, their mean, their spread (std, the worst client, the mean of the worst 10 %) and the
    pooled test set, at the final round and at the best round (chosen by the split in
    ``summary['best']['by']``), and, with ``eval.finetune_steps``, after each client's local
    fine-tuning at the final round; client names are literal text (:func:`md_text`). A client not
    evaluated in a round (``eval.clients = "sampled"``) shows ``-``."""
    final, best, m = summary["final"], summary["best"], summary["metric"]
    if final is None:
        return "(no evaluation was run)"
    fe, be = final["eval"], best["eval"]
    tuned = fe.get("finetuned")
    evals = [fe, be] + ([tuned] if tuned else [])
    head = (f"| client | test {m} final (round {final['round']}) "
            f"| test {m} best (round {best['round']}, by {best['by']}) "
            + (f"| test {m} fine-tuned {tuned['steps']} steps (round {final['round']}) " if tuned else "")
            + "| test n |")
    lines = [head, "|---|" + "---:|" * (len(evals) + 1)]

    def row(label: str, cells: list[str], n: object = "") -> str:
        return f"| {label} | " + " | ".join(cells) + f" | {n} |"

    names = list(dict.fromkeys(name for ev in evals for name in ev["clients"]))
    for name in names:
        res = [ev["clients"].get(name) for ev in evals]
        lines.append(row(md_text(name), [_pct(r["test"][m]) if r else "-" for r in res],
                         next(r["test"]["n"] for r in res if r)))
    lines.append(row("**mean over clients**", [f"**{_pct(ev['mean'][f'test_{m}'])}**" for ev in evals]))
    lines += [row(label, [_spread(ev, f"test_{m}", stat) for ev in evals]) for stat, label in SPREAD_ROWS]
    lines.append(row("pooled test set", [_pct(ev["pooled"][f"test_{m}"]) for ev in evals], fe["pooled"]["n"]))
    return "\n".join(lines)


def _pm(stat: dict[str, Any] | None) -> str:
    """``{"mean": 0.6544, "std": 0.0239, "values": [...]}`` -> ``"65.44 ± 2.39"`` (percent); of one value (one
    seed) the value alone, ``"65.44"``: one run has no spread to show (its ``std`` is 0 by convention)."""
    if stat is None:
        return "-"
    if len(stat["values"]) == 1:
        return f"{100 * stat['mean']:.2f}"
    return f"{100 * stat['mean']:.2f} ± {100 * stat['std']:.2f}"


def _diff(test: dict[str, Any] | None) -> str:
    if test is None:
        return "baseline"
    return "-" if test["diff"] is None else f"{100 * test['diff']:+.2f}"


def _ci(test: dict[str, Any] | None) -> str:
    """The 95 % confidence interval of a paired test's mean difference in points (``"-"`` for the baseline)."""
    return "-" if test is None else interval_text(test["ci_low"], test["ci_high"], scale=100)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3f}"


def about_blocks(meta: dict[str, Any], missing: list[str]) -> list[Block]:
    """What a grid is (description, kind, what it reproduces, seeds, baseline) and which cells are missing."""
    lines = []
    if meta.get("description"):
        lines.append(meta["description"])
    if meta.get("kind"):
        what = KIND_MEANINGS.get(meta["kind"])  # a grid.json edited by hand may hold another word
        lines.append(f"Kind: {meta['kind']}" + (f" ({what})." if what else "."))
    if meta.get("reproduces"):
        lines.append(f"Reproduces: {meta['reproduces']}.")
    if meta.get("notes"):
        lines.append(meta["notes"])
    lines.append(f"Seeds: {', '.join(map(str, meta['seeds']))}; baseline: {meta['baseline']}"
                 + (f"; overrides: `{' '.join(meta['overrides'])}`" if meta.get("overrides") else "") + ".")
    blocks: list[Block] = [Paragraph(line) for line in lines]
    if missing:
        blocks.append(Paragraph(f"Not included ({len(missing)} cells not finished): " + "; ".join(missing) + "."))
    return blocks


def setting_tables(s: dict[str, Any]) -> list[Block]:
    """One setting of :func:`fedaug.report.results.summarize` as document blocks: the main table
    (mean ± std over seeds of the final and best mean-over-clients test metric, the difference from
    the baseline with its 95 % confidence interval and the paired t-test's p-value, the spread across
    clients where every run recorded it (runs before issue 40 did not: a mean over some of the seeds would
    not be the other columns' mean), communication and time per run), then the per-client tables (final,
    best)."""
    m, base = s["metric"], s["baseline"]
    tuned = any("finetuned_final" in c for c in s["methods"].values())
    recorded = [v for c in s["methods"].values() if c["n"] for stat in c["spread_final"].values()
                for v in stat["values"]]
    spread = SPREAD_ROWS if recorded and not any(math.isnan(v) for v in recorded) else ()
    head = ["method", "seeds", f"final test {m} (%)", f"Δ final vs {base}", "95 % CI", "p (paired t, n)",
            f"best test {m} (%)", f"Δ best vs {base}", "95 % CI", "p (paired t, n)",
            *[f"{label} final (%)" for _, label in spread],
            *([f"fine-tuned final test {m} (%)"] if tuned else []), "comm up+down (MB/run)", "time (s/run)"]
    rows = []
    for method, c in s["methods"].items():
        if c["n"] == 0:
            rows.append([method, "0", *["not run"] * (len(head) - 2)])
            continue
        vs = c.get("vs_baseline", {})
        rows.append([method, str(c["n"]), _pm(c["final"]), _diff(vs.get("final")), _ci(vs.get("final")),
                     vs["final"]["text"] if vs else "-", _pm(c["best"]), _diff(vs.get("best")), _ci(vs.get("best")),
                     vs["best"]["text"] if vs else "-",
                     *[_pm(c["spread_final"][stat]) for stat, _ in spread],
                     *([_pm(c.get("finetuned_final"))] if tuned else []),
                     _mb(c["comm_bytes"]["total"]), f"{c['seconds']:.1f}"])
    blocks: list[Block] = [Table(head, rows)]
    for which in ("final", "best"):
        crow = [[method, *[_pm(c[f"clients_{which}"].get(k)) for k in s["clients"]], _pm(c[which])]
                for method, c in s["methods"].items() if c["n"] > 0]
        blocks.append(Paragraph(f"Per client, test {m} (%) at the {which} round, mean ± std over seeds "
                                "(one seed: its value):"))
        blocks.append(Table(["method", *s["clients"], "mean over clients"], crow))
    return blocks


def privacy_blocks(s: dict[str, Any]) -> list[Block]:
    """The differential-privacy guarantee of one setting's methods (their cells' ``privacy``): the
    final (eps, delta) per release and in total, then eps after each round; ``[]`` when no method
    declares a release."""
    dp = {method: c["privacy"] for method, c in s["methods"].items() if c.get("privacy")}
    if not dp:
        return []
    none = [method for method, c in s["methods"].items() if c["n"] and method not in dp]
    final = [[method, f"{p['delta']:g}", p["unit"], _eps(p["epsilon"][-1]),
              "; ".join(f"{what} {_eps(v[-1])}" for what, v in p["releases"].items()),
              "yes" if p["model_protected"] else "no"] for method, p in dp.items()]
    rounds = sorted({t for p in dp.values() for t in p["rounds"]})
    per_round = [[str(t), *(_eps(p["epsilon"][p["rounds"].index(t)]) if t in p["rounds"] else "-" for p in dp.values())]
                 for t in rounds]
    note = ("Epsilon of the accountant (docs/privacy.md, \"Differential privacy\") after the final round, per "
            "unit (sample or client), for the releases each method declares; \"model weights\" says whether "
            "the weights themselves are under the guarantee (DP-FedAvg).")
    if none:
        note += f" No formal guarantee (no DP release): {', '.join(none)}."
    return [Heading(3, "Differential privacy"), Paragraph(note),
            Table(["method", "delta", "unit", "epsilon (final)", "per release", "model weights"], final),
            Paragraph("Epsilon after each round:"), Table(["round", *dp], per_round)]


def _eps(x: float) -> str:
    """An epsilon for a table (``inf`` where the record held null: no noise)."""
    return f"{x:.3f}" if math.isfinite(x) else "inf"


def overview_cell(c: dict[str, Any], which: str = "final", seeds: int | None = None) -> str:
    """One method of one setting in a cell: ``"69.06 ± 2.83 (+3.69 [+1.20, +6.18], p 0.0117)"`` (the
    difference from the baseline, its 95 % confidence interval and its paired p-value over the seeds
    both finished; ``p n/a`` and no interval below two pairs; none of them for the baseline), ``"-"``
    when nothing finished, and ``" [n=2]"`` appended when fewer than ``seeds`` runs finished."""
    if c["n"] == 0:
        return "-"
    text = _pm(c[which])
    vs = c.get("vs_baseline", {}).get(which)
    if vs and vs["diff"] is not None:
        ci = "" if vs["ci_low"] is None else f" {_ci(vs)}"
        text += f" ({100 * vs['diff']:+.2f}{ci}, p {'n/a' if vs['p'] is None else format(vs['p'], '.3g')})"
    return text + ("" if seeds is None or c["n"] == seeds else f" [n={c['n']}]")


def overview_table(summary: dict[str, Any], which: str = "final") -> Table:
    """All settings at once: one row per setting, one column per method, each cell the mean ± std
    over seeds of the ``which`` (final or best) mean-over-clients test metric with its difference
    from the setting's baseline (:func:`overview_cell`)."""
    methods = summary_methods(summary)
    seeds = len(summary["grid"]["seeds"])
    rows = [[setting, *(overview_cell(s["methods"][m], which, seeds) if m in s["methods"] else "-" for m in methods)]
            for setting, s in summary["settings"].items()]
    return Table([f"setting ({which} test {summary_metric(summary)}, %)", *methods], rows)


def comparison_tables(summary: dict[str, Any]) -> list[Block]:
    """Every setting's :func:`setting_tables`, under a heading when the grid has named settings,
    after the :func:`overview_table` of final and best values when it has several."""
    blocks: list[Block] = []
    settings = summary["settings"]
    if len(settings) > 1:
        blocks += [Heading(3, "Overview"), Paragraph("Every setting's final and best mean client test metric "
                                                     "(Δ [95 % CI] and paired p against the setting's baseline):"),
                   overview_table(summary, "final"), overview_table(summary, "best")]
    for setting, s in settings.items():
        if len(settings) > 1 or setting != DEFAULT_SETTING:
            blocks.append(Heading(3, f"Setting: {setting}"))
        blocks += setting_tables(s)
    return blocks


#: what the comparison table's columns mean (shown under it in Markdown and HTML)
COLUMNS_NOTE = (
    "final: the last evaluated round; best: the round with the highest mean-over-clients metric on the "
    "split in `eval.best_by` (its test value is shown). Values are the unweighted mean over clients, "
    "then mean ± sample std over seeds (a cell of one seed shows its value alone). Δ: mean of the per-seed "
    "differences from the baseline (points); 95 % CI, or [low, high] after Δ: its 95 % confidence interval "
    "(Student t with n - 1 degrees of freedom, the same differences as the t-test): wide means too few seeds "
    "to tell, narrow around 0 a small effect; p: two-sided paired t-test over the seeds both ran (n/a below "
    "2 pairs). comm: bytes sent down and up over all rounds (records' `comm`), mean per run; time: "
    "training + evaluation seconds per run. Across clients at the final round: std over clients "
    "(population), the worst client and the mean of the worst 10 % of clients (at least one), each mean ± "
    "std over seeds; fine-tuned: the mean over clients after each client fine-tuned the global model "
    "locally (`eval.finetune_steps`)."
)


def comparison_csv(summary: dict[str, Any]) -> str:
    """One CSV row per (setting, method): n, mean and std of final and best (fractions, not %),
    the differences against the baseline with their p-values and 95 % confidence intervals, bytes,
    seconds, and per-client means."""
    clients = list(dict.fromkeys(k for s in summary["settings"].values() for k in s["clients"]))
    spread = [f"{which}_{stat}_mean" for which in WHICH for stat, _ in SPREAD_ROWS]
    head = ["setting", "method", "metric", "n", "seeds", "final_mean", "final_std", "best_mean", "best_std",
            "final_diff", "final_p", "best_diff", "best_p", "final_ci_low", "final_ci_high", "best_ci_low",
            "best_ci_high", "pairs", "comm_down_bytes", "comm_up_bytes",
            "comm_total_bytes", "seconds", *spread, "finetuned_final_mean",
            *[f"final_{k}" for k in clients], *[f"best_{k}" for k in clients]]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(head)
    for setting, s in summary["settings"].items():
        for method, c in s["methods"].items():
            if c["n"] == 0:
                writer.writerow([setting, method, s["metric"], 0] + [""] * (len(head) - 4))
                continue
            vs = c.get("vs_baseline", {})
            f, b = vs.get("final", {}), vs.get("best", {})
            writer.writerow([
                setting, method, s["metric"], c["n"], " ".join(map(str, c["seeds"])),
                c["final"]["mean"], c["final"]["std"], c["best"]["mean"], c["best"]["std"],
                f.get("diff", ""), f.get("p", ""), b.get("diff", ""), b.get("p", ""), f.get("ci_low", ""),
                f.get("ci_high", ""), b.get("ci_low", ""), b.get("ci_high", ""), f.get("n", ""),
                c["comm_bytes"]["down"], c["comm_bytes"]["up"], c["comm_bytes"]["total"], c["seconds"],
                *[c[f"spread_{which}"][stat]["mean"] for which in WHICH for stat, _ in SPREAD_ROWS],
                c["finetuned_final"]["mean"] if "finetuned_final" in c else "",
                *[c["clients_final"][k]["mean"] if k in c["clients_final"] else "" for k in clients],
                *[c["clients_best"][k]["mean"] if k in c["clients_best"] else "" for k in clients]])
    return buf.getvalue()


def write_tables(out: Path) -> dict[str, Path]:
    """Write ``table.md``, ``table.csv`` and ``table.json`` for the grid in ``out`` (its finished cells).

    Returns:
        The written files by kind (``markdown``, ``csv``, ``json``).
    """
    summary = summarize(load_grid_results(out))
    meta = summary["grid"]
    blocks = [Heading(1, f"fedaug compare: {meta['name']}"), *about_blocks(meta, summary["missing"]),
              *comparison_tables(summary), Paragraph(COLUMNS_NOTE)]
    files = {"markdown": out / "table.md", "csv": out / "table.csv", "json": out / "table.json"}
    atomic_write_text(files["markdown"], to_markdown(blocks))
    atomic_write_text(files["csv"], comparison_csv(summary))
    atomic_write_json(files["json"], summary)
    return files
