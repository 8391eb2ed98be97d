"""The analyses of ``fedaug privacy`` (:mod:`fedaug.cli.privacy_cmd`): restore a run from its
checkpoints, then measure its feature exposure, dCor and (eps, delta), or attack its features."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedaug.analysis.attacks import ReconstructionResult, context_attack, reconstruction_attack
from fedaug.analysis.figures import save_reconstructions
from fedaug.analysis.probe import feature_dcor, global_model, pooled
from fedaug.cli.privacy_cmd import guarantee
from fedaug.core.errors import ConfigError
from fedaug.core.runtime import configure_process
from fedaug.core.serialize import load_tensors
from fedaug.engine.records.rundir import RunDir, stored_config
from fedaug.engine.run import Simulation, build_simulation
from fedaug.models.split import forward_front
from fedaug.privacy.exposure import feature_exposure, flea_schedule, pool_schedule

Schedule = Callable[[Sequence[Sequence[int]]], tuple[list[list[int]], list[list[int]]]]
#: the components that pass one client's features or samples to others, and when (their receivers
#: are each round's sampled clients); every other component shares none (weights, statistics)
SHARING: dict[str, Schedule] = {"flea": flea_schedule, "feddata": pool_schedule, "fedmix": pool_schedule}


def _checkpoints(path: str) -> tuple[RunDir, dict[int, Path]]:
    run_dir = RunDir.open(path)
    found = dict(run_dir.checkpoints())
    if not found:
        raise ConfigError(f"'{path}' holds no checkpoint; run it (fedaug run) or resume it (fedaug resume) first")
    return run_dir, found


def restore_run(path: str | Path, round: int | None = None) -> tuple[Simulation, RunDir]:
    """The simulation of the run directory ``path`` restored from its checkpoint of ``round``
    (default: the latest kept one), with the run's thread settings applied.

    Raises:
        ConfigError: the directory holds no checkpoint, or none of ``round``.
    """
    run_dir, found = _checkpoints(str(path))
    if round is not None and round not in found:
        raise ConfigError(f"'{path}' keeps no checkpoint of round {round}; "
                          f"kept: {', '.join(map(str, sorted(found)))}")
    cfg = stored_config(run_dir.path)
    configure_process(cfg.threads, cfg.deterministic)
    sim = build_simulation(cfg)
    sim.restore(load_tensors(found[round if round is not None else max(found)]))
    return sim, run_dir


def shared_stage(sim: Simulation, stage: str | None = None) -> str:
    """``stage`` if given, else the run's ``flea.stage``, else the model's first feature stage."""
    if stage:
        return stage
    flea = {c.name: c for c in sim.recipe.components}.get("flea")
    return flea.stage if flea is not None else sim.model.feature_stages[0]


def pooled_dcor(sim: Simulation, stage: str, samples: int = 512) -> float:
    """dCor^2 (FLea Eq. 8) between ``samples`` raw training images pooled over the clients (at most
    all of them) and their features at ``stage`` under the global model, averaged over batches of
    64 (:func:`~fedaug.analysis.probe.feature_dcor`)."""
    x, _ = pooled(sim.data, "train", min(samples, sum(len(c.train) for c in sim.data.clients)), sim.cfg.seed)
    return feature_dcor(global_model(sim), x, stage)


def reconstruction(sim: Simulation, stage: str, samples: int = 512,
                   epochs: int = 20) -> tuple[ReconstructionResult, Tensor]:
    """The reconstruction attack on the global model's features at ``stage`` (FLea Sec. 4.4, App. D):
    ``samples`` pooled test images, the decoder trained on the first half and scored (MSE) on the
    second; returns the attack's result and those second-half originals."""
    model = global_model(sim)
    x, _ = pooled(sim.data, "test", samples, sim.cfg.seed)
    half = x.shape[0] // 2
    with torch.no_grad():
        f = forward_front(model, x, stage)
    res = reconstruction_attack(f[:half], x[:half], f[half:], x[half:], epochs=epochs, seed=sim.cfg.seed)
    return res, x[half:]


