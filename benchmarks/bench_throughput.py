"""Throughput benchmark: the engine against a bare PyTorch loop doing the same steps, and clients in
parallel worker processes (issue "Throughput"; not a test: it reports, it does not assert).

Two jobs (FedAvg, evaluation off, SGD lr 0.05, momentum 0.9, weight decay 5e-4):

- **W1, compute-bound**: ``small_cnn`` on 3x28x28, 100 clients of 320 samples, 10 a round, 10 local
  steps of 32.
- **W2, many small clients**: FedAvg's 2NN (``mlp``, 784-200-200-10) on 1x28x28, 1,000 clients of
  20 samples, 100 a round, 2 local steps of 10.

(``M``: ``mobilenetv2_cifar`` clients; ``G``: W1's clients, 200 of them, 50 a round, for grouped
clients on one GPU.)

Every measurement is a fresh subprocess (one warm-up round, then timed rounds). The engine and the
bare loop run in one process at one thread, round by round in alternating order, so that what slows
the machine for a moment slows both. Reported: median s/round, clients/s, samples/s (training samples
processed), the ratio engine / bare of the medians and the median of the rounds' ratios, and each
side's peak RSS (a short process of its own). ``--pin CPU`` pins every child to that core.
Then ``workers`` = 1, 2 (4, 8 where the machine has the cores) at ``threads`` = 1 each, against
``workers = 1`` with that many threads.

Run: ``.venv/bin/python benchmarks/bench_throughput.py --pin 0`` (ratios on one core, ~6 min on 2
cores); ``--workers-only`` for the worker scaling alone; ``--quick`` for a smoke run; ``--jobs M
--device cuda --workers 1 2 4 8`` for mobilenetv2_cifar clients on one GPU (benchmarks/gpu_checks.sh);
``--jobs W1 --groups 1 10`` for W1's ten clients a round trained as one batched group
(``train.group_clients``, issue 39) against one at a time, with the largest difference of their losses
(``--jobs G --groups 1 10 50 --device cuda`` on a GPU); ``--jobs G --graph --device cuda`` for each client's
step replayed from CUDA graphs (``train.cuda_graph``, issue 39) against eager steps; ``--jobs W2 --split``
for where the engine's time per client goes against the lean loop's (issue 46); ``--jobs W2 --held`` for what
keeping each client's copy until the round ends (as the engine's server keeps the uploads) costs the lean loop.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
from lean import LeanAverage  # benchmarks/lean.py (this script's folder is on the path)


@dataclass(frozen=True)
class Job:
    """One benchmark job (the clients' data come from the ``synthetic`` dataset)."""

    name: str
    model: str
    channels: int
    num_clients: int
    samples: int
    per_round: int
    steps: int
    batch: int
    size: int = 28

    @property
    def data_options(self) -> dict:
        return {"num_clients": self.num_clients, "samples_per_client": self.samples, "num_classes": 10,
                "channels": self.channels, "size": self.size}


JOBS = {
    "W1": Job("W1", "small_cnn", 3, 100, 320, 10, 10, 32),
    "W2": Job("W2", "mlp", 1, 1000, 20, 100, 2, 10),
    "M": Job("M", "mobilenetv2_cifar", 3, 100, 64, 10, 2, 32, size=32),  # the FLea paper's CIFAR model
    "G": Job("G", "small_cnn", 3, 200, 320, 50, 10, 32),  # W1's clients, 50 a round: groups for one GPU
}
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4


#: a method of --executions: its base and augmentations
METHODS = {"fedavg": ("fedavg", []), "fedfa": ("fedavg", ["fedfa"]), "vfda": ("fedavg", ["vfda"]),
           "fedrdn": ("fedavg", ["fedrdn"]), "flea": ("fedavg", ["flea"])}


def engine_config(job: Job, rounds: int, threads: int, workers: int, device: str = "cpu", group: int = 1,
                  graph: bool | str = False, method: str = "fedavg", seed: int = 0):
    from fedaug.config.schema import validate

    base, augs = METHODS[method]
    return validate({
        "seed": seed, "threads": threads, "workers": workers, "device": device,
        "method": {"base": base, "augs": augs},
        "data": {"name": "synthetic", "options": job.data_options},
        "model": {"name": job.model},
        "train": {"rounds": rounds, "participation": job.per_round / job.num_clients, "local_steps": job.steps,
                  "batch_size": job.batch, "lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY,
                  "group_clients": group, "cuda_graph": graph},
        "eval": {"every": 10**6},
    })


def engine_rounds(job: Job, rounds: int, threads: int, workers: int, device: str = "cpu", group: int = 1,
                  graph: bool | str = False, losses: list[float] | None = None, method: str = "fedavg",
                  pack: int = 1) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of each round of the engine (evaluation off; as the CLI runs it);
    each client's training loss of every round is appended to ``losses``, if given. With ``pack > 1``, that many
    runs (seeds 0, 1, ...) trained as one pack (:func:`packed_rounds`)."""
    from fedaug.core.runtime import configure_process
    from fedaug.engine.run import build_simulation

    cfg = engine_config(job, rounds, threads, workers, device, group, graph, method)
    configure_process(cfg.threads)
    if pack > 1:
        return packed_rounds(job, cfg, pack, rounds, device, losses)
    sim = build_simulation(cfg)
    with sim:
        times = []
        for r in range(1, rounds + 1):
            seconds, rec = timed_round(sim.run_round, r, device)
            times.append(seconds)
            if losses is not None:
                losses += [m["loss"] for _, m in sorted(rec["train"]["clients"].items(), key=lambda kv: int(kv[0]))]
    return times


def packed_rounds(job: Job, cfg, pack: int, rounds: int, device: str,
                  losses: list[float] | None) -> list[tuple[float, float]]:
    """``pack`` runs of ``cfg`` (seeds 0, 1, ...) trained as one pack (:class:`~fedaug.engine.fleet.packed.Pack`): a
    pack round ends when its last run ends the round; each round's (wall, CPU) seconds divided by ``pack`` (one
    run's share: clients/s then counts every run's clients); run 0's losses appended to ``losses``."""
    import dataclasses

    from fedaug.engine.fleet.packed import Pack
    from fedaug.engine.run import build_simulation

    ends: dict[int, tuple[float, float]] = {}

    def body(slot, seed: int) -> list[dict]:
        sim = build_simulation(dataclasses.replace(cfg, seed=seed), trainer=slot.train)
        records = []
        with sim:
            for r in range(1, rounds + 1):
                records.append(sim.run_round(r))
                _sync(device)
                ends[r] = (time.perf_counter(), time.process_time())  # the last run's end of the round stays
        return records

    start = (time.perf_counter(), time.process_time())
    results = Pack().run([lambda slot, s=s: body(slot, s) for s in range(pack)])
    for result in results:
        if isinstance(result, BaseException):
            raise result
    if losses is not None:
        losses += [m["loss"] for rec in results[0] for _, m in sorted(rec["train"]["clients"].items(),
                                                                          key=lambda kv: int(kv[0]))]
    marks = [start, *(ends[r] for r in range(1, rounds + 1))]
    return [((b[0] - a[0]) / pack, (b[1] - a[1]) / pack) for a, b in zip(marks, marks[1:])]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class BareLoop:
    """The same work as a plain PyTorch FedAvg loop: sample, load the global weights, the local SGD
    steps on reshuffled mini-batches, copy the weights, average them weighted by samples."""

    def __init__(self, job: Job, threads: int, device: str = "cpu") -> None:
        from fedaug.core.runtime import configure_process
        from fedaug.data.registry import load_dataset
        from fedaug.models.registry import build_model

        configure_process(threads)
        self.job, self.device = job, device
        self.data = load_dataset("synthetic", 0, **job.data_options)
        torch.manual_seed(0)
        self.model = build_model(job.model, job.channels, 10).to(device)
        self.global_sd = {k: v.clone() for k, v in self.model.state_dict().items()}

    def sampled(self, r: int) -> list[int]:
        """Round ``r``'s clients (a seeded draw of ``per_round`` ids)."""
        perm = torch.randperm(self.job.num_clients, generator=torch.Generator().manual_seed(r))
        return sorted(int(k) for k in perm[:self.job.per_round])

    def local_steps(self, opt: torch.optim.Optimizer, r: int, k: int) -> int:
        """Client ``k``'s local SGD steps of round ``r`` on reshuffled mini-batches; returns its sample count."""
        job, device, model = self.job, self.device, self.model
        client = self.data.clients[k]
        model.train()
        g = torch.Generator(device).manual_seed(1000 * r + k)
        x, y, n = client.train.x.to(device), client.train.y.to(device), len(client.train)
        bs = min(job.batch, n)
        batches: list[torch.Tensor] = []
        while len(batches) < job.steps:
            perm = torch.randperm(n, generator=g, device=device)
            batches.extend(perm[i * bs:(i + 1) * bs] for i in range(n // bs))
        for idx in batches[:job.steps]:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        return n

    def run_round(self, r: int) -> None:
        model = self.model
        states, sizes = [], []
        for k in self.sampled(r):
            model.load_state_dict(self.global_sd)
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
            sizes.append(self.local_steps(opt, r, k))
            states.append({name: v.detach().clone() for name, v in model.state_dict().items()})
        total = sum(sizes)
        self.global_sd = {name: (sum(s[name].double() * (w / total) for s, w in zip(states, sizes))).to(v.dtype)
                          if v.is_floating_point() else max(s[name] for s in states)
                          for name, v in self.global_sd.items()}


class LeanLoop(BareLoop):
    """The leanest honest loop for the same work (issue 46; the floor of ``engine / lean``): FedAvg's start and
    average in place (:class:`lean.LeanAverage`: one SGD optimiser whose state is cleared per client, the global
    weights copied in, a float32 sum), no synchronisation but the batches' own."""

    def __init__(self, job: Job, threads: int, device: str = "cpu") -> None:
        super().__init__(job, threads, device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        self.average = LeanAverage(self.model)

    def run_round(self, r: int) -> None:
        sampled = self.sampled(r)
        total = sum(len(self.data.clients[k].train) for k in sampled)
        self.average.start_round()
        for k in sampled:
            self.average.start_client(self.opt)
            self.average.add_client(self.local_steps(self.opt, r, k) / total)
        self.average.finish_round()


class HoldingLoop(LeanLoop):
    """The lean loop that also keeps a copy of each client's weights, taken right after its steps, until the
    round is over: what the engine's server does with the uploads (the message outlives the worker model; the
    update screening needs the round's every norm before any upload is averaged). ``--held`` compares the two:
    what holding the round's uploads costs the clients' own steps."""

    def run_round(self, r: int) -> None:
        self.held: list[list[torch.Tensor]] = []  # the last round's copies freed before this round's are taken
        super().run_round(r)

    def local_steps(self, opt: torch.optim.Optimizer, r: int, k: int) -> int:
        n = super().local_steps(opt, r, k)
        self.held.append(torch._foreach_mul(self.average.floats, 1))  # the engine's copy (_common.detached)
        return n


def timed_round(run, r: int, device: str) -> tuple[tuple[float, float], object]:
    """(wall, process CPU) seconds of ``run(r)``, and what it returned."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = run(r)
    _sync(device)
    return (time.perf_counter() - t0, time.process_time() - c0), out


def bare_rounds(job: Job, rounds: int, threads: int, device: str = "cpu") -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of each round of :class:`BareLoop`."""
    loop = BareLoop(job, threads, device)
    return [timed_round(loop.run_round, r, device)[0] for r in range(1, rounds + 1)]


def paired_rounds(job: Job, rounds: int, device: str = "cpu") -> dict[str, list[tuple[float, float]]]:
    """The engine (workers = 1), the bare loop and the lean loop in one process at one thread, round by round
    in rotating order, so that what slows the machine for a moment slows all three: ``{"engine": [...],
    "bare": [...], "lean": [...]}``, (wall, CPU) seconds of each round."""
    from fedaug.engine.run import build_simulation

    loop, lean = BareLoop(job, 1, device), LeanLoop(job, 1, device)
    sim = build_simulation(engine_config(job, rounds, 1, 1, device))
    out: dict[str, list[tuple[float, float]]] = {"engine": [], "bare": [], "lean": []}
    with sim:
        for r in range(1, rounds + 1):
            sides = [("engine", sim.run_round), ("bare", loop.run_round), ("lean", lean.run_round)]
            for side, run in sides[r % 3:] + sides[:r % 3]:  # each side first, second and last in turn
                out[side].append(timed_round(run, r, device)[0])
    return out


def child(spec: dict) -> None:
    """Run one measurement in this process; print JSON: round times (per side for ``paired``) and peak RSS (MB)."""
    if spec.get("pin") is not None:
        os.sched_setaffinity(0, {spec["pin"]})
    job = JOBS[spec["job"]]
    device = spec.get("device", "cpu")
    losses: list[float] = []
    if spec["kind"] == "paired":
        times: object = paired_rounds(job, spec["rounds"], device)
    elif spec["kind"] == "engine":
        times = engine_rounds(job, spec["rounds"], spec["threads"], spec["workers"], device, spec.get("group", 1),
                              spec.get("graph", False), losses, spec.get("method", "fedavg"), spec.get("pack", 1))
    else:
        times = bare_rounds(job, spec["rounds"], spec["threads"], device)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"times": times, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "children_peak_mb": children, "losses": losses}))


