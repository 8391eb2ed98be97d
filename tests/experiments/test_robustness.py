"""experiments/robustness.py: the grid's size and shape, and the table's cells (collapsed runs included)."""

from __future__ import annotations

import json

from fedaug.report.runner import write_grid_file
from tests.experiments.scripts import load_script

RULES = ["fedavg", "median", "trimmed_mean", "krum"]


def test_grid_sizes_and_shape():
    rob = load_script("robustness")
    specs = rob.grids(RULES, [0, 1, 2])
    runs = {name: len(s.settings) * len(s.methods) * len(s.seeds) for name, s in specs.items()}
    assert runs == {"robustness": 828, "robustness-stats": 96, "robustness-features": 96, "robustness-stats-clean": 24,
                    "robustness-stats-direct": 36, "robustness-inbound": 72}
    assert all(s.common["trust"] == {"screen": "off"} for s in specs.values())  # the rules alone ...
    inbound = specs["robustness-inbound"].settings  # ... but where the in-bound grid turns the screening on
    assert [k for k in inbound if k.startswith("Digits-4")] == [
        f"Digits-4 | {rule} | screen={screen} | {kind}" for screen, rule in
        [("off", "fedavg"), ("off", "median"), ("off", "trimmed_mean"), ("off", "krum"), ("reject", "fedavg"),
         ("clip", "fedavg")] for kind in ("none", "fill")]
    cell = inbound["Digits-4 | fedavg | screen=clip | fill"]
    assert cell["trust"] == {"screen": "clip"} and cell["attack"] == {"kind": "fill", "fraction": 1 / 8}
    direct = specs["robustness-stats-direct"]
    assert list(direct.settings) == [f"{d} | fedavg | {k}" for d in rob.DATASETS
                                     for k in ("none | 0", "stats | 1", "stats | 25 %")]
    assert direct.methods["FedFA direct, median stats"]["method"]["options"]["fedfa"] == {
        "variance": "direct", "stats_rule": "median"}
    main = specs["robustness"].settings
    assert "Digits-4 | median | nan | 1" in main and "Digits-4 | median | inf | 1" not in main  # inf as nan
    cell = main["Fashion-MNIST Dir(0.3) | krum | scale | 25 %"]
    assert cell["attack"] == {"kind": "scale", "fraction": 0.25}
    assert cell["method"] == {"base": "krum", "options": {"krum": {"f": 2}}}
    assert cell["train"] == {"local_steps": 5} and main["Digits-4 | fedavg | none | 0"]["train"] == {"local_steps": 10}
    assert list(specs["robustness-stats"].methods) == ["FedFA", "FedFA, median stats"]
    assert list(specs["robustness-features"].methods) == ["FedFA", "FLea"]


def test_cell_text():
    rob = load_script("robustness")
    stat = {"n": 2, "final": {"mean": 0.5, "std": 0.01}}
    assert rob._cell(stat, 0.6, 3) == "50.00 ± 1.00 (-10.0) [n=2]"
    assert rob._cell(stat, 0.6, 3, collapsed=1) == "50.00 ± 1.00 (-10.0), collapsed 1/3"
    assert rob._cell({"n": 0}, None, 3, collapsed=3) == "collapsed 3/3"
    assert rob._cell({"n": 0}, None, 3) == "-"


def test_table_shows_collapsed_runs_and_what_an_attack_cannot_hit(tmp_path):
    rob = load_script("robustness")
    specs = rob.grids(RULES, [0])
    write_grid_file(specs["robustness"], tmp_path / "robustness")
    label = "Digits-4 | fedavg | scale | 25 %"
    (tmp_path / "robustness" / rob.COLLAPSED).write_text(json.dumps(
        {f"{label} | FLea | seed 0": {"setting": label, "method": "FLea", "seed": 0, "error": "round 6: ..."}}))
    lines = rob.table(tmp_path, RULES, [0]).splitlines()
    assert lines[0] == "| dataset | server rule | attack | attackers | FedAvg | FedFA | FLea | FedFA, median stats |"
    assert "| Digits-4 | fedavg | scale | 25 % | - | - | collapsed 1/1 |  |" in lines
    # FedAvg shares no statistics, FLea none either; only FedFA (and its robust variant) can be hit
    assert "| Digits-4 | median | stats | 1 | n/a | - | n/a | - |" in lines
    assert "| Digits-4 | median | features | 1 | n/a | - | - |  |" in lines


def test_direct_table_counts_collapsed_runs(tmp_path):
    rob = load_script("robustness")
    spec = rob.grids(RULES, [0, 1])["robustness-stats-direct"]
    write_grid_file(spec, tmp_path / spec.name)
    label = "Fashion-MNIST Dir(0.3) | fedavg | stats | 25 %"
    (tmp_path / spec.name / rob.COLLAPSED).write_text(json.dumps(
        {f"{label} | FedFA direct | seed {k}": {"setting": label, "method": "FedFA direct", "seed": k, "error": "..."}
         for k in (0, 1, 2)}))  # seed 2 is not asked for
    lines = rob.direct_table(tmp_path, [0, 1]).splitlines()
    assert lines[0] == "| dataset | attack | attackers | FedFA direct | FedFA direct, median stats |"
    assert "| Fashion-MNIST Dir(0.3) | stats | 25 % | collapsed 2/2 | - |" in lines
    assert rob.direct_table(tmp_path / "elsewhere", [0, 1]) == ""
