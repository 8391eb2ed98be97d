"""The run configuration schema: nested dataclasses whose fields carry their help and limits.

Validation is generic over the schema: unknown keys name the valid ones (and the closest), bad
types and values name the allowed range or choices; every problem is collected and raised once.
Numbers must be finite (NaN and inf are refused), ``bool`` is not an integer, and every value,
down to the components' option tables, must be one that ``config.toml`` can hold and give back
(:func:`fedaug.config.load.dump_toml`): strings, numbers, booleans, lists and tables with string
keys. The components' own options are checked when they are built (``check_options``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

from fedaug.core.device import DEVICE_SYNTAX
from fedaug.core.errors import ConfigError, suggest
from fedaug.core.options import OptionInfo, type_name
from fedaug.core.paths import PathOption
from fedaug.core.plugins import import_problems
from fedaug.core.typecheck import allowed, fits


def opt(default: Any, help: str, *, choices: tuple[str, ...] = (), lo: float | None = None,
        hi: float | None = None, lo_open: bool = False, hi_open: bool = False, nullable: bool = False,
        path: PathOption | None = None) -> Any:
    """A schema field with its help text and limits (``lo_open``, ``hi_open``: that limit is excluded);
    ``path``: its value names a local file or directory (:mod:`fedaug.core.paths`), made absolute
    when a config is read (:func:`fedaug.config.paths.resolve_paths`)."""
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
            "nullable": nullable, "path": path}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    name: str = opt("digits4", "registered dataset (fedaug list datasets)")
    options: dict[str, Any] = opt({}, "the dataset's own options (fedaug list datasets)")
    on_device: bool | str = opt("auto", "true: every client's data on the device for the whole run (refused, with "
                                        "the estimate, when it does not fit); false: on the host, moved there per "
                                        "round; auto: on a CUDA device where it takes at most half its free memory, "
                                        "else (one notice) as false. Placement, not the run's numbers",
                                choices=(True, False, "auto"))


@dataclass
class ModelConfig:
    name: str = opt("small_cnn", "registered model (fedaug list models)")
    options: dict[str, Any] = opt({}, "the model's own options")


@dataclass
class MethodConfig:
    base: str = opt("fedavg", "base algorithm (fedaug list methods)")
    augs: list[str] = opt([], "augmentations, applied in this order")
    options: dict[str, dict[str, Any]] = opt({}, "per-component options, e.g. [method.options.fedavg]")


@dataclass
class TrainConfig:
    rounds: int = opt(30, "communication rounds", lo=1)
    participation: float = opt(1.0, "fraction of clients sampled each round", lo=0.0, hi=1.0, lo_open=True)
    local_epochs: int = opt(None, "local epochs per round (default 1 when local_steps is unset)", lo=1, nullable=True)
    local_steps: int = opt(None, "local optimiser steps per round (instead of local_epochs)", lo=1, nullable=True)
    batch_size: int = opt(32, "local mini-batch size", lo=1)
    drop_last: bool = opt(True, "drop each epoch's incomplete last batch")
    group_clients: int = opt(1, "train up to this many sampled clients of a round at once as one batched model "
                                "(torch.func.vmap; for GPUs: docs/engine.md, 'Grouped clients'); 1: one at a time. "
                                "Part of the run's numbers (float rounding), not of its placement", lo=1)
    cuda_graph: bool | str = opt("auto", "capture a client's (or a group's) whole local step in a CUDA graph once per "
                                         "batch shape and replay it for every batch (docs/engine.md, 'CUDA graphs'): "
                                         "true (CUDA only; a method that cannot be captured trains eagerly after a "
                                         "notice), false (never), auto (on CUDA where the method can be captured, else "
                                         "eagerly, with a notice on CUDA; on other devices eagerly, silently). The "
                                         "execution it resolves to is part of the run's numbers",
                                 choices=(True, False, "auto"))
    optimizer: str = opt("sgd", "local optimiser", choices=("sgd", "adam"))
    lr: float = opt(0.01, "local learning rate (round 1)", lo=0.0, lo_open=True)
    momentum: float = opt(0.9, "SGD momentum", lo=0.0, hi=1.0)
    weight_decay: float = opt(5e-4, "L2 weight decay", lo=0.0)
    lr_schedule: str = opt("constant", "learning rate across rounds",
                           choices=("constant", "exponential", "cosine", "step"))
    lr_decay: float = opt(0.98, "per-round factor (exponential) or per-step factor (step)", lo=0.0, hi=1.0, lo_open=True)
    lr_step_rounds: int = opt(10, "rounds between decays (step schedule)", lo=1)
    lr_min: float = opt(0.0, "floor of the learning rate (exponential, cosine)", lo=0.0)
    min_clients: int = opt(1, "fewest valid uploads a round needs to aggregate", lo=1)
    on_empty_round: str = opt("keep", "a round with fewer than min_clients valid uploads: keep the previous global "
                                      "state and go on (the round record says so under 'aggregate'), or stop the "
                                      "run with the reasons", choices=("keep", "stop"))


@dataclass
class EvalConfig:
    every: int = opt(1, "evaluate the global model every N rounds (and after the last)", lo=1)
    batch_size: int = opt(256, "evaluation batch size", lo=1)
    best_by: str = opt("val", "split whose mean client accuracy picks the best round", choices=("val", "test"))
    clients: str = opt("all", "which clients an evaluation covers: every client, or the round's sampled clients "
                              "(cross-device studies)", choices=("all", "sampled"))
    finetune_steps: int = opt(0, "personalised evaluation: each evaluated client also fine-tunes the global model "
                                 "for this many local steps of the method's own training (nothing sent) and is "
                                 "evaluated again; 0: off", lo=0)


@dataclass
class LogConfig:
    tensorboard: bool = opt(False, "write each round's scalars as TensorBoard event files to the run directory's "
                                   "tb/ (needs the tracking extra)")
    mlflow: str = opt("", "MLflow tracking URI (sqlite:///mlflow.db, file:./mlruns, http://host:5000) to log "
                          "the run to; a local store's path is recorded absolute (docs/cli.md, 'Paths in a "
                          "config'); empty: off (needs the tracking extra)", path=PathOption(uri=True))
    mlflow_experiment: str = opt("fedaug", "the MLflow experiment the runs go to")
    wandb: str = opt("off", "W&B: 'offline' writes each round's scalars, the config and the summary as an offline "
                            "W&B run in the run directory's wandb/ (upload it later with wandb sync: runs never "
                            "log online, nothing leaves the machine during a run; needs the tracking extra)",
                     choices=("off", "offline"))
    wandb_project: str = opt("fedaug", "the W&B project of the offline runs (used when they are synced)")


#: where a run's workers run (``fleet``): on this machine, or as Ray actors on a cluster (docs/cluster.md)
FLEETS = ("local", "ray")


@dataclass
class RayConfig:
    address: str = opt("", "the Ray cluster of fleet = 'ray': its head's host:port, ray://host:10001 (Ray Client) or "
                           "auto (RAY_ADDRESS, else the cluster this machine joined with ray start); empty: RAY_ADDRESS "
                           "where it is set, else a Ray started on this machine for the run; a process already "
                           "connected to Ray (a Ray task, a grid cell of fedaug compare --ray) keeps its connection")
    num_cpus: float = opt(None, "CPUs Ray reserves for each worker actor (fleet = 'ray'), or for a grid cell's task "
                                "(fedaug compare --ray); default: threads (for a cell with worker processes, "
                                "workers x threads)", lo=0.0, nullable=True)
    num_gpus: float = opt(0.0, "GPUs Ray reserves for each worker actor, or for a grid cell's task (a fraction "
                               "shares one GPU: 0.5 puts two on it); the actor or cell computes on the GPU Ray gives "
                               "it (device = 'auto' or 'cuda')", lo=0.0)


#: ``trust.screen_multiple``'s default: honest uploads stay far below it (docs/engine.md, "The trust boundary")
SCREEN_MULTIPLE = 10.0


@dataclass
class TrustConfig:
    max_abs: float = opt(1e6, "largest |value| any tensor a client sends may hold; a reply over it is rejected",
                         lo=0.0, lo_open=True)
    max_abs_parts: dict[str, float] = opt({}, "bounds that replace max_abs for some parts, by component "
                                              "name (or 'meters'), e.g. {fedavg = 100.0}")
    max_num_train: int = opt(10**9, "largest training-set size a SuperNode may report (its aggregation weight)",
                             lo=1)
    screen: str = opt("reject", "a training upload whose update norm of a kind (parameters, normalisation "
                                "statistics, control variates, shared statistics) exceeds screen_multiple times the "
                                "round's median of that kind: rejected, clipped to the median norm, or let through "
                                "(norms are recorded either way; docs/engine.md, 'The trust boundary')",
                      choices=("reject", "clip", "off"))
    screen_multiple: float = opt(SCREEN_MULTIPLE, "the limit of an upload's update norm of a kind, as a multiple of "
                                                  "the round's (upper) median of that kind", lo=1.0, lo_open=True)

    def bound(self, part: str) -> float | None:
        """The magnitude bound of ``part``, a component's name; evaluation ``meters`` (sums of losses
        and pixel counts, checked for sign and consistency instead) are unbounded unless
        ``max_abs_parts`` names them."""
        if part in self.max_abs_parts:
            return float(self.max_abs_parts[part])
        return None if part == "meters" else float(self.max_abs)


#: what attacking clients do (docs/engine.md, "Attack scenarios"; :mod:`fedaug.engine.client.attack`)
ATTACK_KINDS = ("none", "sign_flip", "scale", "gaussian", "free_ride", "fill", "nan", "inf", "label_flip", "stats",
                "features")
#: the kinds that read ``attack.scale``, and ``attack.std``
SCALED_KINDS, NOISE_KINDS = ("scale", "fill", "stats", "features"), ("gaussian",)


@dataclass
class AttackConfig:
    kind: str = opt("none", "what the attacking clients do to their uploads (docs/engine.md, 'Attack scenarios')",
                    choices=ATTACK_KINDS)
    clients: list[int] = opt([], "ids of the attacking clients (or set fraction)")
    fraction: float = opt(None, "fraction of the federation that attacks, chosen from the seed (or set clients)",
                          lo=0.0, hi=1.0, nullable=True)
    start_round: int = opt(1, "first round in which the attackers attack", lo=1)
    scale: float = opt(None, "scale: factor of the update (default 10); fill: the value sent (default half the "
                             "part's trust bound); stats: factor of spreads and shift of means (default 1e4); "
                             "features: noise std over the rows' std (default 1)", nullable=True)
    std: float = opt(None, "gaussian: std of the noise update per coordinate (default 1)", lo=0.0, lo_open=True,
                     nullable=True)
    parts: list[str] = opt([], "component names whose parts the attack changes (default: the server rule's for "
                               "sign_flip, scale, gaussian, free_ride, fill, nan, inf; every other component's for "
                               "stats, features)")


@dataclass
class PrivacyConfig:
    delta: float = opt(1e-5, "target delta of the (epsilon, delta) the accountant reports when a component "
                             "declares a differential-privacy release (docs/privacy.md)", lo=0.0, hi=1.0,
                       lo_open=True, hi_open=True)
    accountant: str = opt("rdp", "privacy accountant (dp_accounting): Renyi DP, or privacy-loss distributions "
                                 "(tighter, slower)", choices=("rdp", "pld"))


@dataclass
class RunConfig:
    seed: int = opt(0, "seed of every random stream", lo=0)
    name: str = opt("", "run name; empty: named after what it runs, '<dataset>-<base>[+<augs>]' (run_name)")
    imports: list[str] = opt([], "your modules to import before the run is built (they register datasets, models, "
                                 "methods): module names on sys.path or paths of .py files or package directories; "
                                 "relative paths and modules next to the config file are recorded as absolute paths "
                                 "(docs/writing_components.md, 'Your own components from the command line')")
    out_dir: str = opt("runs", "directory under which run directories are created")
    checkpoint_every: int = opt(5, "write a checkpoint every N rounds (and after the last)", lo=1)
    keep_checkpoints: int = opt(2, "how many most recent checkpoints to keep", lo=1)
    threads: int = opt(2, "torch intra-op threads (of each worker process when workers > 1)", lo=1)
    workers: int = opt(1, "worker processes that train a phase's clients in parallel (in-process engine); the "
                          "records equal workers = 1 at the same threads; workers x threads should fit the cores",
                       lo=1)
    devices: list[str] = opt([], "devices of the worker processes, in turn (e.g. ['cuda:0', 'cuda:1']; several "
                                 "workers may share one); empty: every worker on 'device'")
    fleet: str = opt("local", "where the workers run: local (workers = 1: this process; more: worker processes of "
                              "this machine) or ray (workers Ray actors on the cluster of [ray], each with its own "
                              "worker model; the records equal workers = 1 at the same threads; docs/cluster.md)",
                     choices=FLEETS)
    device: str = opt("auto", "where tensors live: auto (CUDA if available, else cpu), cpu, cuda, cuda:N, mps; "
                              "resolved on the machine that runs (config.toml keeps it as written)")
    precision: str = opt("32", "32: true float32 (no TF32 on CUDA); tf32: float32 with TF32 matrix products and "
                               "convolutions on CUDA; or the forward pass and loss under autocast (bf16-mixed; "
                               "16-mixed adds a gradient scaler)", choices=("32", "tf32", "bf16-mixed", "16-mixed"))
    deterministic: bool = opt(False, "torch.use_deterministic_algorithms and deterministic cuDNN/cuBLAS "
                                     "(slower on CUDA; docs/engine.md)")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    trust: TrustConfig = field(default_factory=TrustConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    log: LogConfig = field(default_factory=LogConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (``None`` values omitted, as TOML has no null)."""
        return _drop_none(dataclasses.asdict(self))


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