def measure(**spec: object) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(job: Job, label: str, times: list[list[float]], peak: float | None) -> str:
    """A table row from ``(wall, cpu)`` round times: wall-clock figures, the CPU seconds of this process."""
    wall = statistics.median(t[0] for t in times)
    cpu = statistics.median(t[1] for t in times)
    return (f"| {job.name} | {label} | {wall:.4f} | {cpu:.4f} | {job.per_round / wall:.1f} "
            f"| {job.per_round * job.steps * job.batch / wall:.0f} | {'' if peak is None else f'{peak:.0f}'} |")


HEADER = ("| job | loop | median s/round | median CPU s/round | clients/s | samples/s | peak RSS (MB) |\n"
          "|---|---|---:|---:|---:|---:|---:|")


def timed(result: dict) -> list[list[float]]:
    return result["times"][1:]  # the first round pays one-time costs (lazy imports, allocator warm-up)


def compare_bare(jobs: list[Job], rounds: int, repeats: int, pin: int | None, device: str = "cpu") -> None:
    """Engine (workers = 1) against the bare loop at one thread: each repeat one process running both
    round by round (:func:`paired_rounds`); peak RSS from one short process per side."""
    print(f"## Engine against the bare loop on {device} (1 thread{f', pinned to core {pin}' if pin is not None else ''}; "
          f"{repeats} repeats x {rounds} timed rounds after 1 warm-up, the two alternating round by round in one process)\n")
    print(HEADER)
    for job in jobs:
        sides: dict[str, list[list[float]]] = {"engine": [], "bare": [], "lean": []}
        for _ in range(repeats):
            got = measure(kind="paired", job=job.name, rounds=rounds + 1, pin=pin, device=device)["times"]
            for side in sides:  # the first round pays one-time costs (lazy imports, allocator warm-up)
                sides[side] += got[side][1:]
        peaks = {kind: measure(kind=kind, job=job.name, rounds=2, threads=1, workers=1, pin=pin,
                               device=device)["peak_mb"] for kind in ("engine", "bare")}
        eng = sides["engine"]
        print(row(job, "fedaug engine", eng, peaks["engine"]))
        print(row(job, "bare PyTorch (issue 38's floor)", sides["bare"], peaks["bare"]))
        print(row(job, "lean PyTorch (the floor)", sides["lean"], None))
        for floor in ("bare", "lean"):
            base = sides[floor]
            wall, cpu = (statistics.median(t[i] for t in eng) / statistics.median(t[i] for t in base) for i in (0, 1))
            paired = sorted(e[0] / b[0] for e, b in zip(eng, base))
            quart = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
            print(f"| {job.name} | **engine / {floor}** | **{wall:.3f}** | **{cpu:.3f}** | median of the "
                  f"{len(paired)} rounds' ratios {statistics.median(paired):.3f} (quartiles {quart[0]:.3f}-"
                  f"{quart[1]:.3f}) | | |")
    print()


