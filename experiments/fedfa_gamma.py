"""What FedFA's adaptive fusion does on a preset: the client-sharing variances and their t-modulation, per layer.

FedFA's server computes, per FFA layer and channel j, the client-sharing variances of the clients'
running channel means and stds (Eq. 5, ``Sigma^2_mu``, ``Sigma^2_sigma``, shape ``(C,)``) and modulates
them with a Student's t kernel, ``gamma_j = C (1 + 1/Sigma^2_j)^-1 / sum_c (1 + 1/Sigma^2_c)^-1``
(Eq. 6, mean 1 over the channels). A client then samples with variance ``(gamma + 1) * v`` (Eq. 7,
adaptive fusion; ``v`` its batch variance of the statistic), where the Table 7 baseline "direct fusion"
uses ``(Sigma^2 + 1) * v`` and FedFA-C ``v``. So the size of ``Sigma^2`` decides what direct fusion adds
over FedFA-C, and the spread of ``gamma`` how much adaptive fusion favours some channels.

The script trains the preset with FedFA's direct variant (the server then sends ``Sigma^2`` itself,
and gamma is computed from it exactly as the fused variant's server does) for ``--rounds`` rounds and
prints, after each round asked, per layer: the median and largest ``Sigma^2_mu`` and ``Sigma^2_sigma``,
and the median, smallest and largest ``gamma_mu``, and the share of channels with ``gamma_mu > 2``.

    .venv/bin/python experiments/fedfa_gamma.py [--preset digits4] [--rounds 1 5 10] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from fedaug.config.load import load_config
from fedaug.engine.run import build_simulation
from fedaug.layers.functional import t_modulation

#: the Digits-4 grids' data option (docs/results.md); FedFA with its server sending Sigma^2 (Eq. 5)
OVERRIDES = ["data.options.usps_style=v2", "method.augs=[fedfa]", "method.options.fedfa.variance=direct"]


def measure(preset: str, rounds: list[int], overrides: list[str]) -> list[dict[str, float | int | str]]:
    """One row per FFA layer and per entry of ``rounds`` (after that many rounds of one simulation)."""
    cfg, _ = load_config(preset, [*OVERRIDES, *overrides, f"train.rounds={max(rounds)}"])
    sim = build_simulation(cfg)
    rows: list[dict[str, float | int | str]] = []
    for r in range(1, max(rounds) + 1):
        sim.run_round(r)
        if r not in rounds:
            continue
        part = sim.server["fedfa"]["part"]
        for key in sorted(k for k in part if k.endswith(".var_mu")):
            layer = key.removesuffix(".var_mu")
            var_mu, var_sigma = part[key].double(), part[f"{layer}.var_sigma"].double()
            gamma = t_modulation(var_mu)
            rows.append({"round": r, "layer": layer, "channels": var_mu.numel(),
                         "var_mu": float(var_mu.median()), "var_mu_max": float(var_mu.max()),
                         "var_sigma": float(var_sigma.median()), "var_sigma_max": float(var_sigma.max()),
                         "gamma": float(gamma.median()), "gamma_min": float(gamma.min()),
                         "gamma_max": float(gamma.max()), "over_2": float((gamma > 2).double().mean())})
    return rows


def table(rows: list[dict[str, float | int | str]]) -> str:
    """The Markdown table of :func:`measure`'s rows."""
    head = ("| after round | layer | C | Sigma^2_mu median (max) | Sigma^2_sigma median (max) | gamma_mu median "
            "(min-max) | gamma_mu > 2 |\n|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['round']} | {r['layer']} | {r['channels']} | {r['var_mu']:.2g} ({r['var_mu_max']:.2g}) "
        f"| {r['var_sigma']:.2g} ({r['var_sigma_max']:.2g}) | {r['gamma']:.2f} ({r['gamma_min']:.2f}-"
        f"{r['gamma_max']:.2f}) | {100 * r['over_2']:.0f} % |\n" for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="digits4", help="the preset FedFA runs on (default %(default)s)")
    p.add_argument("--rounds", type=int, nargs="+", default=[1, 5, 10], help="measure after these many rounds")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="further config overrides")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(table(measure(args.preset, args.rounds, args.set)) + f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
