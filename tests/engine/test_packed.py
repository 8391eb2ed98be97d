"""Packed runs (issue 62, :mod:`fedaug.engine.fleet.packed`): runs of one step's shape trained as one program
each compute what they compute alone, within the grouped tolerances of docs/engine.md (tests/engine/test_grouped.py
``METHODS``) against one-at-a-time training and within the same bounds against the run alone with its clients
grouped; runs that differ in seed, learning rate and weight decay, or a free method option pack; a run that
fails leaves its pack and the others go on; a group whose batched steps raise is trained run by run."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from fedaug.config.schema import RunConfig, validate
from fedaug.engine.client import worker as worker_module
from fedaug.engine.fleet.packed import Pack
from fedaug.engine.run import build_simulation
from fedaug.engine.client.grouped import StackedSGD
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import Recipe
from tests.conftest import imports_torch_dynamo
from tests.engine.test_grouped import METHODS, assert_close_trees, config, records

#: the methods the issue names (FedFA on both CPU paths)
PACKED = ["fedavg", "fedprox", "scaffold", "fedbn", "fedfa", "fedfa_kernel", "vfda", "fedrdn", "flea"]


def with_train(cfg: RunConfig, **changes: Any) -> RunConfig:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))


def packed_records(cfgs: list[RunConfig], rounds: int = 3, recipes: list[Any] | None = None) -> list[Any]:
    """Each config's round records (tests/engine/test_grouped.py ``records``), the runs trained as one pack."""
    recipes = recipes or [None] * len(cfgs)
    return Pack().run([lambda slot, c=c, r=r: records(build_simulation(c, recipe=r, trainer=slot.train), rounds)
                       for c, r in zip(cfgs, recipes)])


@pytest.mark.parametrize("method", PACKED)
def test_a_packed_run_equals_the_run_alone_within_the_grouped_tolerance(method, request):
    if method == "fedfa_kernel":
        request.getfixturevalue("needs_kernel")
    tol = METHODS[method][3]
    cfgs = [dataclasses.replace(config(method, 1), seed=s) for s in (7, 8)]
    got = packed_records(cfgs)
    assert not [r for r in got if isinstance(r, BaseException)]
    assert_close_trees(got[0], records(build_simulation(cfgs[0]), 3), tol)  # one client at a time (the default)
    for cfg, run in zip(cfgs, got):  # the run alone with its clients grouped: other runs' clients beside them
        assert_close_trees(run, records(build_simulation(with_train(cfg, group_clients=4)), 3), tol)


def test_runs_with_their_own_learning_rate_and_weight_decay_pack_and_each_trains_at_its_own():
    base = config("fedavg", 1)
    cfgs = [base, with_train(base, lr=0.02), with_train(base, weight_decay=1e-2)]
    got = packed_records(cfgs)
    tol = METHODS["fedavg"][3]
    for cfg, run in zip(cfgs, got):
        assert_close_trees(run, records(build_simulation(cfg), 3), tol)
    # the rates matter: the runs differ from one another by far more than the tolerance
    assert abs(got[0][-1]["train"]["loss"] - got[1][-1]["train"]["loss"]) > 1e-3


def test_runs_that_differ_in_a_free_method_option_pack():
    cfgs = [validate({**config("fedavg", 1).to_dict(), "method": {"base": "fedavgm", "options": {"fedavgm": {
        "momentum": m}}}}) for m in (0.3, 0.6)]
    got = packed_records(cfgs)
    for cfg, run in zip(cfgs, got):
        assert_close_trees(run, records(build_simulation(cfg), 3), METHODS["fedavg"][3])
    assert got[0][-1]["train"]["loss"] != got[1][-1]["train"]["loss"]


def test_a_pack_at_several_rates_trains_on_the_cpu_without_importing_torch_dynamo():
    """StackedSGD (a pack whose runs differ in learning rate) is an EagerOptimizer: like the clients' own
    optimisers on the CPU, it never imports torch._dynamo (4-6 CPU-seconds of a process, docs/engine.md)."""
    assert not imports_torch_dynamo(
        "from tests.engine.test_packed import config, packed_records, with_train\n"
        "base = config('fedavg', 1)\n"
        "got = packed_records([base, with_train(base, lr=0.02)], rounds=1)\n"
        "assert not [r for r in got if isinstance(r, BaseException)], got")


