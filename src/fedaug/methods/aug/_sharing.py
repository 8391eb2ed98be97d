"""A shared pool of samples that every client contributes to once and receives once (FedMix, FedData).

Wire format (rows are samples, flattened so that the server needs no shapes):

* uplink ``x (n, D) float32, y (n, E), have () int64``: the client's contribution (``n = 0`` once the
  server has it) and how many pool rows it holds after this round's downlink;
* server state ``x (N, D), y (N, E), owner (N,) int64, sent {client id: rows it holds}``; the pool is
  append-only: a client's contribution is added once, in client-id order;
* downlink ``start () int64, x, y, owner``: the rows from ``sent[client]`` on (all of them the first
  time, none afterwards), so each row crosses the network once per client, as in the papers' "share
  once" protocol; the client keeps the pool in its per-client state.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedaug.core.device import module_device
from fedaug.core.errors import PayloadError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.layers.attach import output_shape
from fedaug.methods.component import ClientCtx, Component, Phase, State, Uplink

POOL = ("x", "y", "owner")


def empty_server(y_dtype: torch.dtype, device: torch.device) -> State:
    """The server's empty pool, on ``device``."""
    return {"x": torch.zeros(0, 0, device=device), "y": torch.zeros(0, 0, dtype=y_dtype, device=device),
            "owner": torch.zeros(0, dtype=torch.int64, device=device), "sent": {}}


def pool_downlink(server: State, client_id: int) -> Part:
    """The pool rows ``client_id`` does not hold yet, and where they start."""
    start = int(server["sent"].get(client_id, 0))
    return {"start": torch.tensor(start, device=server["owner"].device), **{k: server[k][start:].clone() for k in POOL}}


def pool_downlink_spec(y_dtype: torch.dtype) -> Spec:
    return {"start": TensorSpec((), torch.int64), "x": TensorSpec((None, None), torch.float32),
            "y": TensorSpec((None, None), y_dtype), "owner": TensorSpec((None,), torch.int64)}


def pool_uplink_spec(d: int | None, y: TensorSpec) -> Spec:
    """Contributions: ``x (n, d)``, labels ``y`` with the same ``n`` rows, and ``have >= 0``."""
    return {"x": TensorSpec(("rows", d), torch.float32, kind="data"), "y": y,
            "have": TensorSpec((), torch.int64, low=0, kind="data")}


def merge_pool(held: State, part: Part, name: str) -> dict[str, Tensor]:
    """The client's pool after this downlink: what it ``held`` plus the rows it lacked.

    Raises:
        PayloadError: the downlink starts after the rows the client holds (a gap) or rows disagree.
    """
    start, n = int(part["start"]), int(held["owner"].shape[0]) if held else 0
    if start > n:
        raise PayloadError(f"{name}: the server sent pool rows from {start} but this client holds {n}; "
                           "its per-client state was lost: restart the run or resume from a checkpoint")
    if not (part["x"].shape[0] == part["y"].shape[0] == part["owner"].shape[0]):
        raise PayloadError(f"{name}: pool rows disagree: x {part['x'].shape[0]}, y {part['y'].shape[0]}, "
                           f"owner {part['owner'].shape[0]}")
    if n == 0:
        return {k: part[k] for k in POOL}
    return {k: torch.cat([held[k], part[k][n - start :]]) for k in POOL}


def aggregate_pool(server: State, uplinks: Sequence[Uplink]) -> State:
    """Append the contributions of clients not yet in the pool; record how many rows each holds."""
    x, y, owner = server["x"], server["y"], server["owner"]
    sent = dict(server["sent"])
    for u in uplinks:
        sent[u.client_id] = int(u.part["have"])
        n = u.part["x"].shape[0]
        if n == 0 or u.part["y"].shape[0] != n or bool((owner == u.client_id).any()):
            continue
        fill = torch.full((n,), u.client_id, dtype=torch.int64, device=u.part["x"].device)
        x, y, owner = ((u.part["x"], u.part["y"], fill) if owner.shape[0] == 0 else
                       (torch.cat([x, u.part["x"]]), torch.cat([y, u.part["y"]]), torch.cat([owner, fill])))
    return {"x": x, "y": y, "owner": owner, "sent": sent}


class PoolAug(Component, abc.ABC):
    """A component whose clients contribute rows to a shared pool once and train with the others' rows.

    Subclasses set :attr:`y_dtype` and implement :meth:`contribution`; after :meth:`receive`,
    :attr:`shared_x` ``(M, *sample)`` and :attr:`shared_y` ``(M, ...)`` hold the other clients' rows
    (``M = 0`` until the server has any: in round 1 nobody has shared yet).
    """

    y_dtype: torch.dtype = torch.float32

    @abc.abstractmethod
    def contribution(self, ctx: ClientCtx) -> tuple[Tensor, Tensor]:
        """This client's rows: ``x (n, *sample)`` float32 and ``y (n, ...)``."""

    @abc.abstractmethod
    def label_spec(self, output: tuple[int, ...]) -> TensorSpec:
        """The spec of the uploaded labels ``y (n, E)`` (rows named ``"rows"``), given the model's
        :func:`~fedaug.layers.attach.output_shape` ``output``."""

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        """Fix the upload's row widths from the input shape and the model's output (round 1 included)."""
        self._up = pool_uplink_spec(math.prod(input_shape), self.label_spec(output_shape(model, input_shape)))

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._pool = merge_pool(state, part, self.name)
        others = self._pool["owner"] != ctx.client_id
        sample, target = ctx.data.x.shape[1:], ctx.data.y.shape[1:]
        x, y = self._pool["x"][others], self._pool["y"][others]
        if x.shape[0] and x.shape[1] != ctx.data.x[0].numel():
            raise PayloadError(f"{self.name}: shared rows have {x.shape[1]} values, this client's inputs "
                               f"{tuple(sample)} have {ctx.data.x[0].numel()}")
        self.shared_x = x.reshape(-1, *sample)
        self.shared_y = y.reshape(x.shape[0], *self.label_shape(ctx, target))
        self._share = None
        if not bool((self._pool["owner"] == ctx.client_id).any()):
            self._share = self.contribution(ctx)

    def label_shape(self, ctx: ClientCtx, target: torch.Size) -> tuple[int, ...]:
        """Shape of one shared label (default: the client's label shape)."""
        return tuple(target)

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        have = torch.tensor(int(self._pool["owner"].shape[0]), device=ctx.device)
        if self._share is None:
            x = torch.zeros(0, ctx.data.x[0].numel(), device=ctx.device)
            y = torch.zeros(0, self._pool["y"].shape[1], dtype=self.y_dtype, device=ctx.device)
        else:
            x, y = self._share[0].reshape(self._share[0].shape[0], -1), self._share[1]
            y = y.reshape(y.shape[0], -1).to(self.y_dtype)
        return {"x": x.float(), "y": y, "have": have}, dict(self._pool)

    def init_server(self, model: nn.Module, num_clients: int) -> State:
        return empty_server(self.y_dtype, module_device(model))

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        return pool_downlink(server, client_id)

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        return pool_downlink_spec(self.y_dtype)

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        return self._up

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        return aggregate_pool(server, uplinks)
