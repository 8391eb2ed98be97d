"""The papers' own round counts in pieces that fit a GPU slot (issue 60; docs/benchmarks.md, "Paper-scale runs").

``benchmarks/paper_scale_gpu.sh SECONDS`` runs ``run``: for each grid of :data:`PRIORITY` in turn (the cheapest
first) whose paper-scale variant (``fedaug compare GRID --scale paper``: the paper's rounds and local epochs, the
same stand-in data, seeds 0-4) is not finished in ``results/``, it brings that variant's archive back into
``runs/compare`` (finished runs, and the newest checkpoint of each unfinished one), runs it packed with the GPU's
settings (:data:`SETTINGS`) and a time limit that leaves :data:`FINISH_S` for what follows, and archives it with
its unfinished runs; once the time is spent (or every grid is finished) it writes one tarball of every grid it
touched, ``$OUT/paper_scale.tar.gz``. ``fedaug archive paper_scale.tar.gz results`` merges that into
``results/`` on any machine; committed, it is what the next call (on a fresh machine that gets the repository's
tracked files) continues from, each cell where it stopped, so that the records equal an uninterrupted run's on
the same machine bit for bit (the settings include ``deterministic = true``, and a pack resumes as the same pack).

The machine needs the data: with ``FEDAUG_DATA_BUNDLE`` set (the script sets it to ``.data-bundle`` where that
exists), a grid runs only where the bundle holds every federation it loads (``fedaug data export GRID...
--scale paper --out .data-bundle`` writes it here, before the call; docs/data.md); otherwise it is skipped, saying
what is missing.

``plan`` prints what each paper-scale grid costs: its cells, rounds x local epochs (the stand-in's and the
paper's), and the client steps it trains (the sum over cells and rounds of the local steps of the clients a round
samples, on average; evaluation not counted), with the GPU slots that takes at the assumed throughput
(:data:`STEPS_PER_S`, an estimate until measured).

Exit status of ``run``: 0 when every grid of the list is finished, 75 when time ran out before (the next call
continues), 2 when a cell failed or a grid could not run (the tarball is written in every case).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedaug.cli.main import main as fedaug
from fedaug.config.load import parse_config
from fedaug.data.bundle import ENV, bundle_keys, federation_key
from fedaug.data.registry import load_dataset
from fedaug.engine.client.training import num_local_steps
from fedaug.engine.records.rundir import SUMMARY
from fedaug.engine.server.schedule import clients_per_round
from fedaug.report.archive import archive_grid, write_tarball
from fedaug.report.deadline import STOPPED_STATUS, now
from fedaug.report.grid import GridSpec, cell_federations, load_grid
from fedaug.report.paper_scale import paper_scale
from fedaug.report.runner import GRID_FILE, find_run, plan

#: the stand-in grids whose paper-scale variants a call runs, in this order: by the client steps ``plan``
#: estimates, the cheapest first (docs/benchmarks.md, "Paper-scale runs on a GPU", has the table).
#: flea_table1_fmnist is not among them: it trains at the paper's 100 rounds x 5 local epochs already, so its
#: variant would only add seeds, which the CPU runs at the stand-in scale add (issue 60, item 1).
PRIORITY = ("fedfa_table7_digits4", "flea_fig2_fmnist", "fedfa_table5_digits4", "fedrdn_table1_fedfa_digits4",
            "fedfa_table1_digits4", "fedfa_fig2_digits4", "fedfa_table6_digits4", "fedfa_table8_digits4",
            "fedfa_table4_digits4", "fedrdn_table1_digits4")
#: the settings of every cell on each device (part of each cell's config: every call must give the same ones).
#: ``deterministic``: deterministic kernels, so that a continued cell equals an uninterrupted one bit for bit
#: (docs/engine.md, "Devices and precision"); ``train.cuda_graph``: each step replayed from a CUDA graph where the
#: method can be captured (others train eagerly, after one notice); ``--pack`` groups the clients of each pack.
SETTINGS = {"cuda": ("device=cuda", "deterministic=true", "train.cuda_graph=true"),
            "cpu": ("device=cpu", "deterministic=true")}
#: seconds kept at the end of a call for archiving the grids and writing the tarball
FINISH_S = 20.0
#: no grid is started with less time left than this (its start-up alone: data, model, CUDA graphs)
MIN_GRID_S = 30.0
TARBALL = "paper_scale.tar.gz"
#: client steps per second assumed for ``plan``'s slot estimate: H100 figures of job G (docs/benchmarks.md:
#: small_cnn, batch 32) with deterministic kernels' cost (30 %) taken off the low end, an estimate until measured
STEPS_PER_S = (700.0, 1000.0)
#: the training seconds of one GPU slot: a 10-minute device call less the machine's work before and after
SLOT_S = 480.0


def finished(spec: GridSpec, directory: Path) -> tuple[int, int]:
    """``(finished, cells)``: how many of the grid's cells have a finished run in ``directory``."""
    cells = plan(spec, directory, local=False)
    done = sum((run := find_run(c.dir)) is not None and (run / SUMMARY).is_file() for c in cells)
    return done, len(cells)


