"""Cost of FFA layers: training-step time with the layers / without, next to nn.InstanceNorm, and
FedFA's extra communication per round measured by the engine against Appendix D's formula.

Run: ``nice -n 5 .venv/bin/python benchmarks/bench_ffa.py [--repeats 7] [--steps 5] [--threads 2]
[--device cuda]``

For each model, every configuration is attached at the model's default ``feature_stages`` with the
same forward hooks (``fedaug.layers.attach``): ``ffa`` (:class:`~fedaug.layers.FFALayer`, p = 1,
fused variance, with the device's fused kernel: ``kernel="on"``, the compiled C++ kernel on the
CPU, the Triton path on CUDA: coin, noise and running statistics drawn and updated inside one launch
forward and one backward, issue 46), ``ffa-pytorch`` (the same layer with
``kernel="off"``, the default: its pure-PyTorch custom autograd function), ``ffa-autograd`` (the same maths written as plain tensor code, the way the public
layer is written, for reference) and ``instancenorm`` (``nn.InstanceNorm{1,2,3}d``, no affine).
Repeats are interleaved (none, ffa, ffa-pytorch, ffa-autograd, instancenorm, none, ...); each repeat times
``--steps`` SGD steps after one warm-up step; a configuration's time is the median over all its
timed steps, and every ratio divides two medians of the same run; FFA / IN divides ``ffa``. Then ``none``,
``ffa`` and ``instancenorm`` are timed captured too (:data:`CAPTURED`; "FFA / IN captured"): each one's training
step captured once (:func:`fedaug.engine.client.graphed.capture_step`: warm-up, undo, capture) in a CUDA graph on
CUDA (:class:`~fedaug.engine.client.capture.CudaGraphs`), elsewhere in its CPU emulation
(:class:`~fedaug.engine.client.capture.TracedCapture`, which replays the recorded operations: what a graph
replays, without Python), and timed as replays, interleaved as the eager steps are. On
CUDA (``--device cuda``) the layers draw from a CUDA generator, as the engine's components do, each
timed step ends with a synchronisation, and Triton compiles its kernels in the first (untimed)
warm-up steps; before the table, ``torch.profiler`` counts the CUDA kernels of one layer's forward
and backward on ``(32, 32, 14, 14)`` for FFA (Triton path) and InstanceNorm.

``--host`` measures instead, on the CPU, what one layer's training forward and backward costs the host on
the Triton path, the kernels' launches stubbed out (everything else runs: the layer, the autograd function,
the launch arguments), against ``nn.InstanceNorm2d`` and no layer, on a tiny ``(4, 16, 2, 2)`` tensor: on a
GPU whose steps wait for the host (small models), this is what FFA adds per layer and step beyond its two
launches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import timeit
from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedaug.config.schema import validate
from fedaug.core.device import environment, resolve_device
from fedaug.core.rng import scoped_global_seed
from fedaug.core.runtime import configure_process
from fedaug.engine.client.capture import Capture, CudaGraphs, TracedCapture
from fedaug.engine.client.graphed import capture_step
from fedaug.engine.run import build_simulation
from fedaug.layers import FFALayer, attach, kernel, stage_channels
from fedaug.models import build_model

# name: (in_channels, num_classes, input shape without batch, label shape without batch, batch)
MODELS = {
    "small_cnn": (1, 10, (1, 28, 28), (), 32),
    "alexnet_bn": (3, 10, (3, 128, 128), (), 8),  # sides >= 63 to run, >= 127 for 3x3 maps at conv5
    "unet2d": (3, 2, (3, 64, 64), (64, 64), 8),
}  # fmt: skip


class AutogradFFA(nn.Module):
    """FFA written as plain differentiable tensor code (statistics, Eq. 3, 7, 9, 8), p = 1."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("gamma", torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        dims = tuple(range(2, x.dim()))
        mu = x.mean(dim=dims, keepdim=True)
        sigma = (x.var(dim=dims, keepdim=True) + 1e-6).sqrt()
        std_mu = ((self.gamma.view(mu.shape[1:]) + 1) * (mu.var(dim=0, keepdim=True) + 1e-6)).sqrt()
        std_sigma = ((self.gamma.view(mu.shape[1:]) + 1) * (sigma.var(dim=0, keepdim=True) + 1e-6)).sqrt()
        mu_hat = mu + torch.randn_like(mu) * std_mu
        sigma_hat = sigma + torch.randn_like(sigma) * std_sigma
        return sigma_hat * (x - mu) / sigma + mu_hat


