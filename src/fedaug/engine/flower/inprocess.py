"""Flower's message path in one process: a Grid whose SuperNodes are ClientApps called in turn.

:class:`InProcessGrid` serves the ServerApp's Grid calls itself: every message and reply is
encoded to Flower's wire format (protobuf) and decoded again, each node keeps its own
``Context`` whose ``state`` is likewise stored as protobuf bytes between messages (so only what is
in ``context.state`` survives, as in a deployment), and an exception in a ClientApp becomes
Flower's error reply, leaving the node's state as it was. It needs neither Ray nor a network:
tests and the benchmark use it to show that the Flower adapter gives the in-process engine's
numbers, and how much the message path itself costs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto, recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict  # pylint: disable=no-name-in-module
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedaug.config.schema import RunConfig
from fedaug.engine.flower.client_app import NUM_PARTITIONS, PARTITION_ID, make_client_app
from fedaug.engine.flower.server_app import run_server
from fedaug.engine.flower.settings import run_config_for

#: a ClientApp, or a stand-in for one: ``(message, context) -> reply``; ``None`` means "never answers"
ClientFn = Callable[[Message, Context], Message | None]


def wire(message: Message) -> Message:
    """``message`` after a trip through Flower's wire format (protobuf bytes)."""
    return message_from_proto(message_to_proto(message))


class InProcessGrid(Grid):
    """A Grid whose nodes run ``client`` in this process, one message after another.

    Args:
        client: the ClientApp (or a stand-in, e.g. one that fails for some node).
        node_configs: one node config per SuperNode (``partition-id``, ``num-partitions``, ...).
        run_config: the Flower run config every node's Context carries.
        node_ids: the nodes' ids (default: arbitrary ids unrelated to the partition ids).
        pull_interval: seconds between polls while replies are missing (a stand-in that never
            answers makes the server wait for its time-out).
    """

    def __init__(self, client: ClientFn, node_configs: Sequence[Mapping[str, Any]], run_config: Mapping[str, Any],
                 node_ids: Sequence[int] | None = None, pull_interval: float = 0.05) -> None:
        ids = list(node_ids) if node_ids is not None else [9_000 + 7 * (len(node_configs) - k)
                                                           for k in range(len(node_configs))]
        self.client, self.pull_interval = client, pull_interval
        self._run = Run.create_empty(1)
        self._configs = {n: dict(c) for n, c in zip(ids, node_configs, strict=True)}
        self._states = {n: recorddict_to_proto(RecordDict()).SerializeToString() for n in ids}
        self._run_config = dict(run_config)
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._configs)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            ids.append(msg.metadata.message_id)
            reply = self._deliver(wire(msg))
            if reply is not None:
                self._replies[msg.metadata.message_id] = wire(reply)
        return ids

    def _deliver(self, msg: Message) -> Message | None:
        """Run the node's ClientApp on ``msg`` with the node's Context, as a SuperNode does."""
        node = msg.metadata.dst_node_id
        proto = ProtoRecordDict()
        proto.ParseFromString(self._states[node])
        state = recorddict_from_proto(proto)
        context = Context(self._run.run_id, node, dict(self._configs[node]), state, dict(self._run_config))
        try:
            reply = self.client(msg, context)
        except Exception as exc:  # noqa: BLE001 - every ClientApp failure becomes an error reply, as in Flower
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                 reason=f"{type(exc)}:<'{exc}'>"), reply_to=msg)
        if reply is not None:
            self._states[node] = recorddict_to_proto(context.state).SerializeToString()
        return reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        pending = set(self.push_messages(messages))
        end = time.monotonic() + (timeout or 0.0)
        out: list[Message] = []
        while True:
            got = list(self.pull_messages(pending))
            out += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            if not pending or timeout is None or time.monotonic() >= end:
                return out
            time.sleep(self.pull_interval)


def partition_configs(num_clients: int) -> list[dict[str, int]]:
    """Node configs of ``num_clients`` SuperNodes, one per client of a built-in dataset."""
    return [{PARTITION_ID: k, NUM_PARTITIONS: num_clients} for k in range(num_clients)]


def run_in_process(cfg: RunConfig, num_clients: int, *, client: ClientFn | None = None,
                   node_configs: Sequence[Mapping[str, Any]] | None = None, quiet: bool = False,
                   **settings: Any) -> dict[str, Any]:
    """Run ``cfg`` through fedaug's ServerApp and ClientApp over an :class:`InProcessGrid`.

    Args:
        cfg: the fedaug config.
        num_clients: the dataset's number of clients (one SuperNode each).
        client: the ClientApp (default: fedaug's).
        node_configs: the SuperNodes' node configs (default: :func:`partition_configs`).
        quiet: print no progress.
        settings: Flower run config settings (``round_timeout``, ``connect_timeout``, ``out_dir``).

    Returns:
        The run's summary (its run directory is written as for ``fedaug run``).
    """
    run_config = run_config_for(cfg, **settings)
    grid = InProcessGrid(client or make_client_app(), node_configs or partition_configs(num_clients), run_config)
    with server_identity(grid.run.run_id):
        return run_server(grid, run_config, quiet)


@contextlib.contextmanager
def server_identity(run_id: int) -> Iterator[None]:
    """Act as the ServerApp's process of run ``run_id`` (Flower's runtime sets who creates messages)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
