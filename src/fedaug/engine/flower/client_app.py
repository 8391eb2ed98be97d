"""The ClientApp: fedaug's client side on a Flower SuperNode.

Each SuperNode is one logical client and names its data in its node config:

- ``partition-id`` (its client id, ``0 .. N-1``) and ``num-partitions`` (``N``, which must equal
  the number of clients the config's dataset has): the node loads the dataset the config names
  (deterministically partitioned from the seed, so every node agrees) and keeps its own client;
- ``data-dir`` in addition, for a real site: the dataset is read from that local directory
  (its ``root`` option; the dataset must be one of the local-directory datasets, docs/data.md);
- ``device`` optionally: where this SuperNode trains (``auto``, ``cpu``, ``cuda``, ``cuda:N``,
  ``mps``; default: the config's ``device``), resolved on the node's machine. Each node chooses its
  own; messages cross the wire as CPU tensors and are moved to the node's device on receipt.

Message types: ``query.describe`` (who am I, how much data) and one per phase of a round
(:data:`PHASE_TYPES`: ``train``, ``query.after_aggregate``, ``evaluate``), each carrying the phase's
parts and answered by the worker (:meth:`~fedaug.engine.client.worker.Worker.run`). Per-client state lives in ``context.state``
(:mod:`fedaug.engine.flower.codec`): nothing needs to survive in Python between messages, as in a
deployment, where each message runs in a fresh process.
"""

from __future__ import annotations

import functools
import inspect
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedaug.config.load import dump_toml, parse_config
from fedaug.config.schema import RunConfig
from fedaug.core.device import resolve_device
from fedaug.core.errors import ConfigError, PayloadError
from fedaug.core.payload import state_nbytes
from fedaug.core.runtime import configure_process
from fedaug.data.base import ClientData, FederatedData
from fedaug.data.registry import DATASETS, load_dataset
from fedaug.engine.flower.codec import drop_tree, get_parts, get_tree, has_tree, put_parts, put_tree
from fedaug.engine.flower.settings import FlowerSettings
from fedaug.engine.client.worker import Worker, build_worker_model
from fedaug.methods.component import Phase, State
from fedaug.methods.recipe import build_recipe
from fedaug.metrics.tasks import make_task

PARTITION_ID, NUM_PARTITIONS, DATA_DIR, DEVICE = "partition-id", "num-partitions", "data-dir", "device"
#: the ConfigRecord both sides put in every message: client id, round, learning rate
HEADER = "fedaug"
STATE, METRICS = "fedaug.state", "metrics"
#: the Flower message type of each phase
PHASE_TYPES: dict[Phase, str] = {"train": "train", "query": "query.after_aggregate", "evaluate": "evaluate"}


@dataclass(frozen=True)
class Site:
    """One SuperNode's client: its id, its data and the worker that runs it."""

    cfg: RunConfig
    client_id: int
    data: FederatedData
    worker: Worker

    @property
    def client(self) -> ClientData:
        return self.data.clients[self.client_id]

    def check_addressee(self, header: Mapping[str, Any]) -> None:
        """Fail loudly on a message meant for another client (a mix-up of node configs)."""
        if int(header["client"]) != self.client_id:
            raise PayloadError(f"a message for client {header['client']} reached the SuperNode of client "
                               f"{self.client_id} ({PARTITION_ID}={self.client_id}); restart the SuperNodes "
                               "with distinct partition ids")


def node_identity(node_config: Mapping[str, Any]) -> tuple[int, int, str | None]:
    """``(partition-id, num-partitions, data-dir or None)`` from a SuperNode's node config
    (its ``device``: :func:`node_device`).

    >>> node_identity({"partition-id": 1, "num-partitions": 3, "data-dir": "/data/site1"})
    (1, 3, '/data/site1')

    Raises:
        ConfigError: a key is missing or has the wrong type, naming the fix.
    """
    problems = []
    values = []
    for key in (PARTITION_ID, NUM_PARTITIONS):
        v = node_config.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            problems.append(f"'{key}' must be an integer, got {v!r}")
        values.append(v)
    data_dir = node_config.get(DATA_DIR)
    if data_dir is not None and (not isinstance(data_dir, str) or not data_dir):
        problems.append(f"'{DATA_DIR}' must be a quoted path, got {data_dir!r}")
    if not problems and not 0 <= values[0] < values[1]:
        problems.append(f"'{PARTITION_ID}' must be in 0..{values[1] - 1} ({NUM_PARTITIONS}={values[1]}), got {values[0]}")
    if problems:
        raise ConfigError("SuperNode node config: " + "; ".join(problems) + ". Start each SuperNode with "
                          f"--node-config '{PARTITION_ID}=K {NUM_PARTITIONS}=N' (and {DATA_DIR}=\"/path\" for a "
                          "site's own data)")
    return values[0], values[1], data_dir


def node_device(node_config: Mapping[str, Any], cfg: RunConfig) -> torch.device:
    """The device a SuperNode trains on: its node config's ``device``, else the config's, resolved here.

    Raises:
        ConfigError: a device this machine does not have (the message lists the ones it has).
    """
    name = node_config.get(DEVICE, cfg.device)
    if not isinstance(name, str):
        raise ConfigError(f"SuperNode node config '{DEVICE}' must be a quoted device name, got {name!r}")
    return resolve_device(name)


