"""``fedaug report``: self-contained HTML, Markdown with image files, every number from the records."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread
from sklearn.metrics import davies_bouldin_score

from fedaug.core.errors import ConfigError
from fedaug.report.document import Heading, Image, Paragraph, Table, to_html, to_markdown
from fedaug.report.features import embed, run_features
from fedaug.report.figures import gains_png, settings_png
from fedaug.report.page import write_report
from fedaug.report.results import Run, load_results, summarize
from fedaug.report.runner import run_grid
from fedaug.report.table import privacy_blocks
from tests.report.conftest import tiny_spec

PNG = b"\x89PNG\r\n\x1a\n"


class Cells(HTMLParser):
    """Collects every table's rows (lists of cell texts) and every img's src."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.imgs: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.imgs.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def md_rows(md: str) -> list[list[str]]:
    """The Markdown tables' cells as text (md_text's backslash escapes undone: ``\\|``, ``\\[``, ...)."""
    return [[re.sub(r"\\(.)", r"\1", c.strip()) for c in line.strip("|").split(" | ")]
            for line in md.splitlines() if line.startswith("| ")]


@pytest.fixture(scope="module")
def report(tiny_grid, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return write_report([tiny_grid], out, features="pca", per_client=100), tiny_grid


def test_html_is_self_contained_and_its_images_are_the_pngs(report):
    files, _ = report
    html = files["html"].read_text()
    parser = Cells()
    parser.feed(html)
    assert len(parser.imgs) == 4  # curves, per-client bars, comm vs accuracy, features
    assert all(src.startswith("data:image/png;base64,") for src in parser.imgs)
    pngs = sorted((files["html"].parent / "report_files").glob("*.png"))
    assert sorted(base64.b64decode(src.split(",", 1)[1]) for src in parser.imgs) == sorted(p.read_bytes() for p in pngs)
    assert all(p.read_bytes().startswith(PNG) for p in pngs)
    assert not re.search(r"https?://|<script|<link|@import|url\(", html)


def test_markdown_refers_to_the_image_files_and_shows_the_html_tables(report):
    files, _ = report
    md = files["markdown"].read_text()
    for name in ("curves-default.png", "clients-default.png", "comm-default.png", "features-default.png"):
        assert f"(report_files/{name})" in md
    parser = Cells()
    parser.feed(files["html"].read_text())
    assert parser.rows == md_rows(md)


def test_report_numbers_equal_the_records(report):
    files, grid = report
    numbers = json.loads(files["json"].read_text())
    assert {k: v for k, v in numbers.items() if k != "features"} == json.loads(json.dumps(summarize(load_results([grid]))))
    (run,) = (grid / "default" / "fedavg-lr-0.2" / "seed1").glob("*-*")
    final = json.loads((run / "summary.json").read_text())["final"]["eval"]["clients"]["client2"]["test"]["acc"]
    assert numbers["settings"]["default"]["methods"]["FedAvg lr 0.2"]["clients_final"]["client2"]["values"][1] == final
    c = numbers["settings"]["default"]["methods"]["FedAvg lr 0.2"]["clients_final"]["client2"]
    assert f"{100 * c['mean']:.2f} ± {100 * c['std']:.2f}" in files["markdown"].read_text()


def test_feature_analysis_scores_equal_an_independent_computation(report):
    files, grid = report
    feats = json.loads(files["json"].read_text())["features"]["default"]
    assert [f["method"] for f in feats] == ["FedAvg", "FedAvg lr 0.2"] and all(f["seed"] == 0 for f in feats)
    run = load_results([grid]).cell_runs("default", "FedAvg")[0]
    f = run_features(run, per_client=100)
    assert f["features"].shape == (36, 8) and f["stage"] == "pool" and f["round"] == 3  # 3 clients x 12 test samples
    x = f["features"].numpy()
    assert feats[0]["samples"] == 36
    assert feats[0]["db_client"] == pytest.approx(davies_bouldin_score(x, f["clients"]))
    assert feats[0]["db_class"] == pytest.approx(davies_bouldin_score(x, f["classes"].numpy()))
    assert f"{feats[0]['db_client']:.3f}" in files["markdown"].read_text()


def test_embeddings():
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(40, 6)).astype("float32"))
    assert embed(x, "pca").shape == (40, 2)
    y = embed(x, "tsne", seed=3)
    assert y.shape == (40, 2) and np.array_equal(y, embed(x, "tsne", seed=3))
    with pytest.raises(ConfigError, match="unknown embedding 'umap'; choose from pca, tsne"):
        embed(x, "umap")


def test_document_rendering_escapes_text():
    blocks = [Heading(1, "a <b>"), Paragraph("x `k=v` & y"), Table(["m", "v|w"], [["<i>", "1"]]),
              Image("p.png", PNG, 'alt "q"')]
    html = to_html(blocks, "t & t")
    assert "<h1>a &lt;b&gt;</h1>" in html and "<p>x <code>k=v</code> &amp; y</p>" in html
    assert "<td>&lt;i&gt;</td>" in html and 'alt="alt &quot;q&quot;"' in html and "<title>t &amp; t</title>" in html
    assert to_markdown(blocks, "f") == ('# a \\<b\\>\n\nx `k=v` \\& y\n\n| m | v\\|w |\n|---|---:|\n| \\<i\\> | 1 |\n\n'
                                        '![alt "q"](f/p.png)\n')


NASTY = "lr|0.2 *bold* _it_ [x](http://e) <b>#1</b> &amp; ~~s~~ `c` \\\nsecond line"