def instance_norm(channels: int, rank: int) -> nn.Module:
    return {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[rank](channels)


CLOCK = time.perf_counter


def makers(device: torch.device) -> dict[str, Callable[[int, int], nn.Module] | None]:
    """The configurations timed on ``device``."""
    def ffa(kernel_mode: str) -> Callable[[int, int], nn.Module]:
        return lambda c, rank: FFALayer(c, p=1.0, generator=torch.Generator(device).manual_seed(0),
                                        kernel=kernel_mode)

    return {"none": None, "ffa": ffa("on"), "ffa-pytorch": ffa("off"), "ffa-autograd": lambda c, rank: AutogradFFA(c),
            "instancenorm": instance_norm}


def _step_end(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return CLOCK()


#: the configurations also timed captured: those whose steps draw from no generator a graph does not own
#: (``ffa-pytorch`` draws from its layer's generator, ``ffa-autograd`` from the global stream)
CAPTURED = ("none", "ffa", "instancenorm")


def sgd_step(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor
             ) -> Callable[[], tuple[Tensor, dict[str, Tensor]]]:
    """One training step of ``model`` on ``(x, y)`` (cross-entropy, backward, ``opt.step()``), returning its
    detached loss and no loss terms (the step :func:`~fedaug.engine.client.graphed.capture_step` captures)."""
    def step() -> tuple[Tensor, dict[str, Tensor]]:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach(), {}

    return step


def capture_of(device: torch.device) -> Capture:
    """CUDA graphs on CUDA, their CPU emulation elsewhere (module docstring)."""
    return CudaGraphs(device) if device.type == "cuda" else TracedCapture()


def captured(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, layers: dict[str, nn.Module],
             device: torch.device) -> Callable[[], None]:
    """What replays :func:`sgd_step` captured with ``layers`` attached (the graph keeps them: their hooks are not
    needed after the capture, their buffers are, so the caller keeps ``layers``)."""
    static = [*model.parameters(), *model.buffers(), *(b for layer in layers.values() for b in layer.buffers())]
    with attach(model, layers):
        replay, _ = capture_step(capture_of(device), sgd_step(model, opt, x, y), static, opt,
                                 torch.zeros((), device=device), {})
    return replay


def time_model(name: str, repeats: int, steps: int, device: torch.device) -> dict[str, float]:
    """Median seconds per SGD step of ``name`` on ``device`` for every configuration of :func:`makers`, eager, and
    for those of :data:`CAPTURED` replayed (keys ``"<configuration> captured"``)."""
    cin, ncls, shape, label_shape, batch = MODELS[name]
    with scoped_global_seed(0, "bench", name):
        model = build_model(name, in_channels=cin, num_classes=ncls).train().to(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=g).to(device)
    y = torch.randint(0, ncls, (batch, *label_shape), generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    channels = stage_channels(model, x[:2])
    ranks = {}
    with torch.no_grad():
        probe = {n: _RankProbe(ranks, n) for n in channels}
        with attach(model, probe):
            model.eval()(x[:2])
    model.train()
    configurations = makers(device)

    def layers_of(key: str) -> dict[str, nn.Module]:
        make = configurations[key]
        return {} if make is None else {n: make(c, ranks[n]).to(device) for n, c in channels.items()}

    times: dict[str, list[float]] = {k: [] for k in configurations}
    step = sgd_step(model, opt, x, y)
    for _ in range(repeats):
        for key in configurations:
            with attach(model, layers_of(key)):
                for i in range(steps + 1):
                    start = _step_end(device)
                    step()
                    if i:
                        times[key].append(_step_end(device) - start)
    kept = {key: layers_of(key) for key in CAPTURED}
    replays = {f"{key} captured": captured(model, opt, x, y, kept[key], device) for key in CAPTURED}
    times.update({key: [] for key in replays})
    for _ in range(repeats):
        for key, replay in replays.items():
            for i in range(steps + 1):
                start = _step_end(device)
                replay()
                if i:
                    times[key].append(_step_end(device) - start)
    return {k: statistics.median(v) for k, v in times.items()}


class _RankProbe(nn.Module):
    def __init__(self, found: dict[str, int], name: str) -> None:
        super().__init__()
        self.found, self.name = found, name

    def forward(self, x: Tensor) -> Tensor:
        self.found[self.name] = x.dim() - 2
        return x


def kernels_per_step(layer: nn.Module, device: torch.device, shape: tuple[int, ...] = (32, 32, 14, 14)) -> list[str]:
    """The CUDA kernels of one forward and backward of ``layer`` (after two warm-up steps), by ``torch.profiler``."""
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn_like(x)
    for _ in range(2):
        torch.autograd.grad(layer(x), x, grad)
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(layer(x), x, grad)
        torch.cuda.synchronize(device)
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def measured_comm(model: str, data: dict, rounds: int = 2) -> tuple[int, int, int]:
    """(clients, FedFA bytes up + down in the last round, Appendix D formula per client in bytes)."""
    raw = {"seed": 0, "data": data, "model": {"name": model},
           "method": {"base": "fedavg", "augs": ["fedfa"]},
           "train": {"rounds": rounds, "local_steps": 1, "batch_size": 4, "lr": 1e-3}, "threads": 2}
    sim = build_simulation(validate(raw))
    for r in range(1, rounds + 1):
        record = sim.run_round(r)
    layers = sim.recipe.components[1].layers.values()
    formula = 4 * sum(layer.num_channels for layer in layers) * 4  # 4 sum_k C_k float32 values
    clients = len(record["sampled"])
    return clients, record["comm"]["up"]["fedfa"] + record["comm"]["down"]["fedfa"], formula


def host_cost(repeats: int) -> dict[str, float]:
    """Microseconds of host time per training forward + backward of one layer on a tiny CPU tensor (module
    docstring, ``--host``): ``ffa`` (Triton path, launches stubbed), ``instancenorm``, ``none``; the three
    alternate ``repeats`` times, each the best of 5 x 200 calls timed by ``CLOCK`` (``--clock``), and the medians
    are returned."""
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton path on CPU tensors (nothing is launched here)
    triton_ffa = kernel.triton_module().triton_ffa

    class NoLaunch:
        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            return lambda *args, **kwargs: None

    launches = triton_ffa._ffa_forward, triton_ffa._ffa_backward
    triton_ffa._ffa_forward = triton_ffa._ffa_backward = NoLaunch()
    try:
        x = torch.randn(4, 16, 2, 2, requires_grad=True)
        layers = {"ffa": FFALayer(16, p=1.0, kernel="triton").train(), "instancenorm": nn.InstanceNorm2d(16),
                  "none": nn.Identity()}
        times: dict[str, list[float]] = {name: [] for name in layers}

        def step(layer: nn.Module) -> None:
            layer(x).sum().backward()

        for _ in range(repeats):
            for name, layer in layers.items():
                step(layer)
                best = min(timeit.repeat(lambda: step(layer), timer=CLOCK, number=200, repeat=5))
                times[name].append(best / 200 * 1e6)
    finally:
        triton_ffa._ffa_forward, triton_ffa._ffa_backward = launches
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per repeat and configuration")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--skip-comm", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (kernel on: C++ on the CPU, Triton on CUDA)")
    parser.add_argument("--host", action="store_true", help="the host's cost of one layer per step on the Triton "
                        "path, launches stubbed, against InstanceNorm's (CPU; module docstring), and stop")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: time.perf_counter; cpu: the process's CPU time (all threads; "
                             "time lost to other tenants of a shared machine is not counted)")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    configure_process(args.threads)  # as the fedaug command line does
    if args.host:
        us = host_cost(args.repeats)
        print(f"host us per layer forward + backward (medians of {args.repeats}): FFA (Triton path) {us['ffa']:.0f}, "
              f"InstanceNorm {us['instancenorm']:.0f}, none {us['none']:.0f}; beyond none: FFA "
              f"{us['ffa'] - us['none']:.0f}, InstanceNorm {us['instancenorm'] - us['none']:.0f}, ratio "
              f"{(us['ffa'] - us['none']) / (us['instancenorm'] - us['none']):.2f}")
        return
    device = resolve_device(args.device)
    print(f"torch {torch.__version__}, {environment(device, '32', False)['device_name']}, {args.threads} threads, {args.repeats} "
          f"interleaved repeats x {args.steps} steps, medians of {args.clock} time; p = 1 at every default stage\n")
    kernel.fused_op(device.type)  # build (CPU) or import (CUDA: triton) outside the timed steps
    if device.type == "cuda":
        layers = {"FFA (Triton path)": FFALayer(32, p=1.0, kernel="on"), "InstanceNorm": nn.InstanceNorm2d(32)}
        for name, layer in layers.items():
            names = kernels_per_step(layer.to(device), device)
            print(f"CUDA kernels per layer and step (forward + backward), {name}: {len(names)} ({', '.join(names)})")
        print()
    print("| model | input | batch | ms/step none | FFA | FFA, kernel off | plain-autograd FFA | InstanceNorm "
          "| FFA / IN | ms/step none captured | FFA captured | InstanceNorm captured | FFA / IN captured |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        med = time_model(name, args.repeats, args.steps, device)
        base = med["none"]
        r = {k: v / base for k, v in med.items()}
        ffa = r["ffa"]
        _, _, shape, _, batch = MODELS[name]
        graphed = med["none captured"]
        ffa_c, in_c = med["ffa captured"] / graphed, med["instancenorm captured"] / graphed
        print(f"| `{name}` | {'x'.join(map(str, shape))} | {batch} | {1e3 * base:.2f} | {ffa:.3f} | "
              f"{r['ffa-pytorch']:.3f} | {r['ffa-autograd']:.3f} | {r['instancenorm']:.3f} | "
              f"{ffa / r['instancenorm']:.3f} | {1e3 * graphed:.2f} | {ffa_c:.3f} | {in_c:.3f} | {ffa_c / in_c:.3f} |",
              flush=True)
    if args.skip_comm:
        return
    print("\n| model | clients | FedFA bytes/round (engine) | per client | Appendix D 4 sum C x 4 B |")
    print("|---|---:|---:|---:|---:|")
    cases = {
        "alexnet_bn": {"name": "synthetic", "options": {"num_clients": 2, "samples_per_client": 8,
                                                        "channels": 3, "size": 64}},
        "unet2d": {"name": "brain_mri", "options": {"dims": 2, "size": 64}},
    }
    for model, data in cases.items():
        clients, nbytes, formula = measured_comm(model, data)
        print(f"| `{model}` | {clients} | {nbytes:,} | {nbytes // clients:,} ({nbytes / clients / 1024:.1f} KB) | "
              f"{formula:,} ({formula / 1024:.1f} KB) |", flush=True)


if __name__ == "__main__":
    main()
