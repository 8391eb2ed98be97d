"""Which cells pack (``fedaug compare --pack``, issue 62, :mod:`fedaug.report.packing`): cells of one step's shape
share a key whatever their seed, data, schedule, server rule or free options; a component in the step with other
options, another model, precision or thread count separates them; a method without step forms, worker processes
or Ray actors keep a cell alone, each with its reason; packs are cut at the pack size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.report.packing import plan_packs, step_key
from fedaug.report.runner import Cell
from tests.conftest import tiny_raw


def cfg(**changes: Any):
    raw = tiny_raw()
    for key, value in changes.items():
        part, _, leaf = key.rpartition(".")
        (raw.setdefault(part, {}) if part else raw)[leaf] = value
    return validate(raw)


def key(**changes: Any) -> str:
    k, why = step_key(cfg(**changes))
    assert k and not why
    return k


@pytest.mark.parametrize("changes", [
    {"seed": 3}, {"train.lr": 0.2}, {"train.weight_decay": 0.1}, {"train.rounds": 9}, {"train.batch_size": 8},
    {"data.options": {"num_clients": 5, "samples_per_client": 20, "num_classes": 4, "size": 8}},
    {"eval.every": 3}, {"method.base": "fedavgm"}, {"method.base": "fedbn"}, {"method.augs": ["fedrdn"]},
    {"method.options": {"fedavg": {"clip_norm": 1.0, "clip_at": "client"}}},
    {"train.cuda_graph": False},  # "auto" steps eagerly on this CPU, as false does
    {"data.on_device": True}, {"data.on_device": False},  # placement
])
def test_what_may_differ_within_a_pack(changes, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # where "auto" resolves: a machine without CUDA
    assert key(**changes) == key()


@pytest.mark.parametrize("changes", [
    {"method.base": "fedprox"}, {"method.augs": ["fedfa"]}, {"method.base": "scaffold"},
    {"model.options": {"width": 16}}, {"precision": "bf16-mixed"}, {"threads": 1}, {"deterministic": True},
    {"train.cuda_graph": True},  # captured steps
])
def test_what_separates_packs(changes):
    assert key(**changes) != key()


def test_a_components_options_in_the_step_separate_and_its_free_ones_do_not():
    prox = {"method.base": "fedprox"}
    assert key(**prox, **{"method.options": {"fedprox": {"mu": 0.5}}}) != key(**prox)
    fa = {"method.augs": ["fedfa"]}
    assert key(**fa, **{"method.options": {"fedfa": {"stats_rule": "median"}}}) == key(**fa)
    assert key(**fa, **{"method.options": {"fedfa": {"p": 0.2}}}) != key(**fa)


@pytest.mark.parametrize(("changes", "why"), [
    ({"method.base": "moon"}, r"cannot train grouped: 'moon' \(it has no grouped form of its client hooks\)"),
    ({"workers": 2}, r"trains on 2 worker processes \(workers = 2; a pack needs workers = 1\)"),
    ({"fleet": "ray"}, r"Ray actors \(fleet = 'ray'; a pack needs fleet = 'local'\)"),
])
def test_a_cell_that_cannot_pack_says_why(changes, why):
    import re

    k, reason = step_key(cfg(**changes))
    assert k == "" and re.search(why, reason), reason


def cell(name: str) -> Cell:
    return Cell("s", name, 0, Path(name), {})


def test_plan_cuts_packs_at_the_size_and_leaves_lone_cells_alone_with_a_reason():
    cells = [(cell(f"a{i}"), cfg(seed=i)) for i in range(5)] + [(cell("prox"), cfg(**{"method.base": "fedprox"})),
                                                               (cell("moon"), cfg(**{"method.base": "moon"}))]
    plan = plan_packs(cells, size=2)
    assert [[c.method for c in p] for p in plan.packs] == [["a0", "a1"], ["a2", "a3"]]
    alone = {c.method: why for c, why in plan.alone}
    assert set(alone) == {"a4", "prox", "moon"}
    assert "no other cell left" in alone["a4"] and "no other cell of the grid" in alone["prox"]
    assert "moon" in alone["moon"]
    lines = plan.describe()
    assert lines[0] == "pack 1 (2 cells): s | a0 | seed 0; s | a1 | seed 0"
    with pytest.raises(ValueError, match="at least 2 cells, got a pack size of 1"):
        plan_packs(cells, size=1)