def compare_workers(jobs: list[Job], rounds: int, repeats: int, counts: list[int], device: str = "cpu") -> None:
    """``workers = k, threads = 1`` against ``workers = 1, threads = k`` on all cores, alternating
    (CPU seconds: the server process's own, without its workers'); on a GPU, all workers share it."""
    print(f"## Workers on {device} (all cores; {repeats} alternating repeats x {rounds} timed rounds after 1 warm-up)\n")
    print(HEADER.replace("| loop |", "| setting |"))
    for job in jobs:
        one: list[list[float]] = []
        for _ in range(repeats):
            one += timed(measure(kind="engine", job=job.name, rounds=rounds + 1, threads=1, workers=1, device=device))
        print(row(job, "workers = 1, threads = 1", one, None))
        for k in counts[1:]:
            par: list[list[float]] = []
            wide: list[list[float]] = []
            peak = 0.0
            for _ in range(repeats):
                p = measure(kind="engine", job=job.name, rounds=rounds + 1, threads=1, workers=k, device=device)
                w = measure(kind="engine", job=job.name, rounds=rounds + 1, threads=k, workers=1, device=device)
                par += timed(p)
                wide += timed(w)
                peak = max(peak, p["peak_mb"] + p["children_peak_mb"] * k)
            print(row(job, f"workers = 1, threads = {k}", wide, None))
            print(row(job, f"**workers = {k}, threads = 1**", par, peak))
            gain = statistics.median(t[0] for t in wide) / statistics.median(t[0] for t in par)
            over_one = statistics.median(t[0] for t in one) / statistics.median(t[0] for t in par)
            print(f"| {job.name} | **speed-up** of workers = {k} over threads = {k} | **{gain:.2f}x** | | "
                  f"over one core: {over_one:.2f}x | | |")
    print()


