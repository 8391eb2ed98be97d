"""The report's figures keep their text off the data and inside the plot (issue 61 item 8): the per-client
bars' legend covers no bar, a point's label in the communication figure stays within the axes. Checked on
the rendered figures' geometry (window extents after the layout the PNG is saved with)."""

from __future__ import annotations

from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from fedaug.report import figures

NAMES = ("FedAvg", "FedAvg + FedRDN", "FedProx + FedFA (p=0.2)", "SCAFFOLD + FLea")


def stat(mean: float, std: float = 0.02) -> dict[str, Any]:
    return {"mean": mean, "std": std, "values": [mean]}


def setting(num_methods: int, num_clients: int, acc: float, spread: float = 0.05,
            mb: tuple[float, ...] = (1.0, 8.0, 27.0, 64.0)) -> dict[str, Any]:
    """A setting of ``fedaug.report.results.summarize`` with what the figures read: method ``k``'s client ``j``
    scores ``acc - spread * j - 0.01 * k`` and sends ``mb[k]`` MB a run."""
    methods = {NAMES[k]: {"n": 1, "final": stat(acc - 0.01 * k), "comm_bytes": {"total": 1e6 * mb[k]},
                          "clients_final": {f"client{j}": stat(acc - spread * j - 0.01 * k)
                                            for j in range(num_clients)}}
               for k in range(num_methods)}
    return {"methods": methods, "clients": [f"client{j}" for j in range(num_clients)], "metric": "acc"}


def rendered(fig: Any) -> Any:
    """The figure laid out as its PNG is (``figures._png``), drawn again on an Agg canvas: its renderer."""
    figures._png(fig)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


@pytest.mark.parametrize(("num_methods", "num_clients", "acc", "spread"), [
    (2, 3, 0.95, 0.05),    # high bars everywhere: a legend inside the axes had nowhere to go (the chart)
    (4, 6, 0.60, 0.10),    # many bars, falling to the right
    (1, 2, 0.10, 0.0),     # low bars
    (3, 4, 0.99, 0.0),     # every bar at the top
])
def test_the_per_client_legend_covers_no_bar_and_stays_in_the_figure(num_methods, num_clients, acc, spread):
    fig = figures.client_bars_figure(setting(num_methods, num_clients, acc, spread))
    renderer = rendered(fig)
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == num_methods * (num_clients + 1)  # each client and the mean, per method
    assert not [b for b in bars if b.overlaps(legend)]
    page = fig.bbox
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and page.y0 <= legend.y0 and legend.y1 <= page.y1


@pytest.mark.parametrize(("num_methods", "acc", "mb"), [
    (3, 0.92, (1.0, 8.0, 27.0)),            # log scale (a range over 20x): the rightmost point at the edge
    (4, 0.50, (1.0, 1.1, 1.2, 1.3)),        # linear, long names at the right
    (1, 0.70, (5.0,)),                      # a single point: it sits in the middle
    (2, 0.99, (10.0, 10.0)),                # the same bytes: points one above the other
])
def test_every_point_label_stays_inside_the_axes(num_methods, acc, mb):
    fig = figures.comm_figure(setting(num_methods, 2, acc, mb=mb))
    renderer = rendered(fig)
    (ax,) = fig.axes
    box = ax.get_window_extent(renderer)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert sorted(labels) == sorted(NAMES[:num_methods])
    outside = [name for name, b in labels.items()
               if not (box.x0 <= b.x0 and b.x1 <= box.x1 and box.y0 <= b.y0 and b.y1 <= box.y1)]
    assert outside == []
