"""The in-process simulation engine: seeded, order-free rounds over logical client ids.

One worker model serves every client (memory stays flat in the number of clients, DESIGN.md
invariant 4); all randomness is derived from (seed, round, client, component, purpose), so the
result does not depend on the order in which clients are trained (invariant 1); every message part
is validated and its bytes counted (invariants 3 and 5); checkpoints make resumed runs exact (6).
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

from fedaug.config.load import parse_config, read_toml
from fedaug.config.schema import RunConfig
from fedaug.core.errors import CheckpointError, ConfigError, FedaugError, PayloadError
from fedaug.core.payload import Message, message_nbytes, state_nbytes, validate_part
from fedaug.core.rng import scoped_global_seed
from fedaug.core.runtime import retain_freed_memory
from fedaug.data.base import FederatedData
from fedaug.data.registry import load_dataset
from fedaug.engine.after_aggregate import queriers, query_clients
from fedaug.engine.evaluate import evaluate
from fedaug.engine.local import train_client
from fedaug.engine.progress import Progress
from fedaug.engine.records import CONFIG, RunDir
from fedaug.engine.schedule import clients_per_round, learning_rate, sample_clients
from fedaug.methods.component import ClientCtx, State, Uplink
from fedaug.methods.recipe import Recipe, build_recipe
from fedaug.metrics.tasks import make_task
from fedaug.models.registry import build_model

CHECKPOINT_FORMAT = 1
Order = Callable[[list[int]], list[int]]


class Simulation:
    """Runs a configured experiment round by round in this process.

    Args:
        cfg: the validated run configuration.
        data: the federated dataset.
        recipe: the method (base algorithm + augmentations).
        execution_order: permutes the sampled client ids before training them (tests use it to
            show that the order does not matter); default: ascending ids.
    """

    def __init__(self, cfg: RunConfig, data: FederatedData, recipe: Recipe,
                 execution_order: Order | None = None) -> None:
        self.task = make_task(data.task, data.num_classes)
        for k, c in enumerate(data.clients):
            if len(c.train) == 0:
                raise ConfigError(f"client {k} ('{c.name}') has no training samples; change the partition")
        if cfg.eval.best_by == "val" and all(len(c.val) == 0 for c in data.clients):
            raise ConfigError("eval.best_by='val' but no client has a validation split; set eval.best_by=test")
        clients_per_round(data.num_clients, cfg.train.participation)  # fails early on 0 clients
        self.cfg, self.data, self.recipe = cfg, data, recipe
        self.order = execution_order or (lambda ids: ids)
        with scoped_global_seed(cfg.seed, "init"):
            self.model = build_model(cfg.model.name, data.input_shape[0], data.num_classes, **cfg.model.options)
        for c in recipe.components:
            c.setup(self.model)
            c.setup_server(data.num_clients)
        self.server: dict[str, State] = {c.name: c.init_server(self.model) for c in recipe.components}
        self.down_specs = {c.name: c.downlink_spec(self.model) for c in recipe.components}
        self.client_states: dict[int, dict[str, State]] = {}
        self.round = 0
        self.best: dict[str, Any] | None = None
        self.last_eval: dict[str, Any] | None = None
        self.comm_total = {"down": 0, "up": 0}

    # --- one round ----------------------------------------------------------------------------
    def run_round(self, r: int) -> dict[str, Any]:
        """Sample, train every sampled client, validate uplinks, aggregate; return the round record."""
        cfg, data = self.cfg, self.data
        t0 = time.perf_counter()
        lr = learning_rate(cfg.train, r)
        sampled = sample_clients(cfg.seed, r, data.num_clients, cfg.train.participation)
        down = {c.name: 0 for c in self.recipe.components}
        up = dict(down)
        uplinks: dict[int, tuple[Message, int]] = {}
        rejected, train_metrics = [], {}
        for cid in self.order(list(sampled)):
            message = {c.name: c.downlink(self.server[c.name], cid) for c in self.recipe.components}
            for name, nbytes in message_nbytes(message).items():
                down[name] += nbytes
            for name, part in message.items():  # the client checks what it receives
                validate_part(part, self.down_specs[name], f"round {r}: downlink to client {cid}, part '{name}'")
            ctx = ClientCtx(self.model, cid, r, cfg.seed, data.clients[cid].train, lr=lr, task=self.task)
            result = train_client(self.recipe, ctx, message, self.client_states.get(cid, {}), cfg.train)
            for name, nbytes in message_nbytes(result.uplink).items():
                up[name] += nbytes
            try:
                for c in self.recipe.components:
                    validate_part(result.uplink.get(c.name), c.uplink_spec(self.server[c.name]),
                                  f"uplink of client {cid}, part '{c.name}'")
            except PayloadError as exc:
                rejected.append({"client": cid, "reason": str(exc)})
                continue
            uplinks[cid] = (result.uplink, len(data.clients[cid].train))
            train_metrics[str(cid)] = result.metrics
            if result.state:
                self.client_states[cid] = result.state
            else:
                self.client_states.pop(cid, None)
        if len(uplinks) < cfg.train.min_clients:
            reasons = "; ".join(f"client {x['client']}: {x['reason']}" for x in rejected)
            raise FedaugError(
                f"round {r}: only {len(uplinks)} of {len(sampled)} uploads passed validation, "
                f"fewer than train.min_clients={cfg.train.min_clients} ({reasons})"
            )
        order = sorted(uplinks)  # aggregation order is fixed, whatever the execution order
        for c in self.recipe.components:
            parts = [Uplink(cid, uplinks[cid][1], uplinks[cid][0][c.name]) for cid in order]
            self.server[c.name] = c.aggregate(self.server[c.name], parts)
        query = None
        if queriers(self.recipe):  # e.g. FLea: the round's clients upload features of the new model
            query = query_clients(self.recipe, self.model, self.server, self.client_states, data, self.task,
                                  cfg.seed, r, order, self.down_specs[self.recipe.base.name], self.order)
            for name, nbytes in query.down.items():
                down[name] += nbytes
            for name, nbytes in query.up.items():
                up[name] += nbytes
            rejected += query.rejected
        self.round = r
        self.comm_total = {"down": self.comm_total["down"] + sum(down.values()),
                           "up": self.comm_total["up"] + sum(up.values())}
        losses = [m["loss"] for m in train_metrics.values()]
        return {
            "round": r, "lr": lr, "sampled": sampled, "rejected": rejected,
            "train": {"loss": sum(losses) / len(losses), "clients": train_metrics},
            "comm": {"down": down, "up": up, "down_total": sum(down.values()), "up_total": sum(up.values())},
            "client_state": {"bytes": {str(cid): state_nbytes(self.client_states[cid]) for cid in order
                                       if cid in self.client_states},
                             "total_bytes": sum(state_nbytes(st) for st in self.client_states.values())},
            "time": {"train_s": time.perf_counter() - t0},
            **({"after_aggregate": {"down": query.down, "up": query.up}} if query is not None else {}),
        }

    def evaluate(self) -> dict[str, Any]:
        """Evaluate the current global model on every client (see :func:`evaluate`)."""
        return evaluate(self.model, self.recipe, self.server, self.client_states, self.data, self.task,
                        self.cfg.seed, self.round, self.cfg.eval.batch_size)

    def _track_best(self, r: int, ev: dict[str, Any]) -> None:
        key = f"{self.cfg.eval.best_by}_{self.task.metric}"
        score = ev["mean"][key]
        if self.best is None or score > self.best["score"]:
            self.best = {"round": r, "by": self.cfg.eval.best_by, "score": score, "eval": ev}
        self.last_eval = {"round": r, "eval": ev}

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to continue exactly: plain dicts of tensors and scalars."""
        return {"format": CHECKPOINT_FORMAT, "round": self.round, "config": self.cfg.to_dict(),
                "server": self.server, "clients": self.client_states,
                "best": self.best, "last_eval": self.last_eval, "comm_total": self.comm_total}

    def restore(self, payload: dict[str, Any]) -> None:
        """Continue from :meth:`checkpoint`'s output (the config must be the same)."""
        if payload.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"checkpoint format {payload.get('format')!r} is not {CHECKPOINT_FORMAT}")
        if payload["config"] != self.cfg.to_dict():
            raise CheckpointError("the checkpoint was written by a different config; resume with the run's own config.toml")
        self.round, self.server, self.client_states = payload["round"], payload["server"], payload["clients"]
        self.best, self.last_eval = payload["best"], payload["last_eval"]
        self.comm_total = payload["comm_total"]

    # --- the whole run ------------------------------------------------------------------------
    def run(self, run_dir: RunDir | None = None, progress: Progress | None = None) -> dict[str, Any]:
        """Run the remaining rounds; write records to ``run_dir`` if given; return the summary."""
        cfg = self.cfg
        total = cfg.train.rounds
        for r in range(self.round + 1, total + 1):
            record = self.run_round(r)
            if r % cfg.eval.every == 0 or r == total:
                t0 = time.perf_counter()
                record["eval"] = self.evaluate()
                record["time"]["eval_s"] = time.perf_counter() - t0
                self._track_best(r, record["eval"])
            if run_dir is not None:
                run_dir.append_round(record)
                if r % cfg.checkpoint_every == 0 or r == total:
                    run_dir.save_checkpoint(r, self.checkpoint(), cfg.keep_checkpoints)
            if progress is not None:
                progress.update(r, self._progress_metric(record))
        summary = self.summary(run_dir.path if run_dir is not None else None)
        if run_dir is not None:
            run_dir.write_summary(summary)
        return summary

    def _progress_metric(self, record: dict[str, Any]) -> str:
        text = f"train loss {record['train']['loss']:.4f}"
        if "eval" in record:
            m = self.task.metric
            text += f"  mean test {m} {record['eval']['mean'][f'test_{m}']:.4f}"
        return text

    def summary(self, run_dir: Path | None) -> dict[str, Any]:
        """Final and best evaluation, communication totals (bytes) and the run directory."""
        return {
            "name": self.cfg.name, "rounds": self.round, "metric": self.task.metric,
            "clients": [c.name for c in self.data.clients],
            "final": self.last_eval, "best": self.best, "comm_total": self.comm_total,
            "run_dir": str(run_dir) if run_dir is not None else None,
            "data_info": self.data.info,
        }


