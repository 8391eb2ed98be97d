"""The in-memory form of a federated dataset: clients, each with train/val/test splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

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
    """

    name: str
    task: Task
    num_classes: int
    input_shape: tuple[int, ...]
    clients: list[ClientData]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def pooled(self, split: Literal["train", "val", "test"]) -> Split:
        """All clients' ``split`` concatenated in client-id order."""
        parts = [getattr(c, split) for c in self.clients]
        return Split(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))