#: the keys whose default became ``"auto"`` (issue 63), with the value that a run whose stored config lacks one ran
#: with: its ``config.toml`` (or checkpoint) was written before the key existed (:func:`with_legacy`)
LEGACY = {("train", "cuda_graph"): False, ("data", "on_device"): False}


def with_legacy(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored config (a run directory's ``config.toml``, a checkpoint's ``config``) with each :data:`LEGACY` key it
    lacks set to what the run ran with; ``raw`` itself is left as it is.

    >>> with_legacy({"train": {"rounds": 2}})["train"], with_legacy({"data": {"on_device": True}})["data"]
    ({'rounds': 2, 'cuda_graph': False}, {'on_device': True})
    """
    out = dict(raw)
    for (table, key), value in LEGACY.items():
        if isinstance(out.get(table, {}), dict) and key not in out.get(table, {}):
            out[table] = {**out.get(table, {}), key: value}
    return out


#: the longest run name: its run directory ``<name>-YYYYmmdd-HHMMSS[-k]`` must fit a file name (255 bytes)
MAX_NAME = 200


def _toml_problems(key: str, value: Any) -> list[str]:
    """Why ``value`` (at ``key``) could not be written to a run's ``config.toml`` and read back."""
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if not isinstance(k, str):
                out.append(f"'{key}' has the key {k!r} ({type(k).__name__}); keys must be strings")
            elif v is not None:  # an option left at its default (not written)
                out += _toml_problems(f"{key}.{k}", v)
        return out
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value)
                for p in (_toml_problems(f"{key}[{i}]", v) if v is not None
                          else [f"'{key}[{i}]' is None, which a TOML list cannot hold; remove it"])]
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            return [f"'{key}' holds {value[exc.start]!r}, a lone surrogate that cannot be written as UTF-8; remove it"]
        return []
    if isinstance(value, (bool, int, float)):
        return []
    return [f"'{key}' is {value!r} ({type(value).__name__}), which a TOML config cannot hold; give a string, "
            "number, boolean, list or table"]


