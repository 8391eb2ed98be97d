"""The report's figures as PNG bytes (matplotlib's object API with the Agg canvas: no pyplot, no
global state, no display). Method ``k`` is drawn in colour ``C{k}`` (tab10) in every figure."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedaug.report.results import summary_methods, summary_metric

DPI = 100


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, list[Any]]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        from fedaug.core.errors import DataError

        raise DataError("reports need matplotlib; install it: pip install 'fedaug[data]'") from None
    fig = Figure(figsize=(width, height), dpi=DPI)
    return fig, [fig.add_subplot(1, ncols, k + 1) for k in range(ncols)]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _colour(k: int) -> str:
    return f"C{k % 10}"


def curves_png(setting: dict[str, Any]) -> bytes:
    """Learning curves: mean-over-clients test metric per evaluated round, mean over seeds, with a
    band of ± one standard deviation (:func:`fedaug.report.results.summarize_cell`'s ``curve``)."""
    fig, (ax,) = _figure(7.0, 3.6)
    for k, (method, c) in enumerate(setting["methods"].items()):
        if c["n"] == 0:
            continue
        x = np.asarray(c["curve"]["rounds"])
        mean, std = 100 * np.asarray(c["curve"]["mean"]), 100 * np.asarray(c["curve"]["std"])
        ax.plot(x, mean, color=_colour(k), label=f"{method} (n={c['n']})", linewidth=1.8)
        ax.fill_between(x, mean - std, mean + std, color=_colour(k), alpha=0.2, linewidth=0)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("round")
    ax.set_ylabel(f"mean client test {setting['metric']} (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def client_bars_figure(setting: dict[str, Any], which: str = "final") -> Any:
    """Grouped bars: each client's test metric (and the mean over clients) per method, mean over
    seeds with ± std error bars; the legend beside the axes, where it covers no bar."""
    methods = [(k, m, c) for k, (m, c) in enumerate(setting["methods"].items()) if c["n"] > 0]
    groups = [*setting["clients"], "mean"]
    fig, (ax,) = _figure(max(7.0, 0.9 * len(groups) * max(len(methods), 1) / 2 + 2), 3.6)
    width = 0.8 / max(len(methods), 1)
    for j, (k, method, c) in enumerate(methods):
        stats = [c[f"clients_{which}"].get(g) for g in setting["clients"]] + [c[which]]
        means = [100 * s["mean"] if s else np.nan for s in stats]
        stds = [100 * s["std"] if s else 0.0 for s in stats]
        ax.bar(np.arange(len(groups)) + (j - (len(methods) - 1) / 2) * width, means, width, yerr=stds,
               color=_colour(k), label=method, capsize=2)
    ax.set_xticks(np.arange(len(groups)), groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"test {setting['metric']} at the {which} round (%)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def client_bars_png(setting: dict[str, Any], which: str = "final") -> bytes:
    """:func:`client_bars_figure` as PNG bytes."""
    return _png(client_bars_figure(setting, which))


def comm_figure(setting: dict[str, Any]) -> Any:
    """Communication vs accuracy: bytes up + down per run (MB) against the final mean-over-clients
    test metric (mean ± std over seeds), one labelled point per method (:func:`label_points`)."""
    fig, (ax,) = _figure(7.0, 3.6)
    points = []
    for k, (method, c) in enumerate(setting["methods"].items()):
        if c["n"] == 0:
            continue
        mb = c["comm_bytes"]["total"] / 1e6
        points.append((mb, 100 * c["final"]["mean"], method))
        ax.errorbar([mb], [100 * c["final"]["mean"]], yerr=[100 * c["final"]["std"]], fmt="o", color=_colour(k),
                    capsize=3, label=method)
    totals = [mb for mb, _, _ in points]
    if totals and min(totals) > 0 and max(totals) / min(totals) > 20:
        ax.set_xscale("log")
    label_points(ax, points)
    ax.set_xlabel("communication per run, up + down (MB)")
    ax.set_ylabel(f"final mean client test {setting['metric']} (%)")
    ax.grid(alpha=0.3)
    return fig


def comm_png(setting: dict[str, Any]) -> bytes:
    """:func:`comm_figure` as PNG bytes."""
    return _png(comm_figure(setting))


def label_points(ax: Any, points: Sequence[tuple[float, float, str]]) -> None:
    """Write each ``(x, y, text)`` beside its point on ``ax``, on the side towards the middle of the
    axes (left of a point in the right half, below a point in the upper half), so that a label runs
    into the plot, never past its edges. Call it once the axes' scales and data are set."""
    ax.autoscale_view()  # the data limits, before any position is read
    to_axes = ax.transData + ax.transAxes.inverted()
    for x, y, text in points:
        fx, fy = to_axes.transform((x, y))
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(5 if fx < 0.5 else -5, 4 if fy < 0.5 else -4),
                    ha="left" if fx < 0.5 else "right", va="bottom" if fy < 0.5 else "top", fontsize=8)


def settings_png(summary: dict[str, Any], which: str = "final") -> bytes:
    """The mean-over-clients test metric of each method across the grid's settings, in grid order
    (a sweep such as local data size: FedFA Fig. 2, FLea Fig. 2), mean over seeds with ± std error
    bars; settings a method has no finished run in are left out of its line."""
    settings = list(summary["settings"])
    fig, (ax,) = _figure(max(7.0, 0.8 * len(settings) + 2), 3.6)
    methods = summary_methods(summary)
    for k, method in enumerate(methods):
        points = [(j, summary["settings"][name]["methods"].get(method)) for j, name in enumerate(settings)]
        points = [(j, c[which]) for j, c in points if c and c["n"] > 0]
        if not points:
            continue
        x = np.asarray([j for j, _ in points]) + (k - (len(methods) - 1) / 2) * 0.04
        ax.errorbar(x, [100 * p["mean"] for _, p in points], yerr=[100 * p["std"] for _, p in points], fmt="o-",
                    color=_colour(k), capsize=3, label=method, linewidth=1.5)
    ax.set_xticks(np.arange(len(settings)), settings, rotation=20 if len(settings) > 4 else 0, fontsize=8)
    ax.set_xlabel("setting")
    ax.set_ylabel(f"{which} mean client test {summary_metric(summary)} (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def _paired_gains(cell: dict[str, Any], base: dict[str, Any], which: str) -> list[float]:
    """``cell``'s metric minus ``base``'s on each seed both finished (percentage points)."""
    by_seed = dict(zip(base.get("seeds", []), base[which]["values"])) if base.get("n") else {}
    return [100 * (v - by_seed[s]) for s, v in zip(cell["seeds"], cell[which]["values"]) if s in by_seed]


def gains_png(summary: dict[str, Any], which: str = "final") -> bytes:
    """Horizontal bars: per setting (top to bottom, in grid order) each method's gain over the
    setting's baseline in percentage points, the mean of the paired per-seed differences (the
    overview table's Delta), with ± their standard deviation; a ``*`` marks paired p < 0.05 (the
    FedRDN paper's Table 1 arrows, drawn).
    Methods keep their colours of the other figures; the baseline draws no bar, and a cell with
    no seed in common with its baseline is left out."""
    settings = list(summary["settings"])
    methods = summary_methods(summary)
    drawn = [m for m in methods if any(m != s["baseline"] for s in summary["settings"].values())]
    fig, (ax,) = _figure(7.0, 0.16 * len(settings) * max(len(drawn), 1) + 1.6)
    height = 0.8 / max(len(drawn), 1)
    for j, method in enumerate(drawn):
        k, label = methods.index(method), method
        for i, s in enumerate(summary["settings"].values()):
            cell, base = s["methods"].get(method), s["methods"].get(s["baseline"])
            if method == s["baseline"] or not cell or cell["n"] == 0 or not base:
                continue
            gains = _paired_gains(cell, base, which)
            if not gains:
                continue
            y = i + (j - (len(drawn) - 1) / 2) * height
            err = float(np.std(gains, ddof=1)) if len(gains) > 1 else None
            mean = float(np.mean(gains))
            ax.barh(y, mean, height, xerr=err, color=_colour(k), capsize=2, label=label)
            label = None
            p = cell.get("vs_baseline", {}).get(which, {}).get("p")
            if p is not None and p < 0.05:
                end = mean + (err or 0.0) * (1 if mean >= 0 else -1)  # beyond the error bar
                ax.annotate("*", (end, y), textcoords="offset points", xytext=(4 if mean >= 0 else -9, -4), fontsize=9)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(np.arange(len(settings)), settings, fontsize=7)
    ax.set_ylim(len(settings) - 0.5, -0.5)
    ax.set_xlabel(f"gain over the baseline, {which} mean client test {summary_metric(summary)} (points)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)
    return _png(fig)


def features_png(panels: Sequence[dict[str, Any]]) -> bytes:
    """One scatter per method of 2-D feature embeddings coloured by client.

    Args:
        panels: ``{"method", "coords" (N, 2) array, "clients" (N,) client names, "title"}`` each.
    """
    from matplotlib import colormaps

    fig, axes = _figure(3.4 * len(panels) + 0.6, 3.6, ncols=len(panels))
    palette = colormaps["Dark2"].colors  # 8 colours, none of them a method colour
    for ax, panel in zip(axes, panels):
        names = list(dict.fromkeys(panel["clients"]))
        labels = np.asarray(panel["clients"])
        for j, name in enumerate(names):
            pts = panel["coords"][labels == name]
            ax.scatter(pts[:, 0], pts[:, 1], s=7, alpha=0.8, color=palette[j % len(palette)],
                       marker="osD^v<>p"[j // len(palette) % 8], label=name)
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[-1].legend(fontsize=7, markerscale=2, loc="best")
    return _png(fig)
