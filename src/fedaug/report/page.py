"""``fedaug report``: one HTML page (self-contained) and one Markdown file (with PNG files) for a
grid directory or a set of run directories. Every number comes from
:func:`fedaug.report.results.summarize`, i.e. from the runs' ``summary.json`` and ``metrics.jsonl``;
``report.json`` holds them all."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedaug.core.serialize import atomic_write_bytes, atomic_write_json, atomic_write_text
from fedaug.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from fedaug.report.figures import client_bars_png, comm_png, curves_png, features_png, gains_png, settings_png
from fedaug.report.grid import DEFAULT_SETTING, slug
from fedaug.report.incidents import incidents_table
from fedaug.report.results import Results, load_results, summarize
from fedaug.report.table import COLUMNS_NOTE, about_blocks, overview_table, privacy_blocks, setting_tables

IMAGE_DIR = "report_files"
INCIDENTS_NOTE = ("The rounds in which a reply was rejected (client (phase): reason), a client dropped out, sampled "
                  "clients attacked ([attack]) or the server kept its previous state (aggregate); other rounds "
                  "had none. Consecutive rounds with the same entries share a row.")


def _feature_blocks(setting: str, analyses: list[dict[str, Any]]) -> list[Block]:
    rows = [[a["method"], str(a["seed"]), a["stage"], str(a["samples"]),
             "-" if a["db_client"] is None else f"{a['db_client']:.3f}",
             "-" if a["db_class"] is None else f"{a['db_class']:.3f}"] for a in analyses]
    embedding = analyses[0]["embedding"].upper().replace("TSNE", "t-SNE")
    panels = [{"coords": a["coords"], "clients": a["clients"],
               "title": f"{a['method']} (DB client {a['db_client']:.2f})" if a["db_client"] is not None
               else a["method"]} for a in analyses]
    return [
        Heading(3, "Features"),
        Paragraph(f"{embedding} of the final global model's features (each client's test data, its model as "
                  "evaluated), coloured by client; Davies-Bouldin score (FLea, KDD 2024, Sec. 2.3: lower = "
                  "better separated) of the features clustered by client and by class."),
        Table(["method", "seed", "stage", "samples", "DB by client", "DB by class"], rows),
        Image(f"features-{slug(setting)}.png", features_png(panels), f"{embedding} of features, {setting}"),
    ]


def report_blocks(summary: dict[str, Any], features: dict[str, list[dict[str, Any]]] | None = None) -> list[Block]:
    """The whole report as document blocks (see :mod:`fedaug.report.document`)."""
    meta = summary["grid"]
    blocks: list[Block] = [Heading(1, f"fedaug report: {meta['name']}"), *about_blocks(meta, summary["missing"])]
    if sum(any(c["n"] for c in s["methods"].values()) for s in summary["settings"].values()) > 1:
        blocks += [Heading(2, "Across settings"), overview_table(summary, "final"), overview_table(summary, "best"),
                   Image("settings.png", settings_png(summary), "final mean client test metric per setting"),
                   Image("gains.png", gains_png(summary), "each method's final gain over its setting's baseline")]
    for setting, s in summary["settings"].items():
        tag = slug(setting)
        blocks.append(Heading(2, "Results" if setting == DEFAULT_SETTING else f"Setting: {setting}"))
        blocks += setting_tables(s)
        blocks.append(Paragraph(COLUMNS_NOTE))
        incidents = [{"method": m, **row} for m, c in s["methods"].items() for row in c.get("incidents", [])]
        if incidents:
            blocks += [Heading(3, "Rejections, drop-outs and attacks"),
                       Paragraph(INCIDENTS_NOTE), incidents_table(incidents, ("method", "seed"))]
        if not any(c["n"] for c in s["methods"].values()):
            continue
        blocks += [
            Heading(3, "Learning curves"),
            Image(f"curves-{tag}.png", curves_png(s), f"learning curves, {setting}"),
            Heading(3, "Per client"),
            Image(f"clients-{tag}.png", client_bars_png(s, "final"), f"per-client final test {s['metric']}, {setting}"),
            Heading(3, "Communication vs accuracy"),
            Image(f"comm-{tag}.png", comm_png(s), f"communication vs accuracy, {setting}"),
            *privacy_blocks(s),
        ]
        if features and features.get(setting):
            blocks += _feature_blocks(setting, features[setting])
    return blocks


def analyse_features(results: Results, embedding: str, stage: str | None, per_client: int
                     ) -> dict[str, list[dict[str, Any]]]:
    """:func:`fedaug.report.features.feature_analysis` of each method's lowest-seed run, per setting."""
    from fedaug.report.features import feature_analysis

    out: dict[str, list[dict[str, Any]]] = {}
    for setting in results.settings:
        for method in results.methods:
            runs = results.cell_runs(setting, method)
            if runs:
                out.setdefault(setting, []).append(
                    feature_analysis(runs[0], embedding=embedding, stage=stage, per_client=per_client))
    return out


def write_report(paths: Sequence[str | Path], out: Path, *, features: str | None = None, stage: str | None = None,
                 per_client: int = 100) -> dict[str, Path]:
    """Write ``report.html``, ``report.md`` (+ ``report_files/*.png``) and ``report.json`` to ``out``.

    Args:
        paths: a grid directory alone, or run directories (see :func:`load_results`).
        out: output directory (created).
        features: ``"pca"`` or ``"tsne"`` to add the feature analysis; ``None`` to skip it.
        stage, per_client: see :func:`fedaug.report.features.run_features`.

    Returns:
        The written files by kind (``html``, ``markdown``, ``json``).
    """
    results = load_results(paths)
    summary = summarize(results)
    analyses = analyse_features(results, features, stage, per_client) if features else None
    blocks = report_blocks(summary, analyses)
    out = Path(out)
    for b in blocks:
        if isinstance(b, Image):
            atomic_write_bytes(out / IMAGE_DIR / b.name, b.png)
    title = f"fedaug report: {summary['grid']['name']}"
    files = {"html": out / "report.html", "markdown": out / "report.md", "json": out / "report.json"}
    atomic_write_text(files["html"], to_html(blocks, title))
    atomic_write_text(files["markdown"], to_markdown(blocks, IMAGE_DIR))
    numbers = {k: [{key: v for key, v in a.items() if key not in ("coords", "clients")} for a in vs]
               for k, vs in (analyses or {}).items()}  # per-point data stays in the figure
    atomic_write_json(files["json"], {**summary, "features": numbers})
    return files