def _check_value(key: str, value: Any, f: dataclasses.Field[Any], tp: Any) -> list[str]:
    m = f.metadata
    if value is None:
        return [] if m["nullable"] else [f"'{key}' must be set"]
    named = any(not isinstance(c, str) for c in m["choices"])  # every value named (true, false, "auto")
    if not fits(value, tp) and not named:
        return [f"'{key}' must be {allowed(tp)}, got {value!r}"]
    if m["choices"] and (not fits(value, tp) or value not in m["choices"]):
        words = [c for c in m["choices"] if isinstance(c, str)]
        return [f"'{key}' must be one of {', '.join(map(choice_text, m['choices']))}, got {value!r}"
                f"{suggest(str(value), words)}"]
    lo, hi = m["lo"], m["hi"]
    if (lo is not None and (value <= lo if m["lo_open"] else value < lo)
            or hi is not None and (value >= hi if m["hi_open"] else value > hi)):
        lo_s = "" if lo is None else f"{'>' if m['lo_open'] else '>='} {lo}"
        hi_s = "" if hi is None else f"{'<' if m['hi_open'] else '<='} {hi}"
        return [f"'{key}' must be {' and '.join(s for s in (lo_s, hi_s) if s)}, got {value!r}"]
    return _toml_problems(key, value)