def compare_settings(jobs: list[Job], rounds: int, repeats: int, settings: list[tuple[str, dict]], what: str,
                     pin: int | None, device: str = "cpu", threads: int = 1, same_numbers: bool = True) -> None:
    """Each setting ``(label, engine options)`` against the first, alternating, same steps; where the settings
    compute the same numbers (``same_numbers``: executions of one method, not different methods) the results
    must agree: the largest relative difference of any client's training loss over every round from
    the first setting's is reported (float rounding only; 0 where the numbers are the same)."""
    print(f"## {what} on {device} ({threads} thread{'s' if threads > 1 else ''}"
          f"{f', pinned to core {pin}' if pin is not None else ''}; {repeats} alternating repeats x {rounds} timed "
          f"rounds after 1 warm-up)\n")
    print(HEADER.replace("| loop |", "| setting |"))
    for job in jobs:
        times: dict[str, list[list[float]]] = {label: [] for label, _ in settings}
        losses: dict[str, list[float]] = {}
        peaks = dict.fromkeys(times, 0.0)
        for _ in range(repeats):
            for label, options in settings:
                res = measure(kind="engine", job=job.name, rounds=rounds + 1, threads=threads, workers=1, pin=pin,
                              device=device, **options)
                times[label] += timed(res)
                losses[label] = res["losses"]
                peaks[label] = max(peaks[label], res["peak_mb"])
        first = settings[0][0]
        base = statistics.median(t[0] for t in times[first])
        for label, _ in settings:
            diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[label], losses[first]))
            speed = base / statistics.median(t[0] for t in times[label])
            note = f"; max rel. loss diff {diff:.1e}" if same_numbers else ""
            print(row(job, f"{label} ({speed:.2f}x{note})", times[label], peaks[label]))
    print()


