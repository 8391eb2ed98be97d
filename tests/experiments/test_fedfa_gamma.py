"""experiments/fedfa_gamma.py on a tiny synthetic federation: one row per FFA layer and round, with the
server's client-sharing variances (Eq. 5) and their t-modulation (Eq. 6) recomputed independently."""

from __future__ import annotations

from fedaug.config.load import load_config
from fedaug.engine.run import build_simulation
from tests.experiments.scripts import load_script

TINY = ["data.name=synthetic", "data.options={num_clients = 3, samples_per_client = 48, num_classes = 4, size = 8}",
        "model.options={width = 8}", "train.local_steps=2", "train.batch_size=16", "train.participation=1.0"]


def test_rows_hold_the_servers_variances_and_their_t_modulation():
    script = load_script("fedfa_gamma")
    rows = script.measure("digits4", [1, 2], TINY)
    layers = ["block1", "block2", "block3", "block4"]
    assert [(r["round"], r["layer"]) for r in rows] == [(r, n) for r in (1, 2) for n in layers]

    # the same run again, to the second round: its server state is what the rows summarise
    cfg, _ = load_config("digits4", [*script.OVERRIDES, *TINY, "train.rounds=2"])
    sim = build_simulation(cfg)
    sim.run_round(1)
    sim.run_round(2)
    for row in rows[4:]:
        var = sim.server["fedfa"]["part"][f"{row['layer']}.var_mu"].double()
        c = var.numel()
        t = 1.0 / (1.0 + 1.0 / var)  # Eq. 6 by hand: C t_j / sum_c t_c
        gamma = c * t / t.sum()
        assert row["channels"] == c == 8
        assert row["var_mu"] == float(var.median()) and row["var_mu_max"] == float(var.max()) > 0
        assert abs(row["gamma_max"] - float(gamma.max())) < 1e-9 and abs(row["gamma_min"] - float(gamma.min())) < 1e-9
        assert row["gamma_min"] <= 1.0 <= row["gamma_max"]  # gamma's mean over channels is 1
        assert row["over_2"] == float((gamma > 2).double().mean())
    text = script.table(rows)
    assert text.count("\n") == 2 + len(rows) and "| 2 | block4 | 8 |" in text
