"""Which execution a run's clients get (:mod:`fedaug.engine.execution`, issue 63): what ``train.cuda_graph`` resolves
to where, the names the records give, and the view of the two ``"auto"`` keys that comparisons of configs take.
This machine is made one with or without CUDA where it matters (only where ``"auto"`` resolves is asked)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedaug.config.schema import validate, with_legacy
from fedaug.engine.execution import captures, compared, execution_name, on_cuda
from fedaug.engine.server.loop import config_differences
from tests.conftest import tiny_raw


@pytest.fixture(params=[False, True], ids=["cpu machine", "cuda machine"])
def cuda_here(request, monkeypatch) -> bool:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: request.param)
    return request.param


def cfg(**changes: Any):
    """The tiny config with top-level ``changes`` and ``train``'s and ``method``'s given as dicts."""
    raw = tiny_raw()
    raw["train"].update(changes.pop("train", {}))
    raw.update(changes)
    return validate(raw)


@pytest.mark.parametrize(("flags", "name"), [
    ((False, False, False), "eager"), ((False, True, False), "grouped"), ((False, False, True), "captured"),
    ((False, True, True), "grouped captured"), ((True, True, False), "packed"), ((True, True, True), "packed captured"),
])
def test_execution_names(flags, name):
    packed, grouped, captured = flags
    assert execution_name(packed=packed, grouped=grouped, captured=captured) == name


#: (changes, captures on a machine without CUDA, captures on one with CUDA)
CASES = [
    ({}, False, True),  # the default, "auto"
    ({"device": "cpu"}, False, False),
    ({"train": {"cuda_graph": False}}, False, False),
    ({"train": {"cuda_graph": True}}, True, True),  # (refused on a CPU when the worker is built)
    ({"method": {"base": "moon"}}, False, False),  # no step forms
    ({"precision": "bf16-mixed"}, False, False),  # captured steps train in float32
    ({"workers": 2, "devices": ["cpu", "cuda:0"]}, True, True),  # a worker named on CUDA captures there
    ({"device": "cuda"}, True, True),  # a config that names CUDA describes captured steps on any machine
    ({"fleet": "ray", "ray": {"num_gpus": 1.0}}, True, True),  # its actors compute on the GPU Ray gives them
]


@pytest.mark.parametrize(("changes", "on_cpu", "on_gpu"), CASES)
def test_what_train_cuda_graph_resolves_to(cuda_here, changes, on_cpu, on_gpu):
    c = cfg(**changes)
    want = on_gpu if cuda_here else on_cpu
    assert captures(c) is want
    assert compared(c) == {"train.cuda_graph": want, "data.on_device": False}


def test_data_on_device_is_placement_in_every_comparison(cuda_here):
    for setting in (True, False, "auto"):
        assert compared(cfg(data={**tiny_raw()["data"], "on_device": setting}))["data.on_device"] is False


def test_where_the_clients_compute(cuda_here):
    assert on_cuda(cfg()) is cuda_here
    assert on_cuda(cfg(device="cuda")) is True and on_cuda(cfg(device="cpu")) is False
    assert on_cuda(cfg(workers=2, devices=["cpu"], device="cuda")) is False  # the workers' devices, not the server's


def test_a_stored_config_without_the_auto_keys_ran_with_false():
    stored = {"seed": 1, "train": {"rounds": 2}, "data": {"name": "synthetic"}}
    filled = with_legacy(stored)
    assert filled["train"] == {"rounds": 2, "cuda_graph": False} and filled["data"] == {"name": "synthetic",
                                                                                      "on_device": False}
    assert stored == {"seed": 1, "train": {"rounds": 2}, "data": {"name": "synthetic"}}  # left as it was
    assert with_legacy({"train": {"cuda_graph": "auto"}, "data": {"on_device": True}}) == {
        "train": {"cuda_graph": "auto"}, "data": {"on_device": True}}


@pytest.mark.parametrize(("stored", "resumed", "moved_on_cpu", "moved_on_gpu"), [
    ({"train": {"cuda_graph": False}}, {}, [], ["train.cuda_graph: false (eager steps) -> auto (captured steps)"]),
    ({"train": {"cuda_graph": True}}, {}, ["train.cuda_graph: true (captured steps) -> auto (eager steps)"], []),
    ({}, {"device": "cpu"}, [], []),  # captured on CUDA, continued eagerly on a CPU: a device move (warned of)
    ({"device": "cuda", "train": {"cuda_graph": False}}, {"device": "cuda"},
     *[["train.cuda_graph: false (eager steps) -> auto (captured steps)"]] * 2),
    ({"train": {"cuda_graph": False, "lr": 0.1}}, {"train": {"cuda_graph": False}}, *[["train.lr: 0.1 -> 0.05"]] * 2),
    ({"workers": 2, "seed": 3}, {}, *[["seed: 3 -> 7"]] * 2),  # placement is no difference
])
def test_a_resume_compares_train_cuda_graph_by_the_execution_it_resolves_to_where_the_run_continues(
        cuda_here, stored, resumed, moved_on_cpu, moved_on_gpu):
    """A checkpoint's config and the resuming one are one experiment where ``train.cuda_graph`` resolves to the same
    steps with the resuming config's placement on this machine (:func:`config_differences`)."""
    assert config_differences(cfg(**stored), cfg(**resumed)) == (moved_on_gpu if cuda_here else moved_on_cpu)