def timing(seconds: list[float], fn):
    """``fn`` that appends the seconds of each of its calls to ``seconds``."""
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        return out
    return timed


def split(job: Job, rounds: int) -> None:
    """Where the engine's time per client goes against the lean loop's (issue 46), timed in place in one
    process at one thread, the two sides alternating round by round: the local steps (the engine's
    :func:`~fedaug.engine.client.training.eager_steps`, the lean loop's ``local_steps``), the worker's work
    around them (the rest of the engine's ``Worker.run``; the lean loop's in-place start) and the rest of a
    round (the server; the lean loop's average), per client, medians over the rounds after two warm-ups."""
    import fedaug.engine.client.training as training
    from fedaug.core.runtime import configure_process
    from fedaug.engine.run import build_simulation

    configure_process(1)
    sim, lean = build_simulation(engine_config(job, rounds + 2, 1, 1)), LeanLoop(job, 1)
    times: dict[str, list[float]] = {"worker": [], "steps": [], "lean start": [], "lean steps": []}

    worker, lean_steps, eager = sim.fleet.worker, lean.local_steps, training.eager_steps
    worker.run, training.eager_steps = timing(times["worker"], worker.run), timing(times["steps"], eager)
    lean.local_steps = timing(times["lean steps"], lean_steps)
    lean.average.start_client = timing(times["lean start"], lean.average.start_client)
    per_round: dict[str, list[float]] = {"engine": [], "lean": []}
    try:
        for r in range(1, rounds + 3):
            if r == 3:
                for v in times.values():
                    v.clear()
            for side, run in (("engine", sim.run_round), ("lean", lean.run_round))[::1 if r % 2 else -1]:
                seconds = timed_round(run, r, "cpu")[0][0]
                if r > 2:
                    per_round[side].append(seconds)
    finally:
        training.eager_steps = eager
    ms = {k: 1000 * statistics.median(v) for k, v in (times | per_round).items()}
    n = job.per_round
    rows = [("the local steps", ms["steps"], ms["lean steps"]),
            ("the worker's work around them", ms["worker"] - ms["steps"], ms["lean start"]),
            ("the rest of a round (server), per client", (ms["engine"] - n * ms["worker"]) / n,
             (ms["lean"] - n * (ms["lean start"] + ms["lean steps"])) / n)]
    print(f"## Per client, {job.name}: the engine against the lean loop ({rounds} rounds each, medians)\n")
    print("| per client | engine ms | lean ms | more ms |\n|---|---:|---:|---:|")
    for label, e, lo in rows:
        print(f"| {label} | {e:.3f} | {lo:.3f} | {e - lo:+.3f} |")
    print(f"\nrounds: engine {ms['engine']:.1f} ms, lean {ms['lean']:.1f} ms, ratio {ms['engine'] / ms['lean']:.3f}")