def test_markdown_shows_names_literally_and_a_name_cannot_break_a_table_or_heading():
    md = to_markdown([Heading(2, f"Setting: {NASTY}"), Table(["method", "acc"], [[NASTY, "1"]]),
                      Paragraph(f"missing: {NASTY}; overrides `a=b|c`")])
    heading, _, head, rule, row, _, para = md.splitlines()
    literal = (r"lr\|0.2 \*bold\* \_it\_ \[x\](http://e) \<b\>\#1\</b\> \&amp; \~\~s\~\~ \`c\` \\ "
               "second line")
    assert heading == f"## Setting: {literal}"  # one line: the newline became a space
    assert row == f"| {literal} | 1 |" and len(re.findall(r"(?<!\\)\|", row)) == 3  # still two cells
    # code spans stay as written (a backtick pair in a paragraph is code, as on the HTML page)
    assert para == "missing: " + literal.replace(r"\`c\`", "`c`") + "; overrides `a=b|c`"


def _colour_pixels(png: bytes, rgb: tuple[int, int, int]) -> int:
    pixels = np.round(imread(io.BytesIO(png))[..., :3] * 255).astype(int)
    return int((np.abs(pixels - np.array(rgb)).sum(-1) < 30).sum())


def test_settings_figure_draws_each_method_across_the_settings():
    def cell(mean: float) -> dict:
        return {"n": 2, "final": {"mean": mean, "std": 0.02}}

    summary = {"settings": {
        "1/2": {"metric": "acc", "methods": {"FedAvg": cell(0.5), "FedFA": cell(0.6)}},
        "2/2": {"metric": "acc", "methods": {"FedAvg": cell(0.7), "FedFA": {"n": 0}}},  # FedFA not run here
    }}
    png = settings_png(summary)
    assert png.startswith(PNG)
    fedavg, fedfa = _colour_pixels(png, (31, 119, 180)), _colour_pixels(png, (255, 127, 14))  # tab10 C0, C1
    assert fedavg > 2 * fedfa > 0  # FedAvg: two points and a line; FedFA: one point


def test_a_grid_with_several_settings_gets_the_across_settings_figure(tmp_path):
    out = tmp_path / "grid"
    run_grid(tiny_spec(settings={"3 rounds": {}, "2 rounds": {"train": {"rounds": 2}}}, seeds=[0]), out)
    files = write_report([out], tmp_path / "report")
    md = files["markdown"].read_text()
    assert "## Across settings" in md and "(report_files/settings.png)" in md and "(report_files/gains.png)" in md
    assert md.count("| setting (final test acc, %) | FedAvg | FedAvg lr 0.2 |") == 1
    assert md.count("| setting (best test acc, %) | FedAvg | FedAvg lr 0.2 |") == 1
    parser = Cells()
    parser.feed(files["html"].read_text())
    assert len(parser.imgs) == 2 + 2 * 3  # across settings and gains, then curves, bars, comm per setting


def test_gains_figure_draws_each_methods_paired_gain_over_the_baseline():
    def cell(seeds: list[int], values: list[float]) -> dict:
        return {"n": len(seeds), "seeds": seeds, "final": {"values": values}}

    base = cell([0, 1], [0.50, 0.52])
    summary = {"settings": {
        "s1": {"metric": "acc", "baseline": "none", "methods": {
            "none": base, "A": cell([0, 1], [0.56, 0.58]), "B": cell([0, 1], [0.52, 0.54])}},
        # seed 2 has no baseline run: left out, else A's mean gain here would be 12 points, not 6
        "s2": {"metric": "acc", "baseline": "none", "methods": {
            "none": base, "A": cell([0, 1, 2], [0.56, 0.58, 0.74]), "B": {"n": 0}}},
    }}
    png = gains_png(summary)
    assert png.startswith(PNG)
    a, b = _colour_pixels(png, (255, 127, 14)), _colour_pixels(png, (44, 160, 44))  # tab10 C1, C2
    assert 5.0 < a / b < 7.0  # two 6-point bars against one 2-point bar (plus one legend patch each)
    assert _colour_pixels(png, (31, 119, 180)) == 0  # the baseline (C0) draws nothing


def test_privacy_section_shows_epsilon_per_round_only_when_a_method_declares_a_release():
    dp = {"delta": 1e-5, "unit": "sample", "model_protected": False, "rounds": [1, 2], "epsilon": [1.5, 2.25],
          "releases": {"flea features": [1.5, 2.25]}}
    setting = {"methods": {"fedavg": {"n": 2}, "flea-dp": {"n": 2, "privacy": dp}}}
    blocks = privacy_blocks(setting)
    final, per_round = [b for b in blocks if isinstance(b, Table)]
    assert final.rows == [["flea-dp", "1e-05", "sample", "2.250", "flea features 2.250", "no"]]
    assert per_round.header == ["round", "flea-dp"] and per_round.rows == [["1", "1.500"], ["2", "2.250"]]
    assert "No formal guarantee (no DP release): fedavg." in blocks[1].text
    assert privacy_blocks({"methods": {"fedavg": {"n": 2}}}) == []


def test_a_runs_privacy_curve_comes_from_its_records():
    entry = lambda eps: {"delta": 1e-5, "unit": "client", "model_protected": True,  # noqa: E731
                         "epsilon": eps, "releases": {"model update": eps}}
    run = Run(Path("."), "s", "m", 0, {}, {}, [{"round": 1, "privacy": entry(0.5)}, {"round": 2, "privacy": entry(None)}])
    p = run.privacy()
    assert (p["rounds"], p["epsilon"][0], p["model_protected"]) == ([1, 2], 0.5, True)
    assert np.isnan(p["epsilon"][1]) and np.isnan(p["releases"]["model update"][1])  # null: non-finite
    assert Run(Path("."), "s", "m", 0, {}, {}, [{"round": 1}]).privacy() is None
