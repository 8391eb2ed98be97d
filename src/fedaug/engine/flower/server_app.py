"""The ServerApp: fedaug's server side (:class:`~fedaug.engine.server.loop.Server`) over Flower's Grid.

Flower's built-in strategies cannot carry fedaug's methods (they reject replies with more than one
ArrayRecord, reuse one RecordDict for every client and sample node ids with unseeded global random
state), so the ServerApp drives the Grid itself: it asks every SuperNode which logical client it
serves (``query.describe``), then runs fedaug's own round loop, whose :class:`FlowerFleet` turns
each phase into one Flower message per client, built fresh per client, and waits up to the run
config's ``round-timeout`` for the replies. A client that answers with an error or not in time is
recorded as dropped and the round goes on while ``train.min_clients`` uploads are valid.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedaug.core.device import CPU, resolve_device, to_device
from fedaug.core.errors import CheckpointError, FedaugError
from fedaug.core.payload import Message as Parts
from fedaug.core.runtime import configure_process
from fedaug.engine.protocol import Dropped, Malformed, Reply
from fedaug.engine.flower.client_app import HEADER, METRICS, PHASE_TYPES
from fedaug.engine.flower.codec import get_parts, put_parts, travelled_nbytes
from fedaug.engine.flower.settings import FlowerSettings
from fedaug.engine.client.worker import build_worker_model
from fedaug.engine.records.installation import installation
from fedaug.engine.records.progress import Progress
from fedaug.engine.records.rundir import RunDir, stored_config
from fedaug.engine.server.loop import Federation, Server, config_differences
from fedaug.methods.component import Phase, State
from fedaug.methods.recipe import build_recipe
from fedaug.methods.recorded import pin

#: the describe fields every SuperNode must agree on
SHARED = ("num_partitions", "task", "num_classes", "input_shape")
#: seconds to wait for one batch of describe replies before asking the silent nodes again
DESCRIBE_WAIT_S = 30.0


#: each describe field and the check its value must pass
DESCRIBE_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "client": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "num_partitions": ("an integer >= 1", lambda v: _int(v) and v >= 1),
    "name": ("a string", lambda v: isinstance(v, str)),
    "num_train": ("an integer >= 1", lambda v: _int(v) and v >= 1),
    "num_val": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "num_test": ("an integer >= 0", lambda v: _int(v) and v >= 0),
    "task": ("a string", lambda v: isinstance(v, str)),
    "num_classes": ("an integer >= 1", lambda v: _int(v) and v >= 1),
    "input_shape": ("a list of integers >= 1", lambda v: isinstance(v, list) and bool(v) and all(_int(x) and x >= 1 for x in v)),
    "info": ("a JSON object", lambda v: isinstance(v, str) and isinstance(_json(v), dict)),
}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def describe_problems(d: Mapping[str, Any], max_num_train: int) -> list[str]:
    """Every way a SuperNode's describe record fails :data:`DESCRIBE_FIELDS` (its ``num_train``, the
    aggregation weight, also at most ``max_num_train``: ``trust.max_num_train``)."""
    out = [f"'{k}' must be {want}, got {d.get(k)!r}" for k, (want, ok) in DESCRIBE_FIELDS.items() if not ok(d.get(k))]
    if not out and d["num_train"] > max_num_train:
        out.append(f"'num_train' = {d['num_train']} is over trust.max_num_train = {max_num_train}")
    if not out and d["client"] >= d["num_partitions"]:
        out.append(f"'client' = {d['client']} is not below num_partitions = {d['num_partitions']}")
    return out


def discover(grid: Grid, connect_timeout: float, poll_s: float = 0.5, max_num_train: int = 10**9
             ) -> tuple[Federation, dict[int, int]]:
    """Ask every SuperNode which client it serves; wait until each of the N clients has one.

    A SuperNode whose describe record fails :func:`describe_problems` is left out (its reasons are
    named if the federation is then incomplete), like one that never answers.

    Returns:
        The federation as the server knows it, and ``{client id: node id}``.

    Raises:
        FedaugError: a SuperNode cannot serve this run (its error, e.g. a wrong
            ``num-partitions``), two claim the same client, they disagree on the data, or not
            every client's SuperNode connected within ``connect_timeout`` seconds.
    """
    deadline = time.monotonic() + connect_timeout
    described: dict[int, dict[str, Any]] = {}
    refused: dict[int, str] = {}
    while True:
        new = [n for n in grid.get_node_ids() if n not in described and n not in refused]
        if new:
            asks = [Message(RecordDict(), dst_node_id=n, message_type="query.describe", group_id="describe")
                    for n in new]
            # a registered node that never answers (a stale one) is asked again later, not waited for
            wait = min(max(deadline - time.monotonic(), poll_s), DESCRIBE_WAIT_S)
            for rep in grid.send_and_receive(asks, timeout=wait):
                node = rep.metadata.src_node_id
                if rep.has_error():
                    raise FedaugError(f"SuperNode {node} cannot serve this run: {rep.error.reason}")
                d = dict(rep.content.config_records.get("describe", {}))
                problems = describe_problems(d, max_num_train)
                if problems:
                    refused[node] = "; ".join(problems)
                else:
                    described[node] = d
        nodes = _claims(described)
        total = next(iter(described.values()))["num_partitions"] if described else None
        if total is not None and len(nodes) == total:
            break
        if time.monotonic() >= deadline:
            raise FedaugError(
                f"only {len(nodes)} of {total if total is not None else 'N'} clients have a SuperNode after "
                f"{connect_timeout:g} s (partition ids seen: {sorted(nodes) or 'none'}); start one SuperNode per "
                "client with --node-config 'partition-id=K num-partitions=N', or raise the run config's connect-timeout"
                + "".join(f"; SuperNode {n} was left out: its describe record is malformed ({why})"
                          for n, why in sorted(refused.items())))
        time.sleep(poll_s)
    by_client = {described[n]["client"]: described[n] for n in nodes.values()}
    first = by_client[0]
    infos = {cid: json.loads(d["info"]) for cid, d in by_client.items()}
    info = infos[0] if all(i == infos[0] for i in infos.values()) else {"sites": infos}
    federation = Federation([by_client[c]["name"] for c in range(total)], [by_client[c]["num_train"] for c in range(total)],
                            [by_client[c]["num_val"] for c in range(total)], first["task"], first["num_classes"],
                            tuple(first["input_shape"]), info)
    return federation, nodes


def _claims(described: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
    """``{client id: node id}``; raises when SuperNodes disagree or two claim one client."""
    nodes: dict[int, int] = {}
    for node, d in sorted(described.items()):
        first_node, first = min(described.items())
        for key in SHARED:
            if d[key] != first[key]:
                raise FedaugError(f"SuperNodes disagree on {key}: {first[key]!r} (node {first_node}) and {d[key]!r} "
                                  f"(node {node}); give every SuperNode the same run and a partition of the same data")
        if d["client"] in nodes:
            raise FedaugError(f"partition-id {d['client']} is claimed by SuperNodes {nodes[d['client']]} and {node}; "
                              "give each SuperNode its own partition-id")
        nodes[d["client"]] = node
    return nodes


class FlowerFleet:
    """The clients behind Flower SuperNodes (see :class:`~fedaug.engine.protocol.Fleet`).

    Args:
        grid: the ServerApp's Grid.
        nodes: ``{client id: node id}`` from :func:`discover`.
        round_timeout: seconds to wait for one phase's replies (``None``: wait for all).
        device: the server's device: decoded replies (CPU tensors off the wire) are moved there.
    """

    def __init__(self, grid: Grid, nodes: Mapping[int, int], round_timeout: float | None,
                 device: torch.device = CPU) -> None:
        self.grid, self.nodes, self.timeout, self.device = grid, dict(nodes), round_timeout, device
        self._state_bytes: dict[int, int] = {}

    def _exchange(self, message_type: str, r: int, contents: Iterable[tuple[int, RecordDict]],
                  **header: Any) -> Iterator[tuple[int, Message | Dropped]]:
        """Send one message per client, each its own RecordDict; yield replies by client id."""
        sent: dict[int, Message] = {}
        for cid, content in contents:
            content[HEADER] = ConfigRecord({"client": cid, "round": r, **header})
            sent[cid] = Message(content, dst_node_id=self.nodes[cid], message_type=message_type, group_id=str(r))
        replies = {rep.metadata.src_node_id: rep for rep in self.grid.send_and_receive(list(sent.values()),
                                                                                       timeout=self.timeout)}
        for cid in sorted(sent):
            rep = replies.get(self.nodes[cid])
            if rep is None:
                yield cid, Dropped("timeout", f"no reply to '{message_type}' within the round timeout "
                                              f"(run config round-timeout = {self.timeout:g} s)")
            elif rep.has_error():
                yield cid, Dropped("error", rep.error.reason)
            else:
                yield cid, rep

    def run(self, phase: Phase, r: int, lr: float, client_ids: Sequence[int],
            message: Callable[[int], Parts]) -> Iterator[tuple[int, Reply | Dropped]]:
        contents = []
        for cid in client_ids:
            content = RecordDict()
            put_parts(content, message(cid))
            contents.append((cid, content))
        for cid, rep in self._exchange(PHASE_TYPES[phase], r, contents, lr=lr):
            yield cid, rep if isinstance(rep, Dropped) else self._decode(phase, cid, rep)

    def _decode(self, phase: Phase, cid: int, rep: Message) -> Reply | Malformed:
        """The :class:`Reply` in a Flower reply, or :class:`Malformed` with the reason; never raises
        (the parts themselves are checked by the exchange)."""
        sizes: dict[str, int] = {}
        try:
            sizes = travelled_nbytes(rep.content)
            parts = to_device(get_parts(rep.content), self.device)
            if phase != "train":
                return Reply(parts)
            missing = [k for k, records in (("state", rep.content.config_records), (METRICS, rep.content.metric_records))
                       if k not in records]
            if missing:
                return Malformed(f"the reply lacks its {' and '.join(map(repr, missing))} record", sizes)
            state, metrics = rep.content.config_records["state"], dict(rep.content.metric_records[METRICS])
            has, nbytes = state.get("has_state"), state.get("bytes")
            if not isinstance(has, bool) or isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                return Malformed(f"its 'state' record must hold has_state (true/false) and bytes (an integer >= 0), "
                                 f"got has_state={has!r}, bytes={nbytes!r}", sizes)
        except Exception as exc:  # a record Flower itself cannot read: the client's fault, never the server's
            return Malformed(f"the reply cannot be read ({type(exc).__name__}: {exc})", sizes)
        if has:
            self._state_bytes[cid] = nbytes
        else:
            self._state_bytes.pop(cid, None)
        return Reply(parts, metrics)

    def state_bytes(self) -> dict[int, int]:
        return dict(self._state_bytes)

    def checkpoint(self) -> dict[int, dict[str, State]]:
        return {}  # per-client states live in the SuperNodes' context.state

    def restore(self, states: dict[int, dict[str, State]]) -> None:
        if states:
            raise CheckpointError("this checkpoint holds per-client states of an in-process run; a Flower run keeps "
                                  "them on the SuperNodes and cannot take them over")


def run_server(grid: Grid, run_config: Mapping[str, Any], quiet: bool = False) -> dict[str, Any]:
    """Run a whole fedaug experiment over ``grid``; write its run directory; return the summary.

    Progress goes to stderr (nothing with ``quiet``), so stdout stays the caller's."""
    settings = FlowerSettings.from_run_config(run_config)
    cfg = pin(settings.cfg)  # its run directory records the options that change the numbers
    if cfg.workers > 1 or cfg.devices or cfg.train.group_clients > 1:
        warnings.warn(f"workers={cfg.workers}, devices={cfg.devices} and train.group_clients="
                      f"{cfg.train.group_clients} arrange the in-process engine's clients; on Flower every SuperNode "
                      "runs its own client, and they change nothing here", stacklevel=2)
    recipe = build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
    configure_process(cfg.threads, cfg.deterministic)  # a ServerApp is a process entry point (docs/engine.md)
    device = resolve_device(cfg.device)  # the server's own; each SuperNode chooses its own
    federation, nodes = discover(grid, settings.connect_timeout, max_num_train=cfg.trust.max_num_train)
    model = build_worker_model(cfg, recipe, federation.input_shape, federation.num_classes, device)
    fleet = FlowerFleet(grid, nodes, settings.round_timeout, device)
    server = Server(cfg, recipe, model, federation, fleet)
    if settings.resume_dir:
        run_dir = RunDir.open(settings.resume_dir, write=True)
    else:
        run_dir = RunDir.start(cfg, settings.out_dir or None)
    with run_dir:  # this process is the run directory's one writer until the run ends
        if settings.resume_dir:
            resume(server, run_dir)
        run_dir.append_environment(server.round, installation())  # the ServerApp's machine
        if not quiet:
            print(f"fedaug: {federation.num_clients} clients on SuperNodes {dict(sorted(nodes.items()))}; "
                  f"run directory {run_dir.path}", file=sys.stderr, flush=True)
        return server.run(run_dir, Progress(cfg.train.rounds, start=server.round, quiet=quiet))


