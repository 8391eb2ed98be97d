"""fedaug's server side of a run, whatever carries the messages: the one round loop.

Per round the server samples logical client ids with its own seeded generator and runs the round's
phases, each the same exchange (:func:`~fedaug.engine.server.exchange.exchange`: a fresh message per
client, validated and counted replies): training, whose replies every component aggregates over
the accepted clients sorted by client id; the post-aggregation query, when a component replies in
it; and, every ``eval.every`` rounds, evaluation; then it records the round. The clients
are reached through a :class:`~fedaug.engine.protocol.Fleet`: the in-process engine
(:mod:`fedaug.engine.run`) and the Flower adapter (:mod:`fedaug.engine.flower`) both run this
code, so the same config and seed give the same numbers on either (DESIGN.md invariant 1).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from fedaug.config.load import flatten, parse_config
from fedaug.config.schema import RunConfig, choice_text, learning_rate, with_legacy
from fedaug.core.device import CPU, environment, module_device, to_device
from fedaug.core.errors import (AggregationError, CheckpointError, ConfigError, FedaugError, PayloadError,
                                RunStopped)
from fedaug.core.payload import tensor_leaves, value_extremes
from fedaug.core.rng import generator
from fedaug.core.runtime import deterministic_algorithms
from fedaug.data.base import FederatedData
from fedaug.engine.client.attack import check_attack
from fedaug.engine.execution import compared
from fedaug.engine.server.evaluation import meters_of, meters_spec, summarize_eval
from fedaug.engine.server.exchange import PhaseResult, exchange
from fedaug.engine.server.finetune import finetune_senders
from fedaug.engine.server.notices import ChanceWatch
from fedaug.engine.protocol import FINETUNED, METERS, Fleet, Rejected
from fedaug.engine.records.progress import Progress
from fedaug.engine.records.rundir import CHECKPOINT_FORMAT, CONFIG, SUMMARY, RunDir, checkpoint_problem
from fedaug.engine.records.tracking import Tracker
from fedaug.engine.server.schedule import clients_per_round, sample_clients
from fedaug.engine.server.screening import check_trust, screen_updates
from fedaug.methods.component import Phase, State, Uplink
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import make_task
from fedaug.privacy.accountant import run_accountant

#: what a resume compares between the checkpoint and this process (:meth:`Simulation.restore` warns on a change)
RESUME_ENVIRONMENT = ("device", "cpu", "cpu_capability", "threads")


#: where and how fast a run computes, not what (keys of the config, dotted below its top level): a checkpoint
#: restores whatever these were
PLACEMENT = ("device", "workers", "devices", "fleet", "ray", "data.on_device")


def _experiment(cfg: RunConfig, here: RunConfig) -> dict[str, Any]:
    """``cfg`` as a flat dict without :data:`PLACEMENT`, ``train.cuda_graph`` as the execution it resolves to on this
    machine with ``here``'s placement (:func:`~fedaug.engine.execution.compared`): what a checkpoint's config must
    equal to be restored."""
    placed = dataclasses.replace(cfg, **{k: getattr(here, k) for k in PLACEMENT if "." not in k})
    return {k: v for k, v in {**flatten(cfg.to_dict()), **compared(placed)}.items()
            if not any(k == p or k.startswith(f"{p}.") for p in PLACEMENT)}


def config_differences(stored: RunConfig, cfg: RunConfig) -> list[str]:
    """The keys in which ``cfg`` is another experiment than ``stored`` (a run's config, read with
    :func:`~fedaug.engine.records.rundir.stored_config` or :func:`~fedaug.config.schema.with_legacy`), each as
    ``key: stored's value -> cfg's``: every key but :data:`PLACEMENT`, ``train.cuda_graph`` compared by the execution
    it resolves to where ``cfg`` places the clients on this machine (so that ``"auto"`` and ``false`` are one
    experiment where they compute on a CPU, and a run captured on CUDA continues eagerly on a CPU, as a checkpoint
    moved to another device does: :meth:`Server.restore` warns).

    Raises:
        FedaugError: as :func:`~fedaug.engine.execution.captures`.
    """
    a, b = _experiment(stored, cfg), _experiment(cfg, cfg)

    def shown(c: RunConfig, flat: dict[str, Any], key: str) -> str:
        if key == "train.cuda_graph":  # the setting and the steps it gives here
            return f"{choice_text(c.train.cuda_graph)} ({'captured' if flat[key] else 'eager'} steps)"
        return repr(flat.get(key))

    return [f"{k}: {shown(stored, a, k)} -> {shown(cfg, b, k)}"
            for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


@dataclass(frozen=True)
class Federation:
    """What the server knows of the clients: their names, split sizes and data shape (never the data).

    Args:
        names: each client's name, by client id.
        num_train: each client's number of training samples (its aggregation weight).
        num_val: each client's number of validation samples.
        task: ``"classification"`` or ``"segmentation"``.
        num_classes: number of classes.
        input_shape: ``(C, *spatial)`` of one sample.
        info: provenance of the data.
    """

    names: list[str]
    num_train: list[int]
    num_val: list[int]
    task: str
    num_classes: int
    input_shape: tuple[int, ...]
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, data: FederatedData) -> "Federation":
        """The server's view of a dataset held in this process."""
        return cls([c.name for c in data.clients], [len(c.train) for c in data.clients],
                   [len(c.val) for c in data.clients], data.task, data.num_classes, data.input_shape, data.info)

    @property
    def num_clients(self) -> int:
        return len(self.names)

    def check(self, cfg: RunConfig) -> None:
        """Fail early when the config cannot run on these clients.

        Raises:
            ConfigError: a client without training samples, ``eval.best_by = "val"`` with no
                validation split anywhere, or a participation that samples no client.
        """
        for k, (name, n) in enumerate(zip(self.names, self.num_train)):
            if n == 0:
                raise ConfigError(f"client {k} ('{name}') has no training samples; change the partition")
        if cfg.eval.best_by == "val" and not any(self.num_val):
            raise ConfigError("eval.best_by='val' but no client has a validation split; set eval.best_by=test")
        clients_per_round(self.num_clients, cfg.train.participation)


