"""How far each execution of the one client step lands from eager steps (issue 45): the measured tolerances of
docs/engine.md's table "Executions per method".

For each method (the configs of tests/engine/test_grouped.py: a tiny synthetic federation of 4 clients, 3 rounds
of 3 steps) and each execution, the largest absolute difference of any record value, final weight or
per-client state from eager steps on the same device, and the largest relative one (``|a - b| / (|b| + 1e-3)``):

* ``grouped``: ``train.group_clients = 4`` (vmap);
* ``captured``: every step replayed from a capture (on a CPU :class:`~fedaug.engine.client.capture.TracedCapture`,
  CUDA graphs' semantics; on CUDA ``train.cuda_graph = true``);
* ``workers``: ``workers = 2`` (CPU only; processes of the same program).

Run from the repository root (the test helpers are imported from ``tests``)::

    PYTHONPATH=src:. .venv/bin/python benchmarks/measure_tolerances.py --device cpu
    PYTHONPATH=src:. python benchmarks/measure_tolerances.py --device cuda --executions grouped captured
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import torch

from fedaug.config.schema import validate
from fedaug.core.device import cpu_name
from fedaug.engine.client.capture import TracedCapture
from fedaug.engine.client.graphed import GraphedSteps
from fedaug.engine.run import Simulation, build_simulation
from tests.engine.test_grouped import METHODS, config, leaves, records

EXECUTIONS = ("grouped", "captured", "workers")


def simulation(method: str, execution: str | None, device: str) -> Simulation:
    raw = config(method, 4 if execution == "grouped" else 1).to_dict()
    raw["device"] = device
    if execution == "workers":
        raw.update(workers=2, threads=1)
    if execution == "captured" and device != "cpu":
        raw["train"]["cuda_graph"] = True
    sim = build_simulation(validate(raw))
    if execution == "captured" and device == "cpu":
        worker = sim.fleet.worker
        worker.graphs = GraphedSteps(worker.recipe, worker.model, worker.cfg.train, TracedCapture())
    return sim


def outcome(sim: Simulation) -> dict[str, Any]:
    return {"records": records(sim, 3), "server": sim.server, "clients": sim.client_states}


def differences(got: dict[str, Any], want: dict[str, Any]) -> tuple[float, float]:
    """The largest absolute and relative difference over every numeric leaf (NaN where the leaves differ)."""
    g, w = dict(leaves(got)), dict(leaves(want))
    if g.keys() != w.keys():
        return math.nan, math.nan
    worst_abs = worst_rel = 0.0
    for path, b in w.items():
        a = g[path]
        if isinstance(b, torch.Tensor) or (isinstance(b, (int, float)) and not isinstance(b, bool)):
            a64, b64 = (torch.as_tensor(v, dtype=torch.float64).cpu() for v in (a, b))
            d = (a64 - b64).abs()
            if d.numel():
                worst_abs = max(worst_abs, float(d.max()))
                worst_rel = max(worst_rel, float((d / (b64.abs() + 1e-3)).max()))
        elif a != b:
            return math.nan, math.nan
    return worst_abs, worst_rel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--methods", nargs="+", default=sorted(METHODS))
    p.add_argument("--executions", nargs="+", default=list(EXECUTIONS), choices=EXECUTIONS)
    args = p.parse_args(argv)
    where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else cpu_name()
    print(f"# executions against eager steps on {args.device} ({where}), torch {torch.__version__}")
    print("| method | " + " | ".join(f"{e}: max abs / max rel" for e in args.executions) + " |")
    print("|---|" + "---:|" * len(args.executions))
    for method in args.methods:
        torch.set_num_threads(1)
        eager = outcome(simulation(method, None, args.device))
        cells = []
        for execution in args.executions:
            if execution == "workers" and args.device != "cpu":
                cells.append("n/a")
                continue
            a, r = differences(outcome(simulation(method, execution, args.device)), eager)
            cells.append("0 (bit for bit)" if a == 0 and r == 0 else f"{a:.1e} / {r:.1e}")
        print(f"| {method} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