def test_stacked_sgd_steps_each_client_as_torch_sgd_does_at_its_own_rate():
    g = torch.Generator().manual_seed(0)
    rates, decays = [0.1, 0.01, 0.05], [0.0, 1e-3, 5e-4]
    stack = torch.randn(3, 4, 5, generator=g, requires_grad=True)
    grads = [torch.randn(3, 4, 5, generator=g) for _ in range(3)]
    opt = StackedSGD([stack], torch.tensor(rates), torch.tensor(decays), momentum=0.9)
    alone = [stack[i].detach().clone().requires_grad_() for i in range(3)]
    refs = [torch.optim.SGD([a], lr=lr, momentum=0.9, weight_decay=wd) for a, lr, wd in zip(alone, rates, decays)]
    for grad in grads:
        stack.grad = grad.clone()
        opt.step()
        for i, (a, ref) in enumerate(zip(alone, refs)):
            a.grad = grad[i].clone()
            ref.step()
    for i in range(3):
        torch.testing.assert_close(stack[i], alone[i], rtol=1e-6, atol=1e-7)


class FailsInRound2(FedAvg):
    """FedAvg whose clients fail on receipt in round 2 (an error found late, in the run's own thread)."""

    def receive(self, ctx, part, state):
        if ctx.round == 2:
            raise ValueError("this run fails in round 2")
        super().receive(ctx, part, state)


def test_a_run_that_fails_leaves_its_pack_with_its_error_and_the_others_go_on():
    cfgs = [dataclasses.replace(config("fedavg", 1), seed=s) for s in (7, 8, 9)]
    got = packed_records(cfgs, recipes=[None, Recipe(FailsInRound2()), None])
    assert isinstance(got[1], ValueError) and "fails in round 2" in str(got[1])
    for cfg, run in ((cfgs[0], got[0]), (cfgs[2], got[2])):
        assert_close_trees(run, records(build_simulation(cfg), 3), METHODS["fedavg"][3])


def test_a_group_whose_steps_raise_is_trained_run_by_run_and_only_the_run_that_raises_fails(monkeypatch):
    cfgs = [dataclasses.replace(config("fedfa", 1), seed=s) for s in (7, 8)]
    sims: list[Any] = []
    original = worker_module.train_stacked

    def raising(group):
        if any(s.ctx.model is sims[1].fleet.worker.model for s in group):
            raise RuntimeError("the second run's steps raise")
        return original(group)

    monkeypatch.setattr(worker_module, "train_stacked", raising)

    def body(slot, cfg):
        sim = build_simulation(cfg, trainer=slot.train)
        sims.append(sim)
        return records(sim, 3)

    got = Pack().run([lambda slot, c=c: body(slot, c) for c in cfgs])
    assert isinstance(got[1], RuntimeError)
    # the first run trained alone from its streams as they were: what it computes grouped on its own
    alone = records(build_simulation(with_train(cfgs[0], group_clients=4)), 3)
    assert_close_trees(got[0], alone, {"rtol": 0, "atol": 0})


def test_server_rules_and_input_augmentations_share_one_batched_group(monkeypatch):
    """FedAvg, FedAvgM, FedBN and FedAvg + FedRDN take no part in the step's loss beyond the task's (their
    differences are on the server, in what a client receives and keeps, and in the input made per client): one
    pack, every round's 16 clients in one group, each run what it computes alone."""
    sizes: list[int] = []
    original = worker_module.train_stacked
    monkeypatch.setattr(worker_module, "train_stacked", lambda group: sizes.append(len(group)) or original(group))
    base = config("fedavg", 1).to_dict()
    methods = [{"base": "fedavg"}, {"base": "fedavgm"}, {"base": "fedbn"}, {"base": "fedavg", "augs": ["fedrdn"]}]
    cfgs = [validate({**base, "method": m}) for m in methods]
    got = packed_records(cfgs)
    assert sizes == [16, 16, 16]
    monkeypatch.undo()
    for cfg, run in zip(cfgs, got):
        assert_close_trees(run, records(build_simulation(cfg), 3), METHODS["fedavg"][3])


def test_runs_in_a_pack_record_their_execution_as_packed():
    """The summary's ``environment`` of each run of a pack (on the CPU: eager groups, data on the host)."""
    def environment(slot: Any, cfg: RunConfig) -> tuple[str, str]:
        sim = build_simulation(cfg, trainer=slot.train)
        records(sim, 1)
        env = sim._environment()
        return env["execution"], env["data"]

    cfgs = [dataclasses.replace(config("fedavg", 1, rounds=1), seed=s, device="cpu") for s in (7, 8)]
    assert Pack().run([lambda slot, c=c: environment(slot, c) for c in cfgs]) == [("packed", "host")] * 2