def unbundled(spec: GridSpec, bundle: str | None) -> list[str]:
    """The federations the grid loads that the data bundle ``bundle`` lacks (none where no bundle is given)."""
    if not bundle:
        return []
    held = bundle_keys(Path(bundle))
    return [key for f in cell_federations(spec) if (key := federation_key(*f)) not in held]


def run_grid_piece(name: str, spec: GridSpec, seconds: float, device: str, results: Path, runs: Path,
                   stage: Path) -> int:
    """One grid's piece of a call: its archive brought back, ``fedaug compare GRID --scale paper --pack`` within
    ``seconds`` (a cell that another paper-scale grid in ``results`` has finished with the same config, such as
    FedAvg in the FedFA tables, is copied: ``--reuse``), then what it added to the archive in ``results`` (runs
    finished, unfinished runs that got further) archived into ``stage``; the exit status of the compare."""
    out = runs / spec.name
    if (results / spec.name / GRID_FILE).is_file():
        archive_grid(results / spec.name, out, keep_unfinished=True)
    code = fedaug(["compare", name, "--scale", "paper", "--pack", "--time-limit", f"{int(seconds)}s", "--out",
                   str(out), "--reuse", str(results), "-q", "--format", "json", "--set", *SETTINGS[device]])
    if (out / GRID_FILE).is_file():  # what the piece adds to results/: its tarball stays small
        archive_grid(out, stage / spec.name, keep_unfinished=True, known=results / spec.name)
    done, cells = finished(spec, out)
    print(f"paper_scale: {spec.name}: {done} of {cells} cells finished (fedaug compare exit {code})", flush=True)
    return code


def run_slot(seconds: float, out: Path, grids: Sequence[str], device: str, results: Path, runs: Path,
             bundle: str | None) -> int:
    """Run the paper-scale variants of ``grids`` in order for at most ``seconds`` and write the tarball of every grid
    touched into ``out`` (module docstring); the exit status."""
    ends, status = now() + seconds, 0
    with tempfile.TemporaryDirectory(prefix="paper-scale-") as tmp:
        stage = Path(tmp)
        for name in grids:
            spec = paper_scale(load_grid(name))
            done, cells = finished(spec, results / spec.name)
            missing = unbundled(spec, bundle)
            left = ends - now() - FINISH_S
            if done == cells:
                print(f"paper_scale: {spec.name}: finished in {results} ({cells} cells)", flush=True)
            elif missing:
                print(f"paper_scale: {spec.name}: skipped: the data bundle {bundle} lacks {len(missing)} federation(s) "
                      f"it loads, e.g. {missing[0]}; bundle them here with: fedaug data export {name} --scale paper "
                      "--out DIR", flush=True)
                status = 2
            elif left < MIN_GRID_S:
                print(f"paper_scale: {spec.name}: not started ({left:.0f} s left)", flush=True)
                status = status or STOPPED_STATUS
            else:
                code = run_grid_piece(name, spec, left, device, results, runs, stage)
                status = code if code == 2 else status or code
        touched = sorted(p for p in stage.iterdir() if p.is_dir())
        write_tarball(touched, out / TARBALL)
    print(f"paper_scale: {out / TARBALL}: {len(touched)} grid(s): {', '.join(p.name for p in touched) or 'none'}; "
          f"merge it with: fedaug archive {TARBALL} results", flush=True)
    return status