def held(job: Job, rounds: int) -> None:
    """The lean loop against :class:`HoldingLoop` in one process at one thread, alternating round by round (two
    warm-ups): each side's local steps per client (timed in place) and rounds, medians."""
    from fedaug.core.runtime import configure_process

    configure_process(1)
    loops = {"lean": LeanLoop(job, 1), "holding": HoldingLoop(job, 1)}
    steps: dict[str, list[float]] = {side: [] for side in loops}
    per_round: dict[str, list[float]] = {side: [] for side in loops}
    for side, loop in loops.items():
        loop.local_steps = timing(steps[side], loop.local_steps)
    for r in range(1, rounds + 3):
        if r == 3:
            for v in steps.values():
                v.clear()
        for side in (("lean", "holding") if r % 2 else ("holding", "lean")):
            seconds = timed_round(loops[side].run_round, r, "cpu")[0][0]
            if r > 2:
                per_round[side].append(seconds)
    ms = {side: (1000 * statistics.median(steps[side]), 1000 * statistics.median(per_round[side])) for side in loops}
    print(f"## {job.name}: the lean loop, and the same holding a copy of each client's weights until the round ends "
          f"({rounds} rounds each, alternating, medians)\n")
    print("| loop | local steps per client, ms | round, ms |\n|---|---:|---:|")
    for side, (st, rd) in ms.items():
        print(f"| {side} | {st:.3f} | {rd:.1f} |")
    print(f"\nholding / lean: local steps {ms['holding'][0] / ms['lean'][0]:.3f}, "
          f"rounds {ms['holding'][1] / ms['lean'][1]:.3f}")


