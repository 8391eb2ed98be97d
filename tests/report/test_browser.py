"""The report of a 2-method x 2-seed grid renders in a real browser (headless Chromium screenshot).

Chromium comes from Debian (``scripts/setup.sh`` installs it when run as root); without it this test
fails with the command that installs it, rather than passing unseen.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from matplotlib.image import imread

from fedaug.report.page import write_report

WIDTH, HEIGHT = 1200, 2600
#: tab10 colours of the first two methods (C0, C1) in every figure; the page's CSS uses neither
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)
BACKGROUND = (250, 250, 250)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.fail("headless Chromium is needed to check that reports render: install it with "
                "'apt-get install -y chromium' (scripts/setup.sh does so when run as root)")


def count(pixels: np.ndarray, rgb: tuple[int, int, int], tol: int = 12) -> int:
    return int((np.abs(pixels - np.array(rgb)) <= tol).all(axis=-1).sum())


def test_report_renders_in_headless_chromium(tiny_grid, tmp_path):
    files = write_report([tiny_grid], tmp_path / "report")
    shot = tmp_path / "shot.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", files["html"].resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = np.round(imread(shot)[..., :3] * 255).astype(int)
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    assert tuple(pixels[5, 5]) == BACKGROUND                    # the page's own background: CSS applied
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 200   # text, tables and plots, not a blank page
    # the three figures were decoded and drawn: lines, bars and points in both methods' colours
    assert count(pixels, BLUE) > 3000 and count(pixels, ORANGE) > 3000
    # where each image is: the curves (first) sit below the tables, in the page's width
    rows = np.flatnonzero((np.abs(pixels - np.array(BLUE)) <= 12).all(axis=-1).any(axis=1))
    assert rows.min() > 300 and rows.max() < HEIGHT


def test_report_of_a_finetuned_run_shows_the_spread_and_finetuned_columns_in_chromium(tmp_path):
    """The browser's own DOM of the page (``--dump-dom``) holds the columns of issue 40 with the run's numbers."""
    import html
    import re

    from fedaug.config.schema import validate
    from fedaug.engine.run import run_experiment
    from tests.conftest import tiny_raw

    raw = tiny_raw(rounds=2)
    raw.update(out_dir=str(tmp_path / "runs"), name="tuned", eval={"finetune_steps": 2})
    summary, run_dir = run_experiment(validate(raw), quiet=True)
    files = write_report([run_dir.path], tmp_path / "report")
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          files["html"].resolve().as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[hd][^>]*>.*?</t[hd]>", dom)]
    for head in ("std over clients final (%)", "worst client final (%)",
                 "mean of the worst 10 % of clients final (%)", "fine-tuned final test acc (%)"):
        assert head in cells
    ev = summary["final"]["eval"]
    worst = ev["spread"]["test_acc"]["min"]
    tuned = ev["finetuned"]["mean"]["test_acc"]
    row = cells[cells.index("tuned"):]
    # one run: each figure alone, no "± 0.00" (issue 61 item 8)
    assert f"{100 * worst:.2f}" in row[:14] and f"{100 * tuned:.2f}" in row[:14]
    assert not [c for c in row[:14] if "±" in c]