def client_steps(spec: GridSpec) -> int:
    """The client steps the grid trains (module docstring), from its federations' train splits (loaded)."""
    sizes: dict[str, list[int]] = {}
    total = 0.0
    for cell in plan(spec, Path("."), local=False):
        cfg = parse_config(cell.raw)
        key = federation_key(cfg.data.name, cfg.seed, cfg.data.options)
        if key not in sizes:
            sizes[key] = [len(c.train) for c in load_dataset(cfg.data.name, cfg.seed, **cfg.data.options).clients]
        n = sizes[key]
        share = clients_per_round(len(n), cfg.train.participation) / len(n)
        total += cfg.train.rounds * share * sum(num_local_steps(k, cfg.train) for k in n)
    return round(total)


def scale_text(spec: GridSpec) -> str:
    """The rounds x local epochs (or steps) of the grid's cells: ``"30 x 1"``, ``"20/30 x 1"``."""
    cfgs = [parse_config(spec.raw(s, m, spec.seeds[0])).train for s in spec.settings for m in spec.methods]
    rounds = "/".join(map(str, sorted({t.rounds for t in cfgs})))
    local = "/".join(sorted({f"{t.local_steps} steps" if t.local_steps else str(t.local_epochs) for t in cfgs}))
    return f"{rounds} x {local}"


def plan_rows(grids: Sequence[str]) -> list[dict[str, Any]]:
    """``plan``'s table: per grid, its cells, scales, client steps and the GPU slots they take (estimated)."""
    rows = []
    for name in grids:
        stand_in = load_grid(name)
        spec = paper_scale(stand_in)
        steps = client_steps(spec)
        rows.append({"grid": name, "cells": len(plan(spec, Path("."), local=False)), "stand-in": scale_text(stand_in),
                     "paper": scale_text(spec), "client steps": steps,
                     "slots": tuple(steps / (rate * SLOT_S) for rate in sorted(STEPS_PER_S, reverse=True))})
    return rows


def plan_table(rows: list[dict[str, Any]]) -> str:
    """``plan``'s rows as a Markdown table."""
    lines = ["| grid | cells | stand-in rounds x epochs | paper's | client steps (M) | H200 slots (est.) |",
             "|---|---:|---|---|---:|---:|"]
    lines += [f"| {r['grid']} | {r['cells']} | {r['stand-in']} | {r['paper']} | {r['client steps'] / 1e6:.2f} | "
              f"{r['slots'][0]:.1f}-{r['slots'][1]:.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="run the paper-scale grids for SECONDS, then write the tarball")
    run.add_argument("seconds", type=float)
    run.add_argument("--out", type=Path, required=True, help="where the tarball goes ($OUT)")
    run.add_argument("--device", choices=tuple(SETTINGS), default="cuda")
    run.add_argument("--grids", nargs="+", default=list(PRIORITY), help="grid names or files, in order")
    run.add_argument("--results", type=Path, default=Path("results"), help="the archives the call continues")
    run.add_argument("--runs", type=Path, default=Path("runs/compare"), help="where the grids run")
    show = actions.add_parser("plan", help="print what each paper-scale grid costs (loads its data)")
    show.add_argument("--grids", nargs="+", default=list(PRIORITY))
    actions.add_parser("grids", help="print the grids a call runs, in order (for fedaug data export)")
    args = parser.parse_args(argv)
    if args.action == "grids":
        print(" ".join(PRIORITY))
        return 0
    if args.action == "plan":
        print(plan_table(plan_rows(args.grids)))
        return 0
    return run_slot(args.seconds, args.out, args.grids, args.device, args.results, args.runs, os.environ.get(ENV))


if __name__ == "__main__":
    sys.exit(main())
