"""A grid's cells one at a time against packed (``fedaug compare --pack``, issue 62): the same grid, the same
cells, each side a fresh ``fedaug compare`` process, the two sides alternating; wall time, clients trained per
second, peak memory (the process's maximum resident set) per side, their medians and the ratio packed / one at a
time.

    taskset -c 0 .venv/bin/python benchmarks/bench_pack.py --grid main_digits4 --seeds 0 1 2 3 4 --rounds 2
    taskset -c 0 .venv/bin/python benchmarks/bench_pack.py --grid fedfa_table1_digits4 --seeds 0 1 2 3 4 --rounds 1

Pin the process to one core (``taskset``; each cell runs at ``threads = 1``): the comparison is then the two
programs' on one core. Extra ``--set`` overrides go to both sides (e.g. ``device=cuda``). docs/benchmarks.md has
the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIDES = ("one at a time", "packed")


def clients_trained(out: Path) -> int:
    """Every client training of every cell under the grid directory ``out`` (sampled clients, summed over rounds)."""
    total = 0
    for path in out.glob("*/*/seed*/*/metrics.jsonl"):
        for line in path.read_text().splitlines():
            total += len(json.loads(line)["train"]["clients"])
    return total


def run_side(packed: bool, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """One ``fedaug compare`` of the grid into ``out``: its wall time (s), clients trained per second and peak
    resident memory (MB)."""
    command = [sys.executable, "-m", "fedaug", "compare", args.grid, "--out", str(out), "-q",
               "--seeds", *map(str, args.seeds), "--set", f"train.rounds={args.rounds}", "threads=1", *args.set,
               *(["--only-methods", *args.only_methods] if args.only_methods else []),
               "--pack" if packed else "--no-pack"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed ({status}): {proc.stderr.read().decode()[-2000:]}")
    clients = clients_trained(out)
    return {"wall_s": wall, "clients": clients, "clients_per_s": clients / wall, "peak_mb": usage.ru_maxrss / 1024}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each side ``args.repeats`` times, alternating (one at a time first, then packed, ...)."""
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        for k in range(args.repeats):
            for packed, side in enumerate(SIDES):
                runs[side].append(run_side(bool(packed), args, Path(tmp) / f"{k}-{packed}"))
                print(f"{side} #{k + 1}: {runs[side][-1]}", file=sys.stderr)
    medians = {side: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for side, rs in runs.items()}
    return {"grid": args.grid, "seeds": args.seeds, "rounds": args.rounds, "set": args.set, "runs": runs,
            "medians": medians, "wall_ratio": medians["packed"]["wall_s"] / medians["one at a time"]["wall_s"]}


def table(result: dict[str, Any]) -> str:
    """The medians as a Markdown table, with the ratio."""
    m = result["medians"]
    rows = [f"| {side} | {m[side]['wall_s']:.1f} | {m[side]['clients_per_s']:.2f} | {m[side]['peak_mb']:.0f} |"
            for side in SIDES]
    return "\n".join(["| side | wall (s) | clients/s | peak memory (MB) |", "|---|---:|---:|---:|", *rows,
                      f"\npacked / one at a time, wall time: {result['wall_ratio']:.2f}"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="main_digits4", help="a shipped grid or a grid file")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--rounds", type=int, default=2, help="rounds per cell (train.rounds)")
    p.add_argument("--only-methods", nargs="+", default=[])
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every cell")
    p.add_argument("--repeats", type=int, default=2, help="runs per side, alternating")
    p.add_argument("--json", type=Path, help="write the measurements here")
    args = p.parse_args()
    result = measure(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(table(result))


if __name__ == "__main__":
    main()