def _emit(rows: list[dict[str, Any]], fmt: str) -> int:
    if fmt == "json":
        print(json.dumps(rows, indent=2))
    else:
        keys = list(rows[0]) if rows else []
        print(" | ".join(keys))
        for r in rows:
            print(" | ".join(f"{r[k]:.4f}" if isinstance(r[k], float) else str(r[k]) for k in keys))
    return 0


def epsilon(args: argparse.Namespace) -> int:
    """(eps, delta) after every round, total and per release, from the run's records; the rows say
    :data:`~fedaug.cli.privacy_cmd.NO_GUARANTEE` for a run that declares no release."""
    records = RunDir.open(args.run_dir).rounds()
    rows = []
    for rec in records:
        entry = rec.get("privacy") or {}
        rows.append({"round": rec["round"], **guarantee(records, rec["round"]),
                     **{f"epsilon[{what}]": e for what, e in entry.get("releases", {}).items()}})
    return _emit(rows, args.format)


def exposure(args: argparse.Namespace) -> int:
    """eps(t) per round under the exchange schedule of the run's sharing components (:data:`SHARING`);
    0 in every round, with a note on stderr, for a run that shares no features or samples."""
    run_dir = RunDir.open(args.run_dir)
    summary = run_dir.read_summary()
    if summary is None:
        raise ConfigError(f"'{args.run_dir}' has no summary.json; finish the run first (fedaug resume)")
    method = stored_config(run_dir.path).method
    sharing = [n for n in (method.base, *method.augs) if n in SHARING]
    if not sharing:
        print(f"fedaug: note: the run's method ({' + '.join((method.base, *method.augs))}) passes no client's "
              f"features or samples to others (only {', '.join(SHARING)} do), so its exposure is 0 in every round",
              file=sys.stderr)
    sampled = [r["sampled"] for r in run_dir.rounds()]
    schedules = [SHARING[n](sampled)[0] for n in sharing]
    contributors = [sorted(set().union(*(s[t] for s in schedules))) for t in range(len(sampled))]
    eps = feature_exposure(contributors, sampled, len(summary["clients"]))
    return _emit([{"round": t + 1, "exposure": e} for t, e in enumerate(eps)], args.format)


def dcor_rounds(args: argparse.Namespace) -> int:
    """dCor at every kept checkpoint, beside the run's (eps, delta) after that round (:func:`guarantee`)."""
    rows = []
    for r in sorted(_checkpoints(args.run_dir)[1]):
        sim, run_dir = restore_run(args.run_dir, r)
        rows.append({"round": r, "dcor": pooled_dcor(sim, shared_stage(sim, args.stage), args.samples),
                     **guarantee(run_dir.rounds(), r)})
    return _emit(rows, args.format)


def attack(args: argparse.Namespace) -> int:
    if args.kind == "context" and args.samples <= max(args.train_sizes):
        raise ConfigError(f"--samples ({args.samples}) must exceed the largest --train-sizes entry "
                          f"({max(args.train_sizes)}): the attacker is tested on the rest; raise --samples or "
                          "lower --train-sizes")
    sim, run_dir = restore_run(args.run_dir)
    dp = guarantee(run_dir.rounds(), sim.round)  # the run's (eps, delta), beside the attack's success
    stage = shared_stage(sim, args.stage)
    if args.kind == "reconstruction":
        res, originals = reconstruction(sim, stage, args.samples, args.epochs)
        if args.png:
            save_reconstructions(Path(args.png), originals, {"reconstruction": res.reconstructions})
        return _emit([{"round": sim.round, "stage": stage, "test_mse": res.mse, **dp}], args.format)
    model, sizes = global_model(sim), args.train_sizes
    x, _ = pooled(sim.data, "test", args.samples, sim.cfg.seed)
    rows = context_attack(lambda g: forward_front(model, g.squeeze(1), stage), x, train_sizes=sizes,
                          test_size=x.shape[0] - max(sizes), seed=sim.cfg.seed)
    return _emit([{**row, **dp} for row in rows], args.format)
