"""FLea privacy analyses (Xia et al., KDD 2024, Sec. 3.3 / 4.3) on Fashion-MNIST; cached, resumable.

``nice -n 10 .venv/bin/python experiments/flea.py privacy [--rounds 20]`` trains FLea (preset
``flea_fmnist``: mean 100 samples per client, Dir(0.1)) with and without the dCor loss round by
round, records dCor(raw, features of the global model) and the feature exposure per round, then
runs the reconstruction attack on both final models and the context attack on FLea's features and
on FedMix's 10-sample means; writes ``privacy.json`` and PNGs under ``--out``.

The accuracy experiments are shipped comparison grids (docs/flea.md):
``fedaug compare flea_scarcity_fmnist --jobs 2`` and ``fedaug compare flea_smartwatch --jobs 2``.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import torch

from fedaug import load_config
from fedaug.analysis import context_attack, feature_dcor, global_model, pooled, reconstruction_attack
from fedaug.analysis.figures import save_curves, save_reconstructions
from fedaug.core.runtime import configure_process
from fedaug.engine.run import build_simulation
from fedaug.methods.aug.fedmix import batch_means
from fedaug.models.split import forward_front
from fedaug.privacy import feature_exposure, flea_schedule

#: the split of the recorded privacy figures (docs/flea.md): the preset's until issue 18, block1 since
STAGE = "block2"


def train_privacy_model(out: Path, label: str, lam2: float, rounds: int, seed: int, threads: int) -> tuple[Any, dict]:
    """FLea on the ``flea_fmnist`` preset with lambda2 = ``lam2``, round by round: dCor of the global model's
    features, test accuracy and exposure per round. Cached in ``out`` (model weights + JSON)."""
    cfg, _ = load_config("flea_fmnist", [f"method.options.flea.dcor_weight={lam2}", f"train.rounds={rounds}",
                                         f"seed={seed}", f"threads={threads}", f"method.options.flea.stage={STAGE}"])
    sim = build_simulation(cfg)
    cache, weights = out / f"{label.replace(' ', '-')}.json", out / f"{label.replace(' ', '-')}.pt"
    if cache.is_file() and weights.is_file():
        sim.model.load_state_dict(torch.load(weights))
        return sim, json.loads(cache.read_text())
    probe_x, _ = pooled(sim.data, "train", 512, seed)
    dcors, sampled, accs = [], [], []
    for r in range(1, rounds + 1):
        sampled.append(sim.run_round(r)["sampled"])
        dcors.append(feature_dcor(global_model(sim), probe_x, STAGE))
        accs.append(sim.evaluate()["mean"]["test_acc"])
        print(f"privacy | {label} | round {r} | dCor {dcors[-1]:.3f} | acc {accs[-1]:.3f}", flush=True)
    contributors, receivers = flea_schedule(sampled)
    res = {"dcor": dcors, "test_acc": accs, "exposure": feature_exposure(contributors, receivers, sim.data.num_clients)}
    torch.save(global_model(sim).state_dict(), weights)
    cache.write_text(json.dumps(res))
    return sim, res


def privacy(out: Path, rounds: int, seed: int, threads: int) -> dict[str, Any]:
    """dCor and exposure over rounds with / without the dCor loss, then the two attacks."""
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    models = {}
    for label, lam2 in (("with dCor", 3.0), ("without dCor", 0.0)):
        sim, result[label] = train_privacy_model(out, label, lam2, rounds, seed, threads)
        models[label] = copy.deepcopy(sim.model).eval()
    data = sim.data
    n_test = sum(len(c.test) for c in data.clients)
    x, _ = pooled(data, "test", n_test, seed)  # the attacker's data: never trained on
    cut = 3 * n_test // 4
    recs = {}
    for label, model in models.items():
        with torch.no_grad():
            f = forward_front(model, x, STAGE)
        res = reconstruction_attack(f[:cut], x[:cut], f[cut:], x[cut:], epochs=20, seed=seed)
        result[label]["reconstruction_mse"], result[label]["reconstruction_train_mse"] = res.mse, res.train_mse
        recs[label] = res.reconstructions
    save_reconstructions(out / "reconstruction.png", x[cut:], recs)
    sizes = [10, 30, 100, 300, 1000]
    x_ctx, _ = pooled(data, "train", 1500, seed)
    result["context"] = {
        f"FLea ({label})": context_attack(lambda g, m=model: forward_front(m, g.squeeze(1), STAGE), x_ctx,
                                          train_sizes=sizes, test_size=500, seed=seed)
        for label, model in models.items()}
    x_many, _ = pooled(data, "train", 6000, seed)
    y_dummy = torch.zeros(10, 1)
    result["context"]["FedMix (10-sample means)"] = context_attack(
        lambda g: torch.stack([batch_means(s, y_dummy, 10, torch.arange(10))[0][0] for s in g]), x_many,
        train_sizes=[n for n in sizes if 10 * (n + 50) <= 6000], test_size=50, group_size=10, seed=seed)
    (out / "privacy.json").write_text(json.dumps(result, indent=1))
    ts = list(range(1, rounds + 1))
    save_curves(out / "dcor.png", {k: (ts, result[k]["dcor"]) for k in models}, xlabel="round", ylabel="dCor^2(x, f)")
    save_curves(out / "exposure.png", {"FLea": (ts, result["with dCor"]["exposure"])}, xlabel="round",
                ylabel="feature exposure eps(t)")
    save_curves(out / "context.png", {k: ([p["train_size"] for p in v], [p["accuracy"] for p in v])
                                      for k, v in result["context"].items()},
                xlabel="attacker training samples", ylabel="context accuracy", logx=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("privacy")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/flea"))
    p.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    configure_process(args.threads)  # a script is a process entry point
    res = privacy(args.out / "privacy", args.rounds, args.seed, args.threads)
    print(json.dumps({k: v.get("reconstruction_mse") for k, v in res.items() if isinstance(v, dict)}))


if __name__ == "__main__":
    main()