def build_simulation(cfg: RunConfig, execution_order: Order | None = None) -> Simulation:
    """Validate the method, load the data and build a :class:`Simulation` (no files written)."""
    recipe = build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
    torch.set_num_threads(cfg.threads)
    retain_freed_memory()
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    return Simulation(cfg, data, recipe, execution_order)


def run_experiment(cfg: RunConfig, *, quiet: bool = False, write: bool = True,
                   execution_order: Order | None = None) -> tuple[dict[str, Any], RunDir | None]:
    """Run ``cfg`` from scratch; with ``write``, in a new run directory under ``cfg.out_dir``."""
    sim = build_simulation(cfg, execution_order)
    run_dir = None
    if write:
        run_dir = RunDir.create(cfg.out_dir, cfg.name or f"{cfg.data.name}-{cfg.method.base}")
        run_dir.write_config(cfg)
    return sim.run(run_dir, Progress(cfg.train.rounds, quiet=quiet)), run_dir


def resume_experiment(path: str, *, quiet: bool = False) -> tuple[dict[str, Any], RunDir]:
    """Finish the run in ``path`` from its newest checkpoint (or from scratch if it has none)."""
    run_dir = RunDir.open(path)
    cfg = parse_config(read_toml(run_dir.path / CONFIG))
    sim = build_simulation(cfg)
    payload = run_dir.load_latest()
    if payload is not None:
        sim.restore(payload)
    run_dir.truncate_rounds(sim.round)
    return sim.run(run_dir, Progress(cfg.train.rounds, start=sim.round, quiet=quiet)), run_dir

