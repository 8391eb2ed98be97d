"""FLea's per-round time against FedAvg's on the same clients, and the buffer's bytes.

Run: ``nice -n 10 .venv/bin/python benchmarks/bench_flea.py [--rounds 3] [--samples 6000]``
(the ``flea_fmnist`` preset's clients; both methods see the same sampled clients each round).
Prints a Markdown table: seconds per round (mean over rounds 2.., round 1 has no buffer), the
buffer's rows and bytes, and FLea's per-round downlink/uplink bytes beside FedAvg's.
"""

from __future__ import annotations

import argparse
import statistics

from fedaug import load_config
from fedaug.config.schema import validate
from fedaug.core.runtime import configure_process
from fedaug.engine.run import build_simulation


def measure(flea: bool, rounds: int, samples: int) -> dict[str, float]:
    cfg, _ = load_config("flea_fmnist", [f"train.rounds={rounds}", "threads=1", f"data.options.samples={samples}",
                                         "method.options.flea.stage=block2"])  # the split of the recorded figures
    raw = cfg.to_dict()
    if not flea:
        raw["method"] = {"base": "fedavg", "augs": [], "options": {}}
    sim = build_simulation(validate(raw))
    recs = [sim.run_round(r) for r in range(1, rounds + 1)]
    buf = sim.server.get("flea")
    return {
        "s_per_round": statistics.mean(r["time"]["train_s"] for r in recs[1:]),
        "down_bytes": statistics.mean(r["comm"]["down_total"] for r in recs[1:]),
        "up_bytes": statistics.mean(r["comm"]["up_total"] for r in recs[1:]),
        "buffer_rows": float(buf["features"].shape[0]) if buf else 0.0,
        "buffer_bytes": float(buf["features"].numel() * 4 + buf["labels"].numel() * 8) if buf else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=6000)
    args = parser.parse_args()
    configure_process(1)  # the runs' threads = 1, as the command line would set them
    rows = {"FedAvg": measure(False, args.rounds, args.samples), "FLea": measure(True, args.rounds, args.samples)}
    print("| method | s / round | down bytes / round | up bytes / round | buffer rows | buffer bytes |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, m in rows.items():
        print(f"| {label} | {m['s_per_round']:.2f} | {m['down_bytes']:.0f} | {m['up_bytes']:.0f} | "
              f"{m['buffer_rows']:.0f} | {m['buffer_bytes']:.0f} |")
    print(f"\nFLea / FedAvg time per round: {rows['FLea']['s_per_round'] / rows['FedAvg']['s_per_round']:.2f}x")


if __name__ == "__main__":
    main()
