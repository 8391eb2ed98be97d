"""The main job's record: the figures the README quotes and a fingerprint of the job's first rounds, per CPU
model, torch CPU capability and thread count (``results/main_digits4.json``).

The main job (``make run``: ``fedaug compare main_digits4 --jobs 2 --out runs/main``) repeats bit for bit only on
the same CPU model, torch CPU capability and thread count (docs/engine.md, "Reproducibility across CPUs"). Its
record says, for each machine it was measured on, which code (commit) produced which figures there, and
keeps the records of the job's first :data:`ROUNDS` rounds and a digest of the server's state after them:
tests/experiments/test_main_job.py computes those rounds again and fails when a change alters the job's
numerics; tests/docs/test_readme.py checks the README's figures against the record.

When a change alters the numerics on purpose, commit it, then, on a machine where nothing else runs::

    make run                                                     # the main job, into runs/main
    .venv/bin/python experiments/main_job.py runs/main --table   # this machine's entry; the README's figures

Before it writes anything, the script checks that the finished runs are this code's: their configs are the
grid's, they ran on this machine, and their first rounds equal the fingerprint computed here. Then it
writes this machine's entry into the record and the README's block of figures (between :data:`BEGIN` and
:data:`END`) from the record: the table of the entry the record names (``--table``: this machine's), every
other entry in a sentence. An entry for another machine is written on it (``ATEN_CPU_CAPABILITY=avx2`` lowers
the capability, for both commands); entries of other code versions are stale once the numerics change: write
them again on their machines or delete them from the record (the script names them).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from fedaug.config.load import parse_config, read_toml
from fedaug.core.device import cpu_name
from fedaug.core.runtime import deterministic_algorithms, torch_threads
from fedaug.engine.records.rundir import CONFIG, SUMMARY, read_records
from fedaug.engine.run import build_simulation
from fedaug.methods.recorded import pin
from fedaug.report.grid import load_grid
from fedaug.report.runner import Cell, config_key, config_mismatch, find_run, plan

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "results" / "main_digits4.json"
README = ROOT / "README.md"
GRID = "main_digits4"
#: rounds the fingerprint covers: the second starts from an aggregated model; few enough for a test (both cells:
#: 38-50 s of one core's time on the 2-core Xeon, measured under load)
ROUNDS = 2
#: the README's block of figures that :func:`readme_block` writes lies between these lines
BEGIN = "<!-- main job figures: written by experiments/main_job.py from results/main_digits4.json -->"
END = "<!-- end of the main job figures -->"


def main_cells(out: Path) -> dict[str, Cell]:
    """The main job's cells by method label (``FedAvg``, ``FedAvg + FedRDN``), as ``make run`` plans them into
    ``out`` (one torch thread each, as with ``--jobs 2``)."""
    return {cell.method: cell for cell in plan(load_grid(GRID), out, jobs=1)}


def machine_key(cpu: str, capability: str, threads: int) -> str:
    """The record's key for CPU model ``cpu`` with torch CPU ``capability`` at ``threads`` torch threads, e.g.
    ``"Intel(R) Xeon(R) Processor, AVX512, 1 thread"``."""
    return f"{cpu}, {capability}, {threads} thread{'' if threads == 1 else 's'}"


def state_digest(state: Any) -> str:
    """SHA-256 of a server state (plain dicts of tensors and scalars, DESIGN.md invariant 2): every leaf's path,
    and each tensor's dtype, shape and bytes or each scalar's ``repr``, dict keys in sorted order."""
    digest = hashlib.sha256()

    def add(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                add(f"{path}/{key}", value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                add(f"{path}[{i}]", item)
        elif isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{path}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{path}={value!r};".encode())

    add("", state)
    return digest.hexdigest()


def first_rounds(cell: Cell, rounds: int = ROUNDS) -> dict[str, Any]:
    """The cell's first ``rounds`` rounds, computed as ``make run`` computes them (the cell's own 20-round config,
    its thread count; the engine's round and evaluation): their records without times, as JSON gives them
    back, and :func:`state_digest` of the server's state after them (the global weights among it)."""
    cfg = pin(parse_config(cell.raw))
    records = []
    with torch_threads(cell.raw["threads"]), deterministic_algorithms(cfg.deterministic), \
            build_simulation(cfg) as sim:
        for r in range(1, rounds + 1):
            record = sim.run_round(r)
            if r % cfg.eval.every == 0:
                record["eval"] = sim.evaluate(record["sampled"] if cfg.eval.clients == "sampled" else None)
            record.pop("time")
            records.append(record)
        digest = state_digest(sim.server)
    return {"records": json.loads(json.dumps(records)), "server_sha256": digest}