def choice_text(value: Any) -> str:
    """A choice as a config writes it: ``true``, ``false``, or the word itself."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _build(cls: type, raw: dict[str, Any], prefix: str, problems: list[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in fields:
            problems.append(f"unknown key '{path}'{suggest(key, fields)}; valid keys here: {', '.join(fields)}")
            continue
        f, tp = fields[key], types[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                problems.append(f"'{path}' must be a table, got {value!r}")
                continue
            kwargs[key] = _build(tp, value, f"{path}.", problems)
        else:
            problems.extend(_check_value(path, value, f, tp))
            kwargs[key] = value
    return cls(**kwargs)


def validate(raw: dict[str, Any]) -> RunConfig:
    """Build a :class:`RunConfig` from a nested dict, checking every key and value.

    Raises:
        ConfigError: listing every problem found, one per line.
    """
    problems: list[str] = []
    cfg = _build(RunConfig, raw, "", problems)
    t = cfg.train
    if t.local_epochs is not None and t.local_steps is not None:
        problems.append("set either 'train.local_epochs' or 'train.local_steps', not both")
    if t.local_epochs is None and t.local_steps is None:
        t.local_epochs = 1
    if isinstance(cfg.name, str) and len(cfg.name) > MAX_NAME:
        problems.append(f"'name' is {len(cfg.name)} characters long; a run name may have at most {MAX_NAME} "
                        "(it names the run directory); shorten it")
    if fits(cfg.trust.max_abs_parts, dict[str, float]):  # else its type is reported already
        problems += [f"'trust.max_abs_parts.{part}' must be a finite number > 0, got {bound!r}"
                     for part, bound in cfg.trust.max_abs_parts.items() if bound <= 0]
    if isinstance(cfg.device, str) and not DEVICE_SYNTAX.fullmatch(cfg.device):
        problems.append(f"'device' must be auto, cpu, cuda, cuda:N or mps, got {cfg.device!r}")
    if fits(cfg.devices, list[str]):
        problems += [f"'devices[{i}]' must be auto, cpu, cuda, cuda:N or mps, got {d!r}"
                     for i, d in enumerate(cfg.devices) if not DEVICE_SYNTAX.fullmatch(d)]
    fixed = sorted({"in_channels", "num_classes"} & set(cfg.model.options))
    if fixed:
        problems.append(f"'model.options.{fixed[0]}' is set by the dataset ({' and '.join(fixed)} come from its "
                        "data); remove it from [model.options]")
    problems += _attack_problems(cfg.attack) + _grouping_problems(cfg) + _graph_problems(cfg) + _fleet_problems(cfg)
    if fits(cfg.imports, list[str]):  # imported here, so that every process that reads the config has them
        problems += import_problems(cfg.imports)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return cfg


def _grouping_problems(cfg: RunConfig) -> list[str]:
    """What ``train.group_clients > 1`` cannot be combined with (docs/engine.md, "Grouped clients")."""
    g = cfg.train.group_clients
    if not fits(g, int) or g <= 1:  # a bad type or range is reported already
        return []
    problems = []
    if fits(cfg.workers, int) and cfg.workers > 1:
        problems.append(f"'train.group_clients' = {g} trains groups on one worker model, but workers = {cfg.workers}: "
                        "set workers = 1 (a GPU's groups keep it busy) or train.group_clients = 1")
    if cfg.precision not in FLOAT32:
        problems.append(_float32_only(f"'train.group_clients' = {g}", "train.group_clients = 1", cfg.precision))
    return problems


def _fleet_problems(cfg: RunConfig) -> list[str]:
    """What ``fleet = 'ray'`` cannot be combined with (docs/cluster.md)."""
    if cfg.fleet != "ray":
        return []
    problems = []
    if fits(cfg.devices, list[str]) and cfg.devices:
        problems.append("'devices' places worker processes on this machine's devices, but fleet = 'ray' places each "
                        "worker actor where Ray gives it the GPUs it reserves: remove devices and set ray.num_gpus")
    g = cfg.train.group_clients
    if fits(g, int) and g > 1:
        problems.append(f"'train.group_clients' = {g} trains groups on one worker model in this process, but fleet = "
                        "'ray' trains each client on a Ray actor: set train.group_clients = 1 or fleet = 'local'")
    gpus = cfg.ray.num_gpus
    if isinstance(cfg.device, str) and cfg.device.startswith("cuda") and fits(gpus, float) and gpus == 0:
        problems.append(f"device = {cfg.device!r} with fleet = 'ray' needs ray.num_gpus > 0 (Ray hides the GPUs from "
                        "an actor that reserves none): set ray.num_gpus (1, or 0.5 to share a GPU) or device = 'auto'")
    return problems


def _graph_problems(cfg: RunConfig) -> list[str]:
    """What ``train.cuda_graph = true`` cannot be combined with (docs/engine.md, "CUDA graphs"); a device
    that ``auto`` resolves to is checked when the worker is built (:mod:`fedaug.engine.client.graphed`)."""
    if cfg.train.cuda_graph is not True:  # off, or a bad type reported already
        return []
    setting, off = "'train.cuda_graph' = true", "train.cuda_graph = false"
    named = [("device", cfg.device)] + ([(f"devices[{i}]", d) for i, d in enumerate(cfg.devices)]
                                        if fits(cfg.devices, list[str]) else [])
    problems = [f"{setting} captures CUDA graphs, got {key} = {d!r}: set {key} = 'cuda' or {off}"
                for key, d in named if d in ("cpu", "mps")]
    if cfg.precision not in FLOAT32:
        problems.append(_float32_only(setting, off, cfg.precision))
    return problems


#: the precisions that compute in float32 (no autocast)
FLOAT32 = ("32", "tf32")


def _float32_only(setting: str, off: str, precision: str) -> str:
    """The problem of ``setting``, which trains in float32 only, with a mixed ``precision``."""
    return f"{setting} trains in float32 only, got precision = {precision!r}: set precision = '32' (or 'tf32') or {off}"


def _attack_problems(a: AttackConfig) -> list[str]:
    """What is wrong with ``[attack]`` across its fields (what the federation decides, client ids
    beyond its size, a label flip on segmentation, parts not in the method, is checked at run start:
    :func:`fedaug.engine.client.attack.check_attack`); warns about options that do nothing."""
    if not fits(a.clients, list[int]) or a.kind not in ATTACK_KINDS:  # reported already
        return []
    problems = []
    if a.clients and a.fraction is not None:
        problems.append("set either 'attack.clients' or 'attack.fraction', not both")
    if a.kind != "none" and not a.clients and a.fraction is None:
        problems.append(f"attack.kind='{a.kind}' names no attacker; set 'attack.clients' (client ids) or "
                        "'attack.fraction'")
    negative = sorted({c for c in a.clients if c < 0})
    if negative:
        problems.append(f"'attack.clients' holds {', '.join(map(str, negative))}; client ids are >= 0")
    repeated = sorted({c for c in a.clients if a.clients.count(c) > 1})
    if repeated:
        problems.append(f"'attack.clients' lists client(s) {', '.join(map(str, repeated))} more than once")
    unused = [(key, why) for key, set_, why in (
        ("scale", a.scale is not None and a.kind not in SCALED_KINDS, f"only {', '.join(SCALED_KINDS)} read it"),
        ("std", a.std is not None and a.kind not in NOISE_KINDS, "only gaussian reads it"),
        ("parts", bool(a.parts) and a.kind in ("none", "label_flip"), "it changes no message part"),
        ("clients", bool(a.clients) and a.kind == "none", "attack.kind is 'none'"),
        ("fraction", a.fraction is not None and a.kind == "none", "attack.kind is 'none'"),
    ) if set_]
    for key, why in unused:
        warnings.warn(f"'attack.{key}' does nothing with attack.kind='{a.kind}' ({why})", stacklevel=3)
    return problems


def run_name(cfg: RunConfig) -> str:
    """``cfg.name``, or when empty a name from what the run contains: ``<dataset>-<base>[+<augs>]``.

    >>> run_name(validate({"data": {"name": "synthetic"}, "method": {"augs": ["fedrdn", "fedfa"]}}))
    'synthetic-fedavg+fedrdn+fedfa'
    """
    return cfg.name or f"{cfg.data.name}-{'+'.join((cfg.method.base, *cfg.method.augs))}"


def _bounds(m: Any) -> str:
    """A field's limits as text (``> 0``, ``>= 0 and <= 1``); empty when it has none."""
    parts = [f"{op} {v:g}" for v, op in ((m["lo"], ">" if m["lo_open"] else ">="),
                                         (m["hi"], "<" if m["hi_open"] else "<=")) if v is not None]
    return " and ".join(parts)


