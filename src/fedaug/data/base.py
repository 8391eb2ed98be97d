"""The in-memory form of a federated dataset: clients, each with train/val/test splits."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import Tensor

from fedaug.core.errors import ConfigError, DataError, suggest
from fedaug.data.partition import leave_one_group_out

Task = Literal["classification", "segmentation"]


@dataclass(frozen=True)
class Split:
    """One split of one client.

    Args:
        x: inputs, ``(N, C, *spatial)`` float32.
        y: labels, ``(N,)`` int64 class indices for classification, ``(N, *spatial)`` int64 for
            segmentation.
    """

    x: Tensor
    y: Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} samples but y has {self.y.shape[0]}")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of ``x`` and ``y``."""
        return sum(t.numel() * t.element_size() for t in (self.x, self.y))

    def to(self, device: torch.device, non_blocking: bool = False) -> "Split":
        """This split on ``device`` (itself when already there: no copy)."""
        if self.x.device == device and self.y.device == device:
            return self
        return Split(self.x.to(device, non_blocking=non_blocking), self.y.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Split":
        """A copy in page-locked host memory, from which copies to a CUDA device can run asynchronously."""
        return Split(self.x.pin_memory(), self.y.pin_memory())

    @staticmethod
    def empty_like(other: "Split") -> "Split":
        """A zero-sample split with ``other``'s trailing shapes and dtypes."""
        return Split(other.x[:0], other.y[:0])


@dataclass(frozen=True)
class ClientData:
    """One logical client.

    Args:
        name: unique, human-readable (``"mnist"``, ``"mnist#1"``, ``"subject-3"``).
        group: the natural group it came from (domain, site, subject); equal to ``name`` when
            there is one client per group.
        train, val, test: its splits; ``val`` and ``test`` may be empty.
    """

    name: str
    group: str
    train: Split
    val: Split
    test: Split

    @property
    def nbytes(self) -> int:
        """Bytes of every split."""
        return self.train.nbytes + self.val.nbytes + self.test.nbytes

    def to(self, device: torch.device, non_blocking: bool = False) -> "ClientData":
        """This client with every split on ``device`` (:meth:`Split.to`)."""
        return replace(self, **{s: getattr(self, s).to(device, non_blocking) for s in ("train", "val", "test")})

    def pin_memory(self) -> "ClientData":
        """This client with every split in page-locked host memory (:meth:`Split.pin_memory`)."""
        return replace(self, **{s: getattr(self, s).pin_memory() for s in ("train", "val", "test")})


def label_problems(client: ClientData, num_classes: int) -> list[str]:
    """What is wrong with ``client``'s labels: a split whose labels are not integers, or hold
    values outside ``0..num_classes - 1`` (the first ten such values are named)."""
    out = []
    for split in ("train", "val", "test"):
        y = getattr(client, split).y
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            out.append(f"client '{client.name}' {split} labels are {y.dtype}, not integer class indices")
        elif y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            bad = torch.unique(y[(y < 0) | (y >= num_classes)])
            shown = ", ".join(str(v) for v in bad[:10].tolist()) + (", ..." if len(bad) > 10 else "")
            out.append(f"client '{client.name}' {split} has label(s) {shown}")
    return out


@dataclass(frozen=True)
class FederatedData:
    """A federated dataset: every client's splits plus what a model needs to know.

    Args:
        name: registry name of the source (``"digits4"``).
        task: ``"classification"`` or ``"segmentation"``.
        num_classes: number of classes (segmentation: including background).
        input_shape: ``(C, *spatial)`` of one sample.
        clients: the clients, in client-id order (client id = position).
        info: provenance: source packages, whether anything is synthetic, the parameters used.

    Raises:
        DataError: a client's labels (class indices, or a segmentation's mask values) are not
            integers in ``0..num_classes - 1``; the message names the dataset, the clients, the
            splits and the bad values.
    """

    name: str
    task: Task
    num_classes: int
    input_shape: tuple[int, ...]
    clients: list[ClientData]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = [p for c in self.clients for p in label_problems(c, self.num_classes)]
        if problems:
            raise DataError(f"{self.name}: labels must be integer class indices in 0..{self.num_classes - 1} "
                            f"(num_classes={self.num_classes}); " + "; ".join(problems) + ". Correct the source "
                            "data (a dataset generated into the cache is rebuilt once its file under $FEDAUG_CACHE "
                            "is deleted)")

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def pooled(self, split: Literal["train", "val", "test"]) -> Split:
        """All clients' ``split`` concatenated in client-id order."""
        parts = [getattr(c, split) for c in self.clients]
        return Split(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


def hold_out_group(data: FederatedData, held_out: str) -> FederatedData:
    """Leave one domain out (FedFA, ICLR 2023, Sec. 4.3, Table 4): the clients of group
    ``held_out`` leave the federation; every remaining client keeps its train and val splits (so
    the best round is still chosen in-domain) and is tested on the held-out group's test samples
    (its clients' test splits, concatenated).

    The mean over clients of the test metric is then the unseen domain's metric (each client's
    value is the global model's on the same samples, differing only through per-client evaluation
    state such as local BatchNorm statistics); the pooled test set counts those samples once per client.

    Args:
        data: the federation; its clients' ``group`` names the domains.
        held_out: the group to leave out.

    Raises:
        ConfigError: ``held_out`` is not a group, or it is the only one.
    """
    groups = list(dict.fromkeys(c.group for c in data.clients))
    if held_out not in groups or len(groups) < 2:
        raise ConfigError(f"{data.name}: held_out must be one of its client groups ({', '.join(groups)}; at least "
                          f"2 are needed), got {held_out!r}{suggest(str(held_out), groups)}")
    _, parts, held = leave_one_group_out([c.group for c in data.clients], held_out)
    test = Split(torch.cat([data.clients[i].test.x for i in held]), torch.cat([data.clients[i].test.y for i in held]))
    keep = sorted(int(i) for part in parts for i in part)
    return replace(data, clients=[replace(data.clients[i], test=test) for i in keep],
                   info={**data.info, "held_out": held_out})