def resume(server: Server, run_dir: RunDir) -> None:
    """Continue the Flower run in ``run_dir`` (opened for writing) from its newest checkpoint (from
    round 1 if it has none).

    Raises:
        CheckpointError: its checkpoint was written by another config, its records lack a round the
            checkpoint covers, or its clients kept per-client state: that state lived on the
            SuperNodes, is in no checkpoint, and a new Flower run starts without it.
    """
    path = run_dir.path
    moved = config_differences(pin(stored_config(path)), server.cfg)
    if moved:
        raise CheckpointError(f"the run in '{path}' was made with another config than this Flower app's "
                              f"({'; '.join(moved)}); resume it with an app written from its config.toml (fedaug "
                              "flower app PATH/config.toml)")
    kept = [r["round"] for r in run_dir.rounds() if r.get("client_state", {}).get("total_bytes")]
    if kept:
        raise CheckpointError(
            f"the run in '{path}' keeps per-client state on its SuperNodes (rounds {kept[0]}-{kept[-1]}), which no "
            "checkpoint holds and a new Flower run does not have; start the run anew (resume-dir = '')")
    payload = run_dir.load_latest()
    if payload is not None:
        server.restore(payload)
    run_dir.truncate_rounds(server.round)


def make_server_app(defaults: Mapping[str, Any] | None = None,
                    on_summary: Callable[[dict[str, Any]], None] | None = None, quiet: bool = False) -> ServerApp:
    """fedaug's ServerApp.

    Args:
        defaults: run config entries used where ``context.run_config`` has none (Flower's Python
            simulation API passes no run config: the config travels here).
        on_summary: called with the run's summary when it ends.
        quiet: print no progress.
    """
    app = ServerApp()
    base = dict(defaults or {})

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        summary = run_server(grid, {**base, **context.run_config}, quiet)
        if on_summary is not None:
            on_summary(summary)

    return app


#: the ServerApp a written Flower app names (``fedaug flower app``)
app = make_server_app()