def finished_run(cell: Cell) -> Path:
    """The cell's finished run directory under ``cell.dir``, whose config is the cell's.

    Raises:
        SystemExit: there is none, or it ran with another config.
    """
    run = find_run(cell.dir)
    if run is None or not (run / SUMMARY).is_file():
        raise SystemExit(f"{cell.dir}: no finished run of '{cell.method}'; run the main job first (make run)")
    diff = config_mismatch(read_toml(run / CONFIG), cell.raw)
    if diff:
        raise SystemExit(f"{run} ran with another config than grid {GRID}'s ({', '.join(diff)} differ); "
                         "rerun the main job into an empty directory")
    return run


def cell_figures(run: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of a finished run: final test accuracy per client (in client order) and their
    mean, seconds of training and evaluation, and the fingerprint after checking it against the run's first
    rounds.

    Raises:
        SystemExit: the run's first rounds are not the fingerprint (another code version or machine made it).
    """
    summary = json.loads((run / SUMMARY).read_text())
    records, _ = read_records(run / "metrics.jsonl")
    ran = [{k: v for k, v in rec.items() if k != "time"} for rec in records[:len(fingerprint["records"])]]
    if ran != fingerprint["records"]:
        raise SystemExit(f"{run}: its first {len(ran)} rounds differ from what this code computes on this machine; "
                         "rerun the main job with this code (make run) into an empty directory")
    final = summary["final"]["eval"]
    return {"test_acc": {c: final["clients"][c]["test"]["acc"] for c in summary["clients"]},
            "mean_test_acc": final["mean"]["test_acc"],
            "run_s": round(sum(r["time"]["train_s"] + r["time"].get("eval_s", 0.0) for r in records)),
            "config_key": config_key(read_toml(run / CONFIG), stored=True), **fingerprint}


def commit() -> str:
    """This checkout's commit (short hash).

    Raises:
        SystemExit: ``src/`` has uncommitted changes (the record must name the code that computed it).
    """
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    if git("status", "--porcelain", "--", "src"):
        raise SystemExit("src/ has uncommitted changes: commit them first, so that the record names the code it "
                         "comes from")
    return git("rev-parse", "--short", "HEAD")


def machine_entry(runs: Path) -> tuple[str, dict[str, Any]]:
    """This machine's key and entry, from the finished main job in ``runs``.

    Raises:
        SystemExit: a run is missing, ran with another config or elsewhere, or is not this code's.
    """
    cells = main_cells(runs)
    entry: dict[str, Any] = {"commit": commit(), "date": datetime.date.today().isoformat(), "cells": {}}
    for label, cell in cells.items():
        run = finished_run(cell)
        env = json.loads((run / SUMMARY).read_text())["environment"]
        here = {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "torch": str(torch.__version__), "threads": cell.raw["threads"]}
        moved = [k for k, v in here.items() if env[k] != v]
        if moved:
            moves = ", ".join(f"{k} {env[k]!r}, here {here[k]!r}" for k in moved)
            raise SystemExit(f"{run} ran elsewhere ({moves}): write a machine's entry on that machine")
        entry.update(here, aten_cpu_capability=os.environ.get("ATEN_CPU_CAPABILITY"))
        entry["cells"][label] = cell_figures(run, first_rounds(cell))
    return machine_key(entry["cpu"], entry["cpu_capability"], entry["threads"]), entry


def percent(x: float) -> str:
    """A fraction as the README's percentage, e.g. ``0.56337`` -> ``"56.34"``."""
    return f"{100 * x:.2f}"


def rows(entry: dict[str, Any]) -> dict[str, tuple[list[str], str, str]]:
    """``entry``'s figures per cell label: each client's final test accuracy, the mean and the worst client (%),
    after the first row the mean and worst with their difference to the first row's (percentage points)."""
    out: dict[str, tuple[list[str], str, str]] = {}
    first: tuple[float, float] | None = None
    for label, cell in entry["cells"].items():
        mean, worst = cell["mean_test_acc"], min(cell["test_acc"].values())
        accs = [percent(a) for a in cell["test_acc"].values()]
        if first is None:
            out[label], first = (accs, percent(mean), percent(worst)), (mean, worst)
        else:
            out[label] = (accs, f"{percent(mean)} ({100 * (mean - first[0]):+.2f})",
                          f"{percent(worst)} ({100 * (worst - first[1]):+.2f})")
    return out


def table(entry: dict[str, Any]) -> list[str]:
    """The README's table of ``entry`` (:func:`rows`), one column per client in client order."""
    clients = list(next(iter(entry["cells"].values()))["test_acc"])
    lines = [f"| test accuracy, final round (%) | {' | '.join(clients)} | mean | worst client |",
             "|---|" + "---:|" * (len(clients) + 2)]
    return lines + [f"| {label} | {' | '.join(accs)} | {mean} | {worst} |"
                    for label, (accs, mean, worst) in rows(entry).items()]


def where(entry: dict[str, Any]) -> str:
    """Where and with what ``entry`` was measured, e.g. "at commit bc37bfb (2026-11-28) on an Intel(R) Xeon(R)
    Processor (torch's CPU capability AVX512, torch 2.13.0+cpu, 1 thread per run)"."""
    forced = f", set by ATEN_CPU_CAPABILITY={entry['aten_cpu_capability']}" if entry["aten_cpu_capability"] else ""
    return (f"at commit {entry['commit']} ({entry['date']}) on an {entry['cpu']} (torch's CPU capability "
            f"{entry['cpu_capability']}{forced}, torch {entry['torch']}, {entry['threads']} thread per run)")


def in_short(entry: dict[str, Any]) -> str:
    """``entry``'s figures (:func:`rows`) in a sentence."""
    return " and ".join(f"{label} {' / '.join(accs)} (mean {mean}; worst {worst})"
                        for label, (accs, mean, worst) in rows(entry).items())


def readme_block(record: dict[str, Any]) -> str:
    """The README's block of figures: the entry ``record["readme"]`` names as the table, with where it was
    measured and how long its runs trained, then every other entry in a sentence."""
    key = record["readme"]
    entry = record["machines"][key]
    seconds = [cell["run_s"] for cell in entry["cells"].values()]
    lines = [BEGIN, f"What you should see, as measured {where(entry)}:", "", *table(entry), "",
             f"Its two runs trained (and evaluated) in {seconds[0]} s and {seconds[1]} s side by side on that "
             f"{entry['cpu']}."]
    lines += [f"Measured {where(other)}: {in_short(other)}."
              for k, other in sorted(record["machines"].items()) if k != key]
    return "\n".join([*lines, END])


def with_block(text: str, block: str) -> str:
    """``text`` (the README) with its block of figures replaced by ``block``.

    Raises:
        SystemExit: the README has no such block (its marker lines are missing).
    """
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"{README}: no block of figures to replace (the lines {BEGIN!r} ... {END!r})")
    return text[:start] + block + text[stop + len(END):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="?", default=ROOT / "runs" / "main",
                        help="the finished main job's directory (default: runs/main)")
    parser.add_argument("--table", action="store_true", help="the README's table quotes this machine's entry")
    args = parser.parse_args()
    key, entry = machine_entry(args.runs)
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {"grid": GRID, "machines": {}}
    record["machines"][key] = entry
    if args.table or "readme" not in record:
        record["readme"] = key
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    README.write_text(with_block(README.read_text(), readme_block(record)))
    print(f"wrote {RECORD.relative_to(ROOT)} ({key} at commit {entry['commit']}) and the README's figures "
          f"(the table: {record['readme']})")
    stale = [k for k, other in record["machines"].items() if other["commit"] != entry["commit"]]
    if stale:
        print(f"entries from other commits: {', '.join(stale)}; if the numerics changed since, delete them or "
              "write them again on their machines")


if __name__ == "__main__":
    main()
