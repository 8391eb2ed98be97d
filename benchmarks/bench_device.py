"""Engine vs bare PyTorch loop per device and precision (issue 17; not a test: it reports).

For each model (small_cnn on Digits-4 shapes 3x28x28, alexnet_bn on 3x256x256, mobilenetv2_cifar on
3x32x32, unet3d on synthetic 1x16^3 volumes segmented by intensity, tests/engine/toyseg.py: no data set
needed), device (cpu; cuda
when present) and precision ("32", "bf16-mixed"; "16-mixed" on CUDA), it measures the median per-round
training time of

* the engine: a FedAvg round of 2 clients x ``steps`` local steps (evaluation excluded);
* a bare loop: the same model, data, optimiser and steps on the same device, with the global
  weights loaded per client (``load_state_dict``, a new optimiser) and averaged afterwards (float64
  temporaries), and nothing else: the floor before issue 46;
* the lean loop (issue 46, the floor): the same work the leanest honest way: FedAvg's start and average
  in place (benchmarks/lean.py: one optimiser whose state is cleared per client, a float32 sum), the
  mini-batches drawn on the device (no host synchronisation per step), a GradScaler for "16-mixed";

their ratios (engine / bare and engine / lean, per repeat, then the median), plus the data-transfer share
of an engine round: the time to move the round's clients' training splits to the device (pinned, non
blocking, synchronised) over the round time (0 on the CPU: nothing moves). The three alternate within each
repeat, in this process, so machine noise hits them all.

Run: ``PYTHONPATH=src:. .venv/bin/python benchmarks/bench_device.py --quick [--devices cuda]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from lean import LeanAverage  # benchmarks/lean.py (this script's folder is on the path)

from fedaug.config.schema import RunConfig, validate
from fedaug.core.device import (autocast, available_devices, environment, grad_scaler, module_device,
                                resolve_device)
from fedaug.engine.run import Simulation, build_simulation
from fedaug.methods.base.fedavg import weighted_average
from fedaug.methods.recipe import build_recipe
from fedaug.models.registry import build_model
from tests.engine.toyseg import toy_segmentation  # the repository's root on the path (Run, below)

#: model -> (dataset, dataset options, batch size)
MODELS: dict[str, tuple[str, dict[str, Any], int]] = {
    "small_cnn": ("synthetic", {"num_clients": 2, "samples_per_client": 64, "num_classes": 10, "channels": 3,
                                "size": 28}, 32),
    "alexnet_bn": ("synthetic", {"num_clients": 2, "samples_per_client": 24, "num_classes": 10, "channels": 3,
                                 "size": 256}, 8),
    "mobilenetv2_cifar": ("synthetic", {"num_clients": 2, "samples_per_client": 64, "num_classes": 10,
                                        "channels": 3, "size": 32}, 32),
    "unet3d": ("volumes", {"num_clients": 2, "dims": 3, "samples": (32, 8, 8)}, 4),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def config(model: str, device: str, precision: str, steps: int, rounds: int) -> RunConfig:
    data, options, batch = MODELS[model]
    registered = {"name": data, "options": options} if data != "volumes" else {"name": "synthetic"}
    return validate({"seed": 0, "device": device, "precision": precision, "data": registered, "model": {"name": model},
                     "train": {"rounds": rounds, "local_steps": steps, "batch_size": batch, "lr": 0.01},
                     "eval": {"every": 10**6}})


def simulation(model: str, cfg: RunConfig) -> Simulation:
    """The engine on ``model``'s data (tests/engine/toyseg.py's synthetic volumes; the others from the registry)."""
    data, options, _ = MODELS[model]
    if data == "volumes":
        resolve_device(cfg.device)
        return Simulation(cfg, toy_segmentation(**options), build_recipe("fedavg", [], {}))
    return build_simulation(cfg)


def engine_round(sim: Any, r: int) -> float:
    sync(sim.device)
    t0 = time.perf_counter()
    sim.run_round(r)
    sync(sim.device)
    return time.perf_counter() - t0


def bare_round(sim: Any, cfg: RunConfig, model: torch.nn.Module, g: torch.Generator) -> float:
    """The same local steps without the engine: load the global weights, train with the task's loss
    (cross-entropy; plus soft Dice for segmentation, as the engine trains), average."""
    device, precision = module_device(model), cfg.precision
    sync(device)
    t0 = time.perf_counter()
    global_weights = {k: v.clone() for k, v in model.state_dict().items()}
    states, sizes = [], []
    for client in sim.data.clients:
        x, y = client.train.x.to(device), client.train.y.to(device)
        model.load_state_dict(global_weights)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=0.9, weight_decay=5e-4)
        model.train()
        for _ in range(cfg.train.local_steps):
            idx = torch.randperm(len(x), generator=g)[: cfg.train.batch_size].to(device)
            opt.zero_grad(set_to_none=True)
            with autocast(device, precision):
                loss = sim.task.loss(model(x[idx]), y[idx])  # the engine's: CE, + soft Dice for segmentation
            loss.backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        sizes.append(float(len(x)))
    model.load_state_dict({k: weighted_average([s[k] for s in states], sizes) for k in global_weights})
    sync(device)
    return time.perf_counter() - t0


class LeanRound:
    """The lean floor's round (issue 46): :class:`lean.LeanAverage`'s in-place start and average around the same
    local steps, with one optimiser, the mini-batches' indices drawn on the device and a GradScaler for
    "16-mixed"; the clients' training splits move to the device per round, as the engine moves them."""

    def __init__(self, sim: Any, cfg: RunConfig, model: torch.nn.Module) -> None:
        self.sim, self.cfg, self.model = sim, cfg, model
        self.device = module_device(model)
        self.opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=0.9, weight_decay=5e-4)
        self.average = LeanAverage(model)
        self.scaler = grad_scaler(self.device, cfg.precision)
        self.gen = torch.Generator(self.device).manual_seed(0)

    def __call__(self) -> float:
        device, cfg, model, opt, scaler = self.device, self.cfg, self.model, self.opt, self.scaler
        sync(device)
        t0 = time.perf_counter()
        clients = self.sim.data.clients
        total = sum(len(c.train) for c in clients)
        self.average.start_round()
        model.train()
        for client in clients:
            x, y = client.train.x.to(device), client.train.y.to(device)
            self.average.start_client(opt)
            for _ in range(cfg.train.local_steps):
                idx = torch.randperm(len(x), generator=self.gen, device=device)[: cfg.train.batch_size]
                opt.zero_grad(set_to_none=True)
                with autocast(device, cfg.precision):
                    loss = self.sim.task.loss(model(x[idx]), y[idx])
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
            self.average.add_client(len(x) / total)
        self.average.finish_round()
        sync(device)
        return time.perf_counter() - t0


