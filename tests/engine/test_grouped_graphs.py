"""Grouped steps captured (``train.group_clients > 1`` with ``train.cuda_graph = true``, and a pack's groups;
issue 62), proven on the CPU under the capture emulation (:class:`~fedaug.engine.client.capture.TracedCapture`,
tests/engine/test_graphed.py says what it shows): a group's replayed steps give the grouped steps' records, weights
and states bit for bit, for every capturable method; a partial batch, a learning-rate schedule and groups of
other sizes each get their own graph, captured once; a pack's groups replay too, with per-client rates."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fedaug.engine.client.capture import TracedCapture
from fedaug.engine.client.grouped_graphs import GroupGraphs
from fedaug.engine.fleet.packed import Pack
from fedaug.engine.run import Simulation, build_simulation
from tests.engine.test_graphed import SCOPE, replays_equal
from tests.engine.test_grouped import config, records


def captured(sim: Simulation) -> GroupGraphs:
    """Train ``sim``'s groups by :class:`GroupGraphs` under the emulation; returns it."""
    worker = sim.fleet.worker
    worker.group_graphs = GroupGraphs(TracedCapture())
    return worker.group_graphs


@pytest.mark.parametrize("method", SCOPE)
def test_captured_groups_equal_grouped_steps_bit_for_bit(method):
    _, graphs = replays_equal(config(method, 4).to_dict(), captured)
    # one group layout, one batch shape: captured once for three rounds (FLea: again when its buffer fills)
    assert graphs.num_captures == (2 if method == "flea" else 1)


def test_partial_batches_a_schedule_and_group_sizes_each_get_their_own_graph():
    """Clients of 44 samples in batches of 16 without drop_last (16, 16, 12), the learning rate halving every
    round, and groups of 3 and 1 (``group_clients = 3`` over four clients: the one left trains alone)."""
    train = dict(lr=0.01, local_steps=None, local_epochs=1, drop_last=False, lr_schedule="exponential", lr_decay=0.5)
    raw = config("fedprox", 3, **train).to_dict()
    raw["data"]["options"].update(num_clients=4, samples_per_client=44)
    _, graphs = replays_equal(raw, captured)
    assert graphs.num_captures == 3 * 2  # per round's rate: the full batches' graph and the partial one's


def test_a_packs_groups_replay_with_each_clients_own_rate():
    """A pack of three runs (two learning rates and weight decays: :class:`StackedSGD`'s rates are static
    tensors copied in per group), its groups captured: the packed records without capture, bit for bit."""
    base = config("scaffold", 1)
    cfgs = [base, dataclasses.replace(base, seed=8),
            dataclasses.replace(base, train=dataclasses.replace(base.train, lr=0.02, weight_decay=1e-3))]

    def run(capture: bool) -> list[Any]:
        def body(slot, cfg):
            sim = build_simulation(cfg, trainer=slot.train)
            if capture:
                captured(sim)
            return records(sim, 3)

        return Pack().run([lambda slot, c=c: body(slot, c) for c in cfgs])

    want = run(False)
    assert not [r for r in want if isinstance(r, BaseException)]
    assert run(True) == want
