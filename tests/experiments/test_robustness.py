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
                    "robustness-stats-direct": 36, "robustness-inbound": 72, "robustness-screen": 342}
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


def test_the_screening_grid_runs_each_column_on_2_3_and_8_clients():
    rob = load_script("robustness")
    screen = rob.grids(RULES, [0])["robustness-screen"].settings
    assert "2 clients | krum | none" not in screen and "2 clients | fedavg, off | free-riders, majority" not in screen
    cell = screen["8 clients | fedavg, reject at 5 x | free-riders, majority"]
    assert cell["attack"] == {"kind": "free_ride", "clients": [0, 1, 2, 3, 4]}
    assert cell["trust"] == {"screen": "reject", "screen_multiple": 5.0} and cell["method"] == {"base": "fedavg"}
    assert cell["data"]["options"] == {"num_clients": 8, "samples_per_client": 48, "num_classes": 4, "size": 8}
    assert screen["3 clients | trimmed_mean | boost x10"]["method"]["options"] == {"trimmed_mean": {"beta": 0.34}}
    assert screen["8 clients | krum | small x0.05"]["method"]["options"] == {"krum": {"f": 1}}
    assert screen["2 clients | median | boost x3"]["attack"] == {"kind": "scale", "scale": 3.0, "clients": [0]}
    assert screen["3 clients | median | boost x3"]["trust"] == {"screen": "off"}  # the robust rules alone


def _run_with(directory, records):
    """A finished-looking run directory holding ``records`` (one per round) under a cell's directory."""
    run = directory / "fedavg-1"
    run.mkdir(parents=True)
    (run / "config.toml").write_text("")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_screen_decisions_count_the_uploads_the_screening_rejected_or_clipped(tmp_path):
    rob = load_script("robustness")
    label = "3 clients | fedavg, reject | boost x10"
    rejected = {"client": 0, "phase": "train", "reason": "round 1: uplink of client 0, part 'fedavg', parameters: "
                                                         "update norm 3 is 12 times ..."}
    invalid = {"client": 2, "phase": "train", "reason": "round 2: uplink of client 2, part 'fedavg': 'w' holds NaN"}
    _run_with(rob.cell_dir(tmp_path / "robustness-screen", label, "FedAvg", 0), [
        {"round": 1, "sampled": [0, 1, 2], "rejected": [rejected]},
        {"round": 2, "sampled": [0, 1, 2], "rejected": [invalid]},  # not the screening's
        {"round": 3, "sampled": [1, 2], "rejected": [], "updates": {"clipped": [1]}}])
    assert rob.screened_uploads(tmp_path, label, [0, 1], {0}) == {  # seed 1 never ran
        "attackers": 1, "attackers_sent": 2, "honest": 1, "honest_sent": 6}
    write_grid_file(rob.grids(RULES, [0])["robustness-screen"], tmp_path / "robustness-screen")
    lines = rob.screen_decisions(tmp_path, [0]).splitlines()
    assert lines[0].startswith("| clients | attack | fedavg, reject: attackers' | fedavg, reject: honest |")
    assert "| 3 | boost x10 | 1/2 | 1/6 | - | 0/0 | - | 0/0 |" in lines  # the other columns never ran


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
