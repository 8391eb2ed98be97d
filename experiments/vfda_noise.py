"""How large is VFDA's injected noise next to the features' own spread? Eq. 6 vs Eq. 7 (issue 18).

VFDA (Huang et al. 2023) resamples each sample's channel statistics, ``mu_hat = mu + eps * s`` and
``sigma_hat = sigma + eps * s``, with the sampling variance ``f = var_global * v_local`` (product
fusion; ``v_local`` the batch variance of the statistic, Eq. 3; ``var_global`` the variance of the
clients' running statistics, Eq. 5). Eq. 6 writes the draw as ``N(mu, Sigma^2)``, a standard deviation
``s = sqrt(f)`` (``noise_scale = "std"``); Eq. 7 multiplies ``eps`` by ``f`` itself, a variance
(``noise_scale = "variance"``, fedaug's default until issue 18). This script measures ``s / sigma`` per FFA layer
under both readings on the VFDA presets' models and data, built as ``fedaug run`` builds them:

1. the preset (plus any ``--set`` overrides) trained for ``--rounds`` rounds (default 1) of ``--steps``
   local steps (default 5; ``--steps 0`` keeps the preset's local epochs), so every client has
   running statistics and the server its variances (``var_mu``, ``var_sigma``) from the last round;
2. the last round's global model (without FFA layers), in training mode as the FFA layers see it, on one
   training batch per client: per layer, each sample's channel mean ``mu`` and std ``sigma``
   ``(B, C)``, their batch variances ``v`` ``(C,)`` (the paper's 1/B), ``f = var_global * v``;
3. per layer, the median over clients and channels of ``s_mu / sigma_bar`` and ``s_sigma / sigma_bar``
   (``sigma_bar`` the batch mean of sigma), and the share of (sample, channel) means whose noise
   is below float32 resolution (``s_mu < 2^-24 |mu|``: adding it changes nothing); and the same ratios
   for the ablation w/o Global (``f = v``, no server variance, the std reading).

    PYTHONPATH=src .venv/bin/python experiments/vfda_noise.py [--steps 5] [--rounds 1] [--out table.md]
    # the multi-site 3D stand-in, after 1 and 10 rounds of full local epochs:
    PYTHONPATH=src .venv/bin/python experiments/vfda_noise.py --presets vfda_brain_mri_3d --steps 0 \
        --rounds 1 10 --set data.options.scanners=4 data.options.spacing=1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch import Tensor

from fedaug.config.load import load_config
from fedaug.config.schema import RunConfig
from fedaug.engine.run import Simulation, build_simulation
from fedaug.layers.functional import channel_stats
from fedaug.models import build_model

PRESETS = ("vfda_brain_mri_3d", "vfda_brain_mri_2d")
STEPS = 5
#: the measured noise scales: Eq. 6 (std) and Eq. 7 (variance) of the product fusion, and the ablation
#: w/o Global (``variance = "client"``: ``f = v``, std reading), each for the channel mean and std
SCALES = ("std_mu", "std_sigma", "var_mu", "var_sigma", "client_mu", "client_sigma")
F32_RESOLUTION = 2.0**-24  # half an ulp of 1.0 in float32: a relative change below it rounds away


def measure(preset: str, steps: int, rounds: list[int], overrides: list[str]) -> list[dict[str, float | int | str]]:
    """One row per FFA layer of ``preset`` and per entry of ``rounds`` (measured after that many rounds
    of ``steps`` local steps, 0: the preset's epochs, in one simulation): medians over clients and
    channels (see the module docstring)."""
    cfg, _ = load_config(preset, [*overrides, f"train.rounds={max(rounds)}",
                                  *([f"train.local_steps={steps}"] if steps else [])])
    sim = build_simulation(cfg)
    rows = []
    for r in range(1, max(rounds) + 1):
        sim.run_round(r)
        if r in rounds:
            rows += measure_now(sim, cfg, preset, r)
    return rows


def measure_now(sim: Simulation, cfg: RunConfig, preset: str, rnd: int) -> list[dict[str, float | int | str]]:
    """The rows of :func:`measure` for the simulation's current global model and server variances."""
    data, vfda_opts = sim.data, cfg.method.options.get("vfda", {})
    eps = float(vfda_opts.get("eps", 1e-6))
    model = build_model(cfg.model.name, data.input_shape[0], data.num_classes, **cfg.model.options)
    model.load_state_dict(sim.server["fedavg"]["weights"], strict=False)
    model.train()
    layers = list(vfda_opts.get("at") or model.feature_stages)
    part = sim.server["vfda"]["part"]
    captured: dict[str, Tensor] = {}
    handles = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: captured.__setitem__(n, o.detach()))
               for n in layers]
    per_layer: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in (*SCALES, "below_std", "below_var", "sigma")} for n in layers}
    with torch.no_grad():
        for client in data.clients:
            model(client.train.x[: cfg.train.batch_size].float())
            for n in layers:
                mu, sigma = channel_stats(captured[n], eps=eps)
                sigma_bar = sigma.mean(0)
                rec = per_layer[n]
                rec["sigma"] += sigma_bar.tolist()
                for stat, z in (("mu", mu), ("sigma", sigma)):
                    v = z.var(0, unbiased=False)  # (C,)
                    f = part[f"{n}.var_{stat}"] * v  # product fusion
                    for reading, s in (("std", f.sqrt()), ("var", f), ("client", v.sqrt())):
                        rec[f"{reading}_{stat}"] += (s / sigma_bar).tolist()
                        if stat == "mu" and reading != "client":
                            below = (s[None, :] < F32_RESOLUTION * mu.abs()).float().mean()
                            rec[f"below_{reading}"].append(float(below))
    for h in handles:
        h.remove()
    rows = []
    for n in layers:
        rec = per_layer[n]
        rows.append({"preset": preset, "round": rnd, "layer": n, "channels": int(captured[n].shape[1]),
                     "sigma": statistics.median(rec["sigma"]),
                     **{k: statistics.median(rec[k]) for k in SCALES},
                     "below_std": statistics.mean(rec["below_std"]), "below_var": statistics.mean(rec["below_var"])})
    return rows


def table(rows: list[dict[str, float | int | str]]) -> str:
    """The Markdown table of :func:`measure`'s rows."""
    head = ("| preset | after round | layer | C | median sigma | Eq. 6 (std): s_mu / sigma | s_sigma / sigma | Eq. 7 (variance): "
            "s_mu / sigma | s_sigma / sigma | w/o Global (std): s_mu / sigma | s_sigma / sigma "
            "| below float32, std | below float32, variance |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['preset']} | {r['round']} | {r['layer']} | {r['channels']} | {r['sigma']:.3g} "
        + "".join(f"| {r[k]:.2e} " for k in SCALES)
        + f"| {100 * r['below_std']:.1f} % | {100 * r['below_var']:.1f} % |\n"
        for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=STEPS, help="local steps of the one round (default %(default)s)")
    p.add_argument("--rounds", type=int, nargs="+", default=[1], help="measure after each of these many rounds")
    p.add_argument("--presets", nargs="+", default=list(PRESETS), help="VFDA presets (default %(default)s)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every preset")
    p.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = p.parse_args()
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    rows = [r for preset in args.presets for r in measure(preset, args.steps, args.rounds, args.set)]
    text = table(rows)
    print(text + f"\n({time.perf_counter() - t0:.0f} s)")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