def transfer_time(sim: Any) -> float:
    """Seconds to move every client's training split to the device as a round does."""
    device = sim.device
    sync(device)
    t0 = time.perf_counter()
    for client in sim.fleet.clients:
        client.train.to(device, device.type == "cuda")
    sync(device)
    return time.perf_counter() - t0


def measure(model: str, device: str, precision: str, steps: int, rounds: int, repeats: int) -> dict[str, Any]:
    cfg = config(model, device, precision, steps, rounds)
    sim = simulation(model, cfg)
    bare_model = build_model(model, sim.data.input_shape[0], sim.data.num_classes).to(sim.device)
    lean = LeanRound(sim, cfg, build_model(model, sim.data.input_shape[0], sim.data.num_classes).to(sim.device))
    g = torch.Generator().manual_seed(0)
    engine_round(sim, 1)  # warm-up (allocator, cuDNN autotuning)
    bare_round(sim, cfg, bare_model, g)
    lean()
    engine, bare, lean_s, over_bare, over_lean, shares = [], [], [], [], [], []
    r = 1
    for _ in range(repeats):
        e = statistics.median(engine_round(sim, r := r + 1) for _ in range(rounds))
        b = statistics.median(bare_round(sim, cfg, bare_model, g) for _ in range(rounds))
        fl = statistics.median(lean() for _ in range(rounds))
        engine.append(e)
        bare.append(b)
        lean_s.append(fl)
        over_bare.append(e / b)
        over_lean.append(e / fl)
        shares.append(transfer_time(sim) / e)
    return {"model": model, "device": str(sim.device), "precision": precision,
            "engine_round_s": statistics.median(engine), "bare_round_s": statistics.median(bare),
            "lean_round_s": statistics.median(lean_s), "engine_over_bare": statistics.median(over_bare),
            "engine_over_lean": statistics.median(over_lean), "transfer_share": statistics.median(shares)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 steps, 2 rounds per repeat, 2 repeats")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (each: the three sides' rounds in turn)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--precisions", nargs="*", choices=["32", "bf16-mixed", "16-mixed"], default=None,
                        help="precisions to measure (default: 32 and bf16-mixed, and 16-mixed on CUDA)")
    parser.add_argument("--devices", nargs="*", choices=["cpu", "cuda"], default=None,
                        help="devices to measure (default: cpu, and cuda when present)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps, rounds, repeats = (2, 2, 2) if args.quick else (10, 3, args.repeats)
    has_cuda = any(d.startswith("cuda") for d in available_devices())
    devices = args.devices if args.devices is not None else ["cpu"] + (["cuda"] if has_cuda else [])
    rows = []
    for device in devices:
        env = environment(resolve_device(device), "32", False)
        print(f"# {device}: {env['device_name']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
              f"{args.threads} threads", flush=True)
        precisions = args.precisions or ["32", "bf16-mixed"] + (["16-mixed"] if device == "cuda" else [])
        for model in args.models:
            for precision in precisions:
                row = measure(model, device, precision, steps, rounds, repeats)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| model | device | precision | engine round s | bare round s | lean round s | engine / bare | "
          "engine / lean | transfer share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['device']} | {row['precision']} | {row['engine_round_s']:.4f} | "
              f"{row['bare_round_s']:.4f} | {row['lean_round_s']:.4f} | {row['engine_over_bare']:.2f} | "
              f"{row['engine_over_lean']:.2f} | {row['transfer_share']:.1%} |")


if __name__ == "__main__":
    main()