def profile(job: Job, top: int) -> None:
    """cProfile of one round of ``job`` on the engine (after two warm-up rounds, one thread): the entries
    with the most own time."""
    import cProfile
    import pstats

    from fedaug.core.runtime import configure_process
    from fedaug.engine.run import build_simulation

    cfg = engine_config(job, 3, 1, 1)
    configure_process(1)
    sim = build_simulation(cfg)
    sim.run_round(1)
    sim.run_round(2)
    prof = cProfile.Profile()
    prof.enable()
    sim.run_round(3)
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"## cProfile of one {job.name} round: {stats.total_tt:.3f} s, {stats.total_calls} calls\n")
    print("| function | calls | own ms | share |\n|---|---:|---:|---:|")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, fn), (_, calls, own, _, _) in rows:
        where = file.split("site-packages/")[-1].split("/src/")[-1] if file != "~" else "builtin"
        print(f"| {where}:{line}({fn}) | {calls} | {own * 1000:.1f} | {100 * own / stats.total_tt:.1f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=["W1", "W2"], choices=sorted(JOBS))
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per measurement (after 1 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats")
    parser.add_argument("--pin", type=int, default=None, help="pin the engine/bare comparison to this core")
    parser.add_argument("--workers-only", action="store_true", help="only the worker scaling")
    parser.add_argument("--bare-only", action="store_true", help="only the engine / bare comparison")
    parser.add_argument("--profile", type=int, metavar="N", help="print the N entries of one round's cProfile with "
                                                                  "the most own time (first job), and stop")
    parser.add_argument("--split", action="store_true", help="where the engine's time per client goes against "
                                                             "the lean loop's (first job, --rounds rounds), and stop")
    parser.add_argument("--held", action="store_true", help="what holding each client's copy until the round ends "
                                                            "costs the lean loop (first job, --rounds rounds), "
                                                            "and stop")
    parser.add_argument("--quick", action="store_true", help="2 rounds x 1 repeat (smoke run)")
    parser.add_argument("--device", default="cpu", help="where every run trains (e.g. cuda: the workers share it)")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="worker counts to compare (default 1, 2, 4, 8 up to the cores)")
    parser.add_argument("--groups", type=int, nargs="+", default=None, metavar="G",
                        help="only compare train.group_clients = G (e.g. 1 10: one at a time, then groups of 10)")
    parser.add_argument("--graph", action="store_true",
                        help="only compare train.cuda_graph = true (a client's step replayed from CUDA graphs) with "
                             "eager steps (CUDA only)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the --groups and --graph comparisons")
    parser.add_argument("--executions", type=int, nargs=2, metavar=("G", "P"), default=None,
                        help="per method of --methods: one client at a time against groups of G, groups of G "
                             "captured (train.cuda_graph; CUDA only) and P runs packed (seeds 0..P-1, clients/s "
                             "counting every run's; issue 62)")
    parser.add_argument("--methods", nargs="+", default=["fedavg"], choices=sorted(METHODS),
                        help="the methods of --executions and --defaults")
    parser.add_argument("--defaults", action="store_true",
                        help="each method of --methods under the default settings (train.cuda_graph and "
                             "data.on_device \"auto\": what a user who sets only the device gets, issue 63) "
                             "against the first: its clients/s as a multiple of the first's")
    args = parser.parse_args()
    from fedaug.engine.records.installation import machine_line

    print(machine_line() + "\n")  # docs/benchmarks.md names the machine of every figure
    rounds, repeats = (2, 1) if args.quick else (args.rounds, args.repeats)
    jobs = [JOBS[j] for j in args.jobs]
    if args.split:
        split(jobs[0], rounds)
        return
    if args.profile:
        profile(jobs[0], args.profile)
        return
    if args.held:
        held(jobs[0], rounds)
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} cores\n")
    if args.executions:
        g, p = args.executions
        for method in args.methods:
            settings = [("one at a time", {"method": method}), (f"group_clients = {g}", {"group": g, "method": method}),
                        *([(f"group_clients = {g}, cuda_graph", {"group": g, "graph": True, "method": method})]
                          if args.device.startswith("cuda") else []),
                        (f"{p} runs packed", {"pack": p, "method": method})]
            compare_settings(jobs, rounds, repeats, settings, f"Executions of {method}", args.pin, args.device,
                             args.threads)
        return
    if args.defaults:
        settings = [(f"{method}, defaults", {"method": method, "graph": "auto"}) for method in args.methods]
        compare_settings(jobs, rounds, repeats, settings, "Default settings", args.pin, args.device, args.threads,
                         same_numbers=False)
        return
    if args.groups:
        groups = [(f"group_clients = {g}", {"group": g}) for g in sorted({1, *args.groups})]
        compare_settings(jobs, rounds, repeats, groups, "Grouped clients", args.pin, args.device, args.threads)
        return
    if args.graph:
        graphs = [("eager steps", {"graph": False}), ("cuda_graph = true", {"graph": True})]
        compare_settings(jobs, rounds, repeats, graphs, "CUDA graphs", args.pin, args.device, args.threads)
        return
    if not args.workers_only:
        compare_bare(jobs, rounds, repeats, args.pin, args.device)
    if not args.bare_only:
        cores = len(os.sched_getaffinity(0))
        counts = args.workers or [k for k in (1, 2, 4, 8) if k <= max(cores, 2)]
        compare_workers(jobs, rounds, repeats, sorted({1, *counts}), args.device)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
