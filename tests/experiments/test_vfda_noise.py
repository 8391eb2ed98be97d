"""experiments/vfda_noise.py on a tiny synthetic federation with VFDA: each row's noise-to-sigma ratios
(Eq. 6, Eq. 7 and the ablation w/o Global) recomputed independently from the global model's features
and the server's variances (Eq. 3 and Eq. 5), and the table's columns."""

from __future__ import annotations

import statistics

import torch

from fedaug.config.load import load_config
from fedaug.engine.run import build_simulation
from fedaug.models import build_model
from tests.experiments.scripts import load_script

TINY = ["data.name=synthetic", "data.options={num_clients = 3, samples_per_client = 48, num_classes = 4, size = 8}",
        "model.options={width = 8}", "train.local_steps=2", "train.batch_size=16", "train.participation=1.0",
        'method.augs=["vfda"]', 'method.options={vfda = {at = ["block1", "block2"]}}']


def test_rows_are_the_noise_ratios_of_the_three_readings():
    script = load_script("vfda_noise")
    rows = script.measure("digits4", 0, [1], TINY)
    assert [r["layer"] for r in rows] == ["block1", "block2"]

    cfg, _ = load_config("digits4", [*TINY, "train.rounds=1"])
    sim = build_simulation(cfg)
    sim.run_round(1)
    model = build_model(cfg.model.name, sim.data.input_shape[0], sim.data.num_classes, **cfg.model.options)
    model.load_state_dict(sim.server["fedavg"]["weights"], strict=False)
    model.train()
    for row in rows:
        layer = model.get_submodule(row["layer"])
        feats = []
        handle = layer.register_forward_hook(lambda m, i, o: feats.append(o.detach().double()))
        with torch.no_grad():
            for client in sim.data.clients:
                model(client.train.x[:16].float())
        handle.remove()
        ratios: dict[str, list[float]] = {k: [] for k in script.SCALES}
        for z in feats:
            flat = z.flatten(2)
            mu, sigma = flat.mean(2), (flat.var(2, unbiased=False) + 1e-6).sqrt()  # (B, C), Eq. 2
            for stat, s in (("mu", mu), ("sigma", sigma)):
                v = ((s - s.mean(0)) ** 2).mean(0)  # Eq. 3, 1/B
                g = sim.server["vfda"]["part"][f"{row['layer']}.var_{stat}"].double()  # Eq. 5
                for name, scale in (("std", (g * v).sqrt()), ("var", g * v), ("client", v.sqrt())):
                    ratios[f"{name}_{stat}"] += (scale / sigma.mean(0)).tolist()
        assert row["channels"] == feats[0].shape[1]
        for key in script.SCALES:
            assert abs(row[key] - statistics.median(ratios[key])) <= 1e-4 * abs(row[key]), key
        # the product with the global variance (far below 1 here) shrinks the noise: the ablation's is larger
        assert row["client_mu"] > row["std_mu"] > row["var_mu"]


def test_table_puts_each_ratio_under_its_column():
    script = load_script("vfda_noise")
    row = {"preset": "p", "round": 3, "layer": "enc1", "channels": 8, "sigma": 0.5, "below_std": 0.0,
           "below_var": 0.25, **{k: float(i + 1) for i, k in enumerate(script.SCALES)}}
    head, rule, line = script.table([row]).splitlines()
    cells = [c.strip() for c in line.strip("|").split("|")]
    names = [c.strip() for c in head.strip("|").split("|")]
    assert len(cells) == len(names) == rule.count("---")
    by_name = dict(zip(names, cells))
    assert by_name["w/o Global (std): s_mu / sigma"] == "5.00e+00"
    assert by_name["Eq. 7 (variance): s_mu / sigma"] == "3.00e+00"
    assert by_name["below float32, variance"] == "25.0 %"
