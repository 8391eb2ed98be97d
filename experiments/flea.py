"""FLea experiments (Xia et al., KDD 2024): accuracy grids and privacy analyses; resumable.

Accuracy: ``nice -n 10 .venv/bin/python experiments/flea.py grid SETTING [--seeds 0 1 2] [--methods ...]``
runs one run directory per (setting, method, seed) under ``--out`` (default ``runs/flea``); a
finished cell (``summary.json``) is skipped, an interrupted one resumed from its newest checkpoint.
``... grid SETTING --table`` prints final and best test accuracy, mean +/- std over seeds.
SETTINGs: ``fmnist-d100-dir``, ``fmnist-d50-dir``, ``fmnist-d100-qua2``, ``fmnist-d50-qua2``
(Fashion-MNIST, 6,000-image stand-in scale, see the ``flea_fmnist`` preset) and ``smartwatch``
(smartwatch IMU, 4 clients per subject = 40 clients).

Privacy: ``... privacy [--rounds 20]`` trains FLea with and without the dCor loss on
``fmnist-d100-dir`` round by round, records dCor(raw, features of the global model) and the
feature exposure per round, then runs the reconstruction attack on both final models and the
context attack on FLea's features and on FedMix's 10-sample means; writes ``privacy.json`` and PNGs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fedaug import load_config
from fedaug.config.schema import validate
from fedaug.engine.simulate import build_simulation, resume_experiment, run_experiment
from fedaug.methods.aug.fedmix import batch_means
from fedaug.models.split import forward_front
from fedaug.privacy import context_attack, feature_exposure, flea_schedule, reconstruction_attack
from fedaug.privacy.figures import save_curves, save_reconstructions
from fedaug.privacy.probe import feature_dcor, global_model, pooled

FMNIST = {
    "fmnist-d100-dir": [],
    "fmnist-d50-dir": ["data.options.mean_size=50"],
    "fmnist-d100-qua2": ["data.options.partition=quantity", "data.options.q=2", "data.options.num_clients=60",
                         "data.options.mean_size=100"],
    "fmnist-d50-qua2": ["data.options.partition=quantity", "data.options.q=2", "data.options.num_clients=120"],
}
SMARTWATCH = {"data": {"name": "smartwatch_imu", "options": {"clients_per_subject": 4}},
              "model": {"name": "cnn1d"}, "method": {"base": "fedavg", "augs": [], "options": {}}}
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"base": "fedavg", "augs": [], "options": {}},
    "FedProx": {"base": "fedprox", "augs": [], "options": {"fedprox": {"mu": 0.01}}},
    "FedMix": {"base": "fedavg", "augs": ["fedmix"], "options": {"fedmix": {"lam": 0.05, "mean_batch": 10}}},
    "FedData": {"base": "fedavg", "augs": ["feddata"], "options": {"feddata": {"fraction": 0.1}}},
    "FLea": {"base": "fedavg", "augs": ["flea"], "options": {"flea": {}}},
}


def setting_raw(setting: str) -> dict[str, Any]:
    """The setting's config as a nested dict (the preset plus overrides; FLea's stage per model)."""
    cfg, _ = load_config("flea_fmnist", FMNIST.get(setting, []))
    raw = cfg.to_dict()
    if setting == "smartwatch":
        raw.update(copy.deepcopy(SMARTWATCH))
        raw["eval"]["best_by"] = "test"
    elif setting not in FMNIST:
        raise SystemExit(f"unknown setting {setting!r}; choose from {', '.join([*FMNIST, 'smartwatch'])}")
    if raw["data"]["options"].get("partition") == "quantity":  # the preset's scarcity-only options
        for key in ("mean_size", "alpha"):
            raw["data"]["options"].pop(key, None)
    return raw


def method_raw(setting: str, label: str) -> dict[str, Any]:
    m = copy.deepcopy(METHODS[label])
    if label == "FLea":
        m["options"]["flea"]["stage"] = "block1" if setting == "smartwatch" else "block2"
    return m


def run_cell(setting: str, label: str, seed: int, out: Path, threads: int) -> dict[str, Any]:
    """Run, resume or skip one (setting, method, seed) cell; return its summary."""
    cell = out / setting / f"{label.lower()}-s{seed}"
    done = sorted(cell.glob("*/summary.json"))
    if done:
        return json.loads(done[-1].read_text())
    started = sorted(p for p in cell.glob("*") if (p / "config.toml").is_file())
    t0 = time.time()
    if started:
        summary, _ = resume_experiment(str(started[-1]), quiet=True)
    else:
        raw = setting_raw(setting)
        raw.update(method=method_raw(setting, label), seed=seed, out_dir=str(cell), name=label.lower(), threads=threads)
        summary, _ = run_experiment(validate(raw), quiet=True)
    acc = summary["final"]["eval"]["mean"]["test_acc"]
    print(f"{setting} | {label} | seed {seed} | final {acc:.4f} | {time.time() - t0:.0f} s", flush=True)
    return summary


def table(setting: str, seeds: list[int], out: Path) -> str:
    """Markdown: final and best (by test, over rounds; the paper's metric) accuracy, mean +/- std."""
    rows = ["| method | seeds | final test acc | best test acc |", "|---|---:|---|---|"]
    for label in METHODS:
        finals, bests = [], []
        for seed in seeds:
            for path in sorted((out / setting / f"{label.lower()}-s{seed}").glob("*/summary.json"))[-1:]:
                s = json.loads(path.read_text())
                finals.append(s["final"]["eval"]["mean"]["test_acc"])
                bests.append(s["best"]["eval"]["mean"]["test_acc"])

        def fmt(v: list[float]) -> str:
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            return f"{100 * statistics.mean(v):.2f} +/- {100 * sd:.2f}"

        rows.append(f"| {label} | {len(finals)} | {fmt(finals)} | {fmt(bests)} |" if finals
                    else f"| {label} | 0 | not run | not run |")
    return "\n".join(rows)


def train_privacy_model(out: Path, label: str, lam2: float, rounds: int, seed: int, threads: int) -> tuple[Any, dict]:
    """FLea on ``fmnist-d100-dir`` with lambda2 = ``lam2``, round by round: dCor of the global model's
    features, test accuracy and exposure per round. Cached in ``out`` (model weights + JSON)."""
    raw = setting_raw("fmnist-d100-dir")
    raw.update(method=method_raw("fmnist-d100-dir", "FLea"), seed=seed, threads=threads)
    raw["method"]["options"]["flea"]["dcor_weight"] = lam2
    raw["train"]["rounds"] = rounds
    sim = build_simulation(validate(raw))
    cache, weights = out / f"{label.replace(' ', '-')}.json", out / f"{label.replace(' ', '-')}.pt"
    if cache.is_file() and weights.is_file():
        sim.model.load_state_dict(torch.load(weights))
        return sim, json.loads(cache.read_text())
    probe_x, _ = pooled(sim.data, "train", 512, seed)
    dcors, sampled, accs = [], [], []
    for r in range(1, rounds + 1):
        sampled.append(sim.run_round(r)["sampled"])
        dcors.append(feature_dcor(global_model(sim), probe_x, "block2"))
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
            f = forward_front(model, x, "block2")
        res = reconstruction_attack(f[:cut], x[:cut], f[cut:], x[cut:], epochs=20, seed=seed)
        result[label]["reconstruction_mse"], result[label]["reconstruction_train_mse"] = res.mse, res.train_mse
        recs[label] = res.reconstructions
    save_reconstructions(out / "reconstruction.png", x[cut:], recs)
    sizes = [10, 30, 100, 300, 1000]
    x_ctx, _ = pooled(data, "train", 1500, seed)
    result["context"] = {
        f"FLea ({label})": context_attack(lambda g, m=model: forward_front(m, g.squeeze(1), "block2"), x_ctx,
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
    g = sub.add_parser("grid")
    g.add_argument("setting")
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    g.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    g.add_argument("--table", action="store_true")
    p = sub.add_parser("privacy")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    for q in (g, p):
        q.add_argument("--out", type=Path, default=Path("runs/flea"))
        q.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.cmd == "privacy":
        res = privacy(args.out / "privacy", args.rounds, args.seed, args.threads)
        print(json.dumps({k: v.get("reconstruction_mse") for k, v in res.items() if isinstance(v, dict)}))
        return
    if not args.table:
        for seed in args.seeds:
            for label in args.methods:
                run_cell(args.setting, label, seed, args.out, args.threads)
    print(table(args.setting, args.seeds, args.out))


if __name__ == "__main__":
    main()