def describe() -> list[OptionInfo]:
    """Every schema field as an :class:`~fedaug.core.options.OptionInfo` (name = the dotted key; type,
    default, choices, limits and help from the field), for documentation and ``fedaug list keys``."""
    rows: list[OptionInfo] = []

    def walk(cls: type, prefix: str) -> None:
        types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(types[f.name]):
                walk(types[f.name], f"{prefix}{f.name}.")
            else:
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                m = f.metadata
                rows.append(OptionInfo(f"{prefix}{f.name}", type_name(types[f.name]), default, tuple(m["choices"]),
                                       m["help"], bounds=_bounds(m)))

    walk(RunConfig, "")
    return rows


def learning_rate(cfg: TrainConfig, round: int) -> float:
    """The local learning rate of 1-based ``round``.

    constant: ``lr``; exponential: ``max(lr * decay^(r-1), lr_min)`` (FLea: 2 % per round);
    cosine: ``lr_min + (lr - lr_min) (1 + cos(pi (r-1) / R)) / 2``; step: ``lr * decay^floor((r-1)/S)``.
    """
    r = round - 1
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "exponential":
        return max(cfg.lr * cfg.lr_decay**r, cfg.lr_min)
    if cfg.lr_schedule == "cosine":
        return cfg.lr_min + (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * r / cfg.rounds)) / 2
    if cfg.lr_schedule == "step":
        return cfg.lr * cfg.lr_decay ** (r // cfg.lr_step_rounds)
    raise ConfigError(f"unknown train.lr_schedule '{cfg.lr_schedule}'; choose constant, exponential, cosine, step")
