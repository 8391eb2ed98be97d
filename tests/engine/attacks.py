"""Hostile or buggy uploads, shared by the trust-boundary tests of both engines (issue 21).

Each attack names the method it targets, the phase and part it corrupts, how (a function of the
honest part) and what the server must say when it rejects it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tests.conftest import tiny_raw

Part = dict[str, Tensor]


def _first(part: Part, suffix: str = "") -> str:
    return sorted(k for k in part if k.endswith(suffix))[0]


def scaled(suffix: str, value: float) -> Callable[[Part], Part]:
    """Every value of the first tensor whose name ends with ``suffix`` set to ``value``."""
    def corrupt(part: Part) -> Part:
        key = _first(part, suffix)
        return {**part, key: torch.full_like(part[key], value)}
    return corrupt


def widened(suffix: str) -> Callable[[Part], Part]:
    """The first tensor whose name ends with ``suffix`` one longer in its last dimension."""
    def corrupt(part: Part) -> Part:
        key = _first(part, suffix)
        t = part[key]
        return {**part, key: torch.cat([t, t[..., :1]], dim=-1)}
    return corrupt


def labels(value: int) -> Callable[[Part], Part]:
    return lambda part: {**part, "labels": torch.full_like(part["labels"], value)}


def one_label_short(part: Part) -> Part:
    return {**part, "labels": part["labels"][1:]}


@dataclass(frozen=True)
class Attack:
    """Client 1 corrupts part ``part`` of its ``phase`` reply in round 1 with ``corrupt``."""

    method: dict[str, Any]
    phase: str
    part: str
    corrupt: Callable[[Part], Part]
    reason: str  # a regular expression the rejection reason matches


ATTACKS: dict[str, Attack] = {
    "fedavg weights of 1e30": Attack({}, "train", "fedavg", scaled("", 1e30), r"over the bound 1e\+06"),
    "fedavg weights of inf": Attack({}, "train", "fedavg", scaled("", float("inf")), r"non-finite"),
    "flea features of 1e30": Attack({"augs": ["flea"]}, "query", "flea", scaled("features", 1e30), r"over the bound"),
    "flea features one too wide in round 1": Attack({"augs": ["flea"]}, "query", "flea", widened("features"),
                                                   r"'features' has shape \(\d+, \d+\), expected"),
    "flea labels >= num_classes": Attack({"augs": ["flea"]}, "query", "flea", labels(4),
                                         r"'labels' holds 4, above its largest allowed value 3"),
    "flea labels < 0": Attack({"augs": ["flea"]}, "query", "flea", labels(-1), r"'labels' holds -1, below"),
    "flea rows and labels disagree": Attack({"augs": ["flea"]}, "query", "flea", one_label_short,
                                            r"'labels' has shape .*rows="),
    "fedfa statistic one too long in round 1": Attack({"augs": ["fedfa"]}, "train", "fedfa", widened("running_mean"),
                                                      r"running_mean' has shape \(\d+,\), expected \(\d+,\)"),
    "fedfa negative std": Attack({"augs": ["fedfa"]}, "train", "fedfa", scaled("running_std", -1.0),
                                 r"running_std' holds -1, below"),
    "fedfa std of 1e30 (variance=direct)": Attack(
        {"augs": ["fedfa"], "options": {"fedfa": {"variance": "direct"}}}, "train", "fedfa",
        scaled("running_std", 1e30), r"over the bound"),
    "fedfa means of 1e30 (official_compat)": Attack(
        {"augs": ["fedfa"], "options": {"fedfa": {"official_compat": True}}}, "train", "fedfa",
        scaled("running_mean", 1e30), r"over the bound"),
}


def attack_raw(attack: Attack, rounds: int = 2) -> dict[str, Any]:
    """A tiny 3-client run of the attack's method, checkpointed every round."""
    raw = tiny_raw(rounds=rounds, local_steps=2)
    raw["method"] = dict(attack.method)
    return raw


def finite(tree: object) -> bool:
    """Whether every floating tensor in a nest of dicts and lists is finite."""
    if isinstance(tree, Tensor):
        return not tree.is_floating_point() or bool(torch.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(finite(v) for v in tree)
    return True