def state_problems(state: object, bound: float | None, where: str) -> list[str]:
    """Every floating tensor in a nest of dicts, lists and tuples that holds a non-finite value or
    a ``|value|`` over ``bound``, one sentence each (the check an aggregate passes before it is
    committed; docs/engine.md, "The trust boundary"). The values are read in one batch
    (:func:`~fedaug.core.payload.value_extremes`), not two device round trips per tensor."""
    leaves = {path: t for path, t in tensor_leaves(state, where) if t.is_floating_point() and t.numel()}
    extremes = value_extremes(leaves)
    problems = []
    for path in leaves:
        lo, hi = extremes[path]
        if math.isnan(lo):
            problems.append(f"{path} holds non-finite values")
        elif bound is not None and max(-lo, hi) > bound:
            problems.append(f"{path} holds |value| up to {max(-lo, hi):.3g}, over the bound {bound:g}")
    return problems


class Server:
    """Runs a configured experiment round by round, reaching the clients through ``fleet``.

    Args:
        cfg: the validated run configuration.
        recipe: the method (its server-side hooks run here).
        model: a freshly built model (:func:`~fedaug.engine.client.worker.build_worker_model`) for the
            initial server state.
        federation: the clients as the server knows them.
        fleet: reaches the clients.

    The server's state lives on ``model``'s device (:attr:`device`), where the fleet delivers the
    replies; checkpoints hold it on the CPU and :meth:`restore` moves it back, so a checkpoint
    loads on any device.

    Raises:
        ConfigError: the config cannot run on these clients (:meth:`Federation.check`,
            :func:`~fedaug.engine.client.attack.check_attack`).
    """

    def __init__(self, cfg: RunConfig, recipe: Recipe, model: nn.Module, federation: Federation,
                 fleet: Fleet) -> None:
        federation.check(cfg)
        #: the clients that attack (they do it themselves; the server only records it)
        self.attackers = check_attack(cfg, recipe, federation.num_clients, federation.task)
        check_trust(cfg.trust, recipe)
        self.cfg, self.recipe, self.model, self.federation, self.fleet = cfg, recipe, model, federation, fleet
        self.device = module_device(model)
        self.task = make_task(federation.task, federation.num_classes)
        self.server: dict[str, State] = {c.name: c.init_server(model, federation.num_clients)
                                         for c in recipe.components}
        self.round = 0
        self.best: dict[str, Any] | None = None
        self.last_eval: dict[str, Any] | None = None
        self.comm_total = {"down": 0, "up": 0}
        #: gives the notice of evaluation at chance while the training loss falls (BatchNorm models)
        self.watch = ChanceWatch.of(self.task.metric, federation.num_classes, model)
        # (eps, delta) of the components' Gaussian releases (None: no release, no record entry)
        self.accountant = run_accountant(recipe.components, federation.num_clients,
                                         clients_per_round(federation.num_clients, cfg.train.participation),
                                         cfg.privacy.delta, cfg.privacy.accountant)

    # --- one round ----------------------------------------------------------------------------
    def _exchange(self, phase: Phase, r: int, lr: float, client_ids: list[int]) -> PhaseResult:
        """Run ``phase`` on ``client_ids`` (see :func:`~fedaug.engine.server.exchange.exchange`); an
        evaluation with ``eval.finetune_steps`` also sends the training downlinks
        (:func:`~fedaug.engine.server.finetune.finetune_senders`) and expects the fine-tuned meters."""
        senders: list[Any] = list(self.recipe.participants(phase))
        server = self.server
        if phase == "evaluate":
            finetune = self.cfg.eval.finetune_steps > 0
            specs = {METERS: meters_spec(self.task, finetuned=finetune)}
            if finetune:
                extra, states = finetune_senders(self.recipe, self.server)
                senders, server = senders + extra, {**self.server, **states}
        else:
            specs = {c.name: c.uplink_spec(self.server[c.name], phase) for c in senders}
        return exchange(phase, r, lr, client_ids, self.fleet, senders, server, specs, self.cfg.trust.bound,
                        against_sent=phase == "train")

    def _aggregate(self, phase: Phase, r: int, result: PhaseResult) -> dict[str, str] | None:
        """Each component that replies in ``phase`` folds the accepted replies, sorted by client id
        (with the server's random stream of (seed, "server", r, component, phase) where its
        ``aggregate`` takes one); the new server state is committed only if it passes
        :func:`state_problems`. Else the previous state is kept and the reason returned (the round
        record's ``aggregate``)."""
        order = sorted(result.replies)  # aggregation order is fixed, whatever order the answers came in
        num_train = self.federation.num_train
        new = dict(self.server)
        for c in self.recipe.participants(phase):
            if phase == "train" or c.uplink_spec(self.server[c.name], phase):
                extra = ({"rng": generator(self.cfg.seed, "server", r, c.name, phase, device=self.device)}
                         if "rng" in inspect.signature(c.aggregate).parameters else {})
                try:
                    new[c.name] = c.aggregate(
                        self.server[c.name],
                        [Uplink(cid, num_train[cid], result.replies[cid].message[c.name]) for cid in order], phase, **extra)
                except AggregationError as exc:
                    return {"phase": phase, "kept": "previous", "reason": f"{c.name}: {exc}"}
        problems = [p for name, st in new.items() if st is not self.server[name]
                    for p in state_problems(st, self.cfg.trust.bound(name), name)]
        if problems:
            return {"phase": phase, "kept": "previous", "reason": "; ".join(problems[:5])}
        self.server = new
        return None

    def run_round(self, r: int) -> dict[str, Any]:
        """Sample, train the sampled clients, validate and aggregate their replies, run the
        post-aggregation query if a component replies in it; return the round record. Clients that
        err or time out are recorded under ``dropped``, failed replies under ``rejected`` (with the
        training uploads screened against the round's update norms per part and kind first, recorded
        under ``updates``: :func:`~fedaug.engine.server.screening.screen_updates`). With fewer than
        ``train.min_clients`` valid training replies the round keeps the previous global state
        (``aggregate``: ``kept``) or, with ``train.on_empty_round = "stop"``, the run stops with the
        reasons. A round in which sampled clients attack (``[attack]``) says so under ``attack``.

        Raises:
            FedaugError: too few valid uploads and ``train.on_empty_round = "stop"``."""
        cfg = self.cfg
        t0 = time.perf_counter()
        lr = learning_rate(cfg.train, r)
        sampled = sample_clients(cfg.seed, r, self.federation.num_clients, cfg.train.participation)
        train = self._exchange("train", r, lr, sampled)  # with each upload's distances to what it was sent
        updates = screen_updates(cfg.trust, self.recipe.participants("train"), self.server, train, r)
        enough = len(train.replies) >= cfg.train.min_clients
        kept = [k for k in [self._aggregate("train", r, train)] if k] if enough else [self._too_few(r, len(sampled), train)]
        query = None
        if enough and any(c.uplink_spec(self.server[c.name], "query") for c in self.recipe.participants("query")):
            query = self._exchange("query", r, lr, sorted(train.replies))  # e.g. FLea: new global model's features
            kept += [k for k in [self._aggregate("query", r, query)] if k]
        self.round = r
        return self._round_record(r, lr, sampled, train, query, updates, kept, time.perf_counter() - t0)

    def _too_few(self, r: int, num_sampled: int, train: PhaseResult) -> dict[str, Any]:
        """Fewer than ``train.min_clients`` valid uploads: the previous global state is kept (the record says
        why), or the run stops (``train.on_empty_round``).

        Raises:
            FedaugError: ``train.on_empty_round = "stop"``."""
        cfg = self.cfg
        reasons = "; ".join([f"client {x['client']}: {x['reason']}" for x in train.rejected]
                            + [f"client {x['client']} dropped ({x['reason']}: {x['detail']})" for x in train.dropped])
        short = (f"round {r}: only {len(train.replies)} of {num_sampled} uploads passed validation, "
                 f"fewer than train.min_clients={cfg.train.min_clients}")
        if cfg.train.on_empty_round == "stop":
            raise FedaugError(f"{short} ({reasons}); train.on_empty_round='keep' keeps the previous global "
                              "state and goes on")
        return {"phase": "train", "kept": "previous", "reason": short}

    def _round_record(self, r: int, lr: float, sampled: list[int], train: PhaseResult, query: PhaseResult | None,
                      updates: dict[str, Any] | None, kept: list[dict[str, Any]], train_s: float) -> dict[str, Any]:
        """The round's record, built in one place from its typed parts (the phases' results, the screen's
        record, what was kept), in the order of every round record's keys."""
        cfg, order = self.cfg, sorted(train.replies)
        down, up = dict(train.down), dict(train.up)
        for name, nbytes in (query.down.items() if query is not None else ()):
            down[name] = down.get(name, 0) + nbytes
        for name, nbytes in (query.up.items() if query is not None else ()):
            up[name] = up.get(name, 0) + nbytes
        self.comm_total = {"down": self.comm_total["down"] + sum(down.values()),
                           "up": self.comm_total["up"] + sum(up.values())}
        metrics = {cid: train.replies[cid].metrics for cid in order}
        losses = [metrics[cid]["loss"] for cid in order] or [math.nan]  # no upload: no loss (null in the record)
        states = self.fleet.state_bytes()
        attacking = [cid for cid in sampled if cid in self.attackers] if r >= cfg.attack.start_round else []
        record: dict[str, Any] = {
            "round": r, "lr": lr, "sampled": sampled,
            "rejected": train.rejected + (query.rejected if query is not None else []),
            "dropped": train.dropped + (query.dropped if query is not None else []),
            "train": {"loss": sum(losses) / len(losses), "clients": {str(cid): metrics[cid] for cid in order}},
            "comm": {"down": down, "up": up, "down_total": sum(down.values()), "up_total": sum(up.values())},
            "client_state": {"bytes": {str(cid): states[cid] for cid in order if cid in states},
                             "total_bytes": sum(states.values())},
            "time": {"train_s": train_s}}
        optional = {"updates": updates, "after_aggregate": self._query_record(query) if query is not None else None,
                    "aggregate": kept or None,
                    "attack": {"kind": cfg.attack.kind, "clients": sorted(attacking)} if attacking else None,
                    "privacy": self.accountant.record(r) if self.accountant is not None else None}
        record.update((k, v) for k, v in optional.items() if v is not None)
        return record

    def _query_record(self, query: PhaseResult) -> dict[str, dict[str, int]]:
        """The query's bytes, of the parts that carry something in it (the server rule's weights down,
        the asking components' replies up)."""
        return {"down": {n: b for n, b in query.down.items()
                         if self.recipe.components[self.recipe.names.index(n)].downlink_spec(self.model, "query")},
                "up": {n: b for n, b in query.up.items()
                       if self.recipe.components[self.recipe.names.index(n)].uplink_spec(self.server[n], "query")}}

    def evaluate(self, client_ids: list[int] | None = None) -> dict[str, Any]:
        """Evaluate the current global model on ``client_ids`` (default: every client; see
        :func:`summarize_eval`): the same exchange as training, its traffic under ``comm``;
        clients that drop out or whose reply fails its check are listed under ``dropped`` and
        ``rejected``. With ``eval.finetune_steps``, the fine-tuned models' figures are under
        ``finetuned`` (:mod:`fedaug.engine.client.finetune`)."""
        ids = list(range(self.federation.num_clients)) if client_ids is None else sorted(client_ids)
        result = self._exchange("evaluate", self.round, 0.0, ids)
        meters, tuned, rejected = {}, {}, list(result.rejected)
        for cid, reply in result.replies.items():
            try:
                meters[cid] = meters_of(self.task, reply.message[METERS])
                if self.cfg.eval.finetune_steps:
                    tuned[cid] = meters_of(self.task, reply.message[METERS], FINETUNED)
            except PayloadError as exc:
                meters.pop(cid, None)
                rejected.append(Rejected(f"round {self.round}: {exc}").record(cid, "evaluate"))
        ev = summarize_eval(self.task, self.federation.names, meters)
        if self.cfg.eval.finetune_steps:
            ev["finetuned"] = {"steps": self.cfg.eval.finetune_steps,
                               **summarize_eval(self.task, self.federation.names, tuned)}
        if result.dropped:
            ev["dropped"] = sorted(result.dropped, key=lambda d: d["client"])
        if rejected:
            ev["rejected"] = sorted(rejected, key=lambda d: d["client"])
        ev["comm"] = result.comm()
        return ev

    def _track_best(self, r: int, ev: dict[str, Any]) -> None:
        """Keep ``ev`` as the last evaluation, and as the best one if its score is higher; a round
        without a score (``None``: no client's evaluation was accepted, e.g. a poisoned model whose
        every loss is NaN) is the best only until a round has one."""
        key = f"{self.cfg.eval.best_by}_{self.task.metric}"
        score = ev["mean"][key]
        if self.best is None or score is not None and (self.best["score"] is None or score > self.best["score"]):
            self.best = {"round": r, "by": self.cfg.eval.best_by, "score": score, "eval": ev}
        self.last_eval = {"round": r, "eval": ev}

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to continue exactly: plain dicts of tensors and scalars, on the CPU, and
        where the run computed (``environment``: :meth:`restore` warns when that changes)."""
        return {"format": CHECKPOINT_FORMAT, "round": self.round, "config": self.cfg.to_dict(),
                "server": to_device(self.server, CPU), "clients": to_device(self.fleet.checkpoint(), CPU),
                "best": self.best, "last_eval": self.last_eval, "comm_total": self.comm_total,
                "environment": self._environment()}

    def _environment(self) -> dict[str, Any]:
        return environment(self.device, self.cfg.precision, self.cfg.deterministic)

    def restore(self, payload: dict[str, Any]) -> None:
        """Continue from :meth:`checkpoint`'s output (the config must be the same, apart from
        :data:`PLACEMENT`: where a run computes does not define the experiment; a checkpoint's config that
        predates a key whose default became ``"auto"`` ran with its legacy value,
        :func:`~fedaug.config.schema.with_legacy`). A checkpoint written on
        another device, CPU model, CPU capability or thread count is restored with a warning: the
        rest of the run computes with other float32 kernels (and CUDA generators draw other numbers
        than the CPU's), so it is another sample of the experiment, not the numbers the uninterrupted
        run would have given (docs/engine.md)."""
        problem = checkpoint_problem(payload)
        if problem:
            raise CheckpointError(f"not a fedaug checkpoint: {problem}")
        try:  # parsed: keys added since (with their defaults) do not make a config different
            moved = config_differences(parse_config(with_legacy(payload["config"])), self.cfg)
        except (ConfigError, TypeError, AttributeError):
            moved = ["its config cannot be read"]
        if moved:
            raise CheckpointError(f"the checkpoint was written by a different config ({'; '.join(moved)}); resume "
                                  "with the run's own config.toml")
        saved = payload["server"]
        layout = {n: sorted(st) for n, st in self.server.items()}
        if {n: sorted(st) for n, st in saved.items()} != layout:
            raise CheckpointError(
                f"the checkpoint's server state {({n: sorted(st) for n, st in saved.items()})} does not match this "
                f"fedaug's method {layout}: it was written by an older fedaug (before server rules and objectives "
                "became two axes); rerun the experiment, which gives the same numbers")
        self.round, self.server = payload["round"], to_device(saved, self.device)
        self.fleet.restore(payload["clients"])  # moved to the worker's device when a client runs
        self.best, self.last_eval = payload["best"], payload["last_eval"]
        self.comm_total = payload["comm_total"]
        then, now = payload.get("environment"), self._environment()  # absent: written before it was recorded
        moved = [f"{k} {then.get(k)!r} -> {now[k]!r}" for k in RESUME_ENVIRONMENT if then and then.get(k) != now[k]]
        if moved:
            warnings.warn(f"round {self.round}'s checkpoint was written elsewhere ({', '.join(moved)}): the rounds "
                          "from here compute with other float32 kernels, so the run will not equal one that was "
                          "not interrupted (docs/engine.md, 'Reproducibility across CPUs'); resume on the first "
                          "machine, or with the same threads, for the same numbers", stacklevel=2)

    # --- the whole run ------------------------------------------------------------------------
    def run(self, run_dir: RunDir | None = None, progress: Progress | None = None,
            tracker: Tracker | None = None, stop: Callable[[int], bool] | None = None) -> dict[str, Any]:
        """Run the remaining rounds (with deterministic algorithms where ``cfg.deterministic`` asks,
        :func:`~fedaug.core.runtime.deterministic_algorithms`); write records to ``run_dir`` if
        given, and each round to ``tracker``'s backends (then the config and summary, and end
        its run); return the summary.

        Args:
            stop: asked ``stop(r)`` after each round ``r`` before the last is recorded and tracked
                (e.g. :class:`~fedaug.report.deadline.Deadline`'s watch of a time limit); ``True`` stops
                the run there (:meth:`_stop`).

        Raises:
            RunStopped: ``stop`` said so; round ``r``'s checkpoint is saved, its tracked run ends as
                ``KILLED`` (as an interrupted one does), no summary is written, and a resume continues from
                round ``r + 1`` to the numbers of an uninterrupted run.
        """
        tracker = tracker if tracker is not None else Tracker([], self.task.metric)
        if self.watch is not None and run_dir is not None and self.round:  # a resumed run: what its records saw
            self.watch.replay(rec for rec in run_dir.rounds() if rec["round"] <= self.round)
        try:
            with deterministic_algorithms(self.cfg.deterministic):
                self._run_rounds(run_dir, progress, tracker, stop)
            summary = self.summary(run_dir.path if run_dir is not None else None)
            if run_dir is not None:
                run_dir.write_summary(summary)
                tracker.log_files([run_dir.path / CONFIG, run_dir.path / SUMMARY])
        except BaseException as exc:
            tracker.close("KILLED" if isinstance(exc, (KeyboardInterrupt, RunStopped)) else "FAILED")
            raise
        tracker.close()
        return summary

    def _run_rounds(self, run_dir: RunDir | None, progress: Progress | None, tracker: Tracker,
                    stop: Callable[[int], bool] | None) -> None:
        """Each remaining round: train, evaluate when due, record, checkpoint when due; stop where ``stop``
        says so."""
        cfg = self.cfg
        total = cfg.train.rounds
        for r in range(self.round + 1, total + 1):
            record = self.run_round(r)
            if r % cfg.eval.every == 0 or r == total:
                t0 = time.perf_counter()
                record["eval"] = self.evaluate(record["sampled"] if cfg.eval.clients == "sampled" else None)
                record["time"]["eval_s"] = time.perf_counter() - t0
                self._track_best(r, record["eval"])
            if self.watch is not None:
                self.watch.note(record)
            if run_dir is not None:
                run_dir.append_round(record)
                if r % cfg.checkpoint_every == 0 or r == total:
                    run_dir.save_checkpoint(r, self.checkpoint(), cfg.keep_checkpoints)
            tracker.log_round(record)
            if progress is not None:
                progress.update(r, self._progress_metric(record))
            if stop is not None and r < total and stop(r):
                self._stop(r, run_dir)

    def _stop(self, r: int, run_dir: RunDir | None) -> None:
        """Stop after round ``r`` (recorded): save its checkpoint where ``checkpoint_every`` skipped it.

        Raises:
            RunStopped: always, with ``r`` and the run's rounds.
        """
        if run_dir is not None and r % self.cfg.checkpoint_every:
            run_dir.save_checkpoint(r, self.checkpoint(), self.cfg.keep_checkpoints)
        raise RunStopped(r, self.cfg.train.rounds)

    def _progress_metric(self, record: dict[str, Any]) -> str:
        text = f"train loss {record['train']['loss']:.4f}"
        if "eval" in record:
            m = self.task.metric
            score = record["eval"]["mean"][f"test_{m}"]
            text += f"  mean test {m} " + ("n/a (no evaluation accepted)" if score is None else f"{score:.4f}")
        return text

    def summary(self, run_dir: Path | None) -> dict[str, Any]:
        """Final and best evaluation, communication totals (bytes), the run directory and where the
        server ran (:func:`~fedaug.core.device.environment`)."""
        return {
            "name": self.cfg.name, "rounds": self.round, "metric": self.task.metric,
            "clients": list(self.federation.names),
            "final": self.last_eval, "best": self.best, "comm_total": self.comm_total,
            "run_dir": str(run_dir) if run_dir is not None else None,
            "data_info": self.federation.info,
            "environment": self._environment(),
            "notices": self.watch.notices if self.watch is not None else [],
        }