def local_datasets() -> list[str]:
    """The registered datasets that read a local directory (they take a ``root`` option)."""
    return [n for n in DATASETS.names() if "root" in inspect.signature(DATASETS.get(n)).parameters]


@functools.lru_cache(maxsize=2)
def _load(name: str, seed: int, options_json: str) -> FederatedData:
    return load_dataset(name, seed, **json.loads(options_json))


@functools.lru_cache(maxsize=2)
def _worker(config_toml: str, input_shape: tuple[int, ...], num_classes: int, task: str, num_clients: int,
            device: str) -> Worker:
    cfg = parse_config(tomllib.loads(config_toml))
    recipe = build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
    configure_process(cfg.threads, cfg.deterministic)  # a ClientApp is a process entry point (docs/engine.md)
    model = build_worker_model(cfg, recipe, input_shape, num_classes, torch.device(device))
    return Worker(cfg, recipe, model, make_task(task, num_classes), num_clients)


def open_site(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> Site:
    """The site a SuperNode serves: config from the run config, client and data from the node config.

    Data and worker are cached for the life of the process (a simulation worker serves many
    messages; a deployment runs each message in a fresh process and rebuilds them).

    Raises:
        ConfigError: a bad node config, ``num-partitions`` that differs from the dataset's
            number of clients, ``data-dir`` with a dataset that reads no directory, or a
            ``device`` this machine does not have.
    """
    cfg = FlowerSettings.from_run_config(run_config).cfg
    client_id, num_partitions, data_dir = node_identity(node_config)
    device = node_device(node_config, cfg)
    options = dict(cfg.data.options)
    if data_dir is not None:
        if cfg.data.name not in local_datasets():
            raise ConfigError(f"node config {DATA_DIR}={data_dir!r}, but dataset '{cfg.data.name}' reads no local "
                              f"directory; datasets that do: {', '.join(local_datasets())}. Remove {DATA_DIR} or "
                              "set data.name")
        options["root"] = data_dir
    data = _load(cfg.data.name, cfg.seed, json.dumps(options, sort_keys=True))
    if num_partitions != data.num_clients:
        raise ConfigError(f"SuperNode node config {NUM_PARTITIONS}={num_partitions}, but dataset '{cfg.data.name}' "
                          f"with these options has {data.num_clients} clients; start {data.num_clients} SuperNodes "
                          f"with {NUM_PARTITIONS}={data.num_clients}, or change the dataset's options")
    worker = _worker(dump_toml(cfg.to_dict()), tuple(data.input_shape), data.num_classes, data.task,
                     data.num_clients, str(device))
    return Site(cfg, client_id, data, worker)


def load_state(context: Context) -> dict[str, State]:
    """This client's per-client state from ``context.state`` (empty on its first round)."""
    return get_tree(context.state, STATE) if has_tree(context.state, STATE) else {}


def save_state(context: Context, state: dict[str, State]) -> None:
    """Keep ``state`` in ``context.state`` (an empty state removes it)."""
    drop_tree(context.state, STATE)
    if state:
        put_tree(context.state, STATE, state)


def reply(msg: Message, site: Site, **records: Any) -> Message:
    """A reply carrying the header (this client's id) and ``records``."""
    content = RecordDict({HEADER: ConfigRecord({"client": site.client_id})})
    for name, record in records.items():
        content[name] = record
    return Message(content, reply_to=msg)


def make_client_app(defaults: Mapping[str, Any] | None = None) -> ClientApp:
    """fedaug's ClientApp.

    Args:
        defaults: run config entries used where ``context.run_config`` has none (Flower's Python
            simulation API passes no run config: the config travels here).
    """
    app = ClientApp()
    base = dict(defaults or {})

    def site_of(context: Context) -> Site:
        return open_site({**base, **context.run_config}, context.node_config)

    @app.query("describe")
    def describe(msg: Message, context: Context) -> Message:
        site = site_of(context)
        c = site.client
        info = {"client": site.client_id, "num_partitions": site.data.num_clients, "name": c.name,
                "num_train": len(c.train), "num_val": len(c.val), "num_test": len(c.test), "task": site.data.task,
                "num_classes": site.data.num_classes, "input_shape": list(site.data.input_shape),
                "info": json.dumps(site.data.info, sort_keys=True, default=str)}
        return reply(msg, site, describe=ConfigRecord(info))

    def run_phase(phase: Phase, msg: Message, context: Context) -> Message:
        site = site_of(context)
        header = msg.content.config_records[HEADER]
        site.check_addressee(header)
        answer = site.worker.run(phase, site.client_id, int(header["round"]), float(header["lr"]), site.client,
                                 get_parts(msg.content), load_state(context))
        records = {}
        if phase == "train":
            save_state(context, answer.state)
            records = {METRICS: MetricRecord(answer.metrics),
                       "state": ConfigRecord({"has_state": bool(answer.state), "bytes": state_nbytes(answer.state)})}
        out = reply(msg, site, **records)
        put_parts(out.content, answer.message)
        return out

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return run_phase("train", msg, context)

    @app.query("after_aggregate")
    def after_aggregate(msg: Message, context: Context) -> Message:
        return run_phase("query", msg, context)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return run_phase("evaluate", msg, context)

    return app


#: the ClientApp a written Flower app names (``fedaug flower app``)
app = make_client_app()
