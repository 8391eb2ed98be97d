"""CUDA graphs (``train.cuda_graph``, issue 39), the parts that run without CUDA.

:class:`~fedaug.engine.client.graphed.GraphedSteps` takes its capture as an argument; here it is
:class:`EagerReplay`, which "captures" a step by keeping the function and "replays" it by calling it,
so the whole path runs on the CPU: the static tensors a real graph reads at fixed addresses (the worker
model's parameters, the optimiser state reset in place, the components' captured tensors copied in,
the batch copied into each graph's input, the sums), the warm-up that is undone, the keying by batch
shape and learning rate. A step that read a stale or replaced tensor would give other numbers than
eager training, so the records must equal eager training's **bit for bit** (same kernels). What the
CPU cannot show, the capture itself and its replay on CUDA, is tests/gpu/test_cuda.py's.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fedaug.config.schema import TrainConfig, validate
from fedaug.core.errors import ConfigError
from fedaug.engine.client import graphed
from fedaug.engine.client.graphed import (GraphedSteps, copy_state_, graph_blocker, graph_blockers, graph_key,
                                   graphed_steps, reset_optimizer_state_)
from fedaug.engine.run import Simulation, build_simulation
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.base.feddyn import FedDyn
from fedaug.methods.recipe import Recipe
from tests.conftest import tiny_raw
from fedaug.methods.recipe import METHODS as METHODS_REGISTRY
from tests.engine.test_grouped import GROUPABLE, config, records


class EagerReplay:
    """A capture that keeps the step and runs it on every replay (the CPU's stand-in for a CUDA graph)."""

    def warm_up(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capture(self, body):
        return body

    def rng_state(self) -> Tensor:
        return torch.get_rng_state()


def graph(sim: Simulation, max_graphs: int = graphed.MAX_GRAPHS) -> GraphedSteps:
    """Train ``sim``'s clients by :class:`GraphedSteps` with :class:`EagerReplay`; returns it."""
    worker = sim.fleet.worker
    worker.graphs = GraphedSteps(worker.recipe, worker.model, worker.cfg.train, EagerReplay(), max_graphs)
    return worker.graphs


#: methods of issue 39's scope (and variants that exercise more of the static state), by config() name
SCOPE = ["fedavg", "fedbn", "fedprox", "scaffold", "fedavg_clip", "median", "fedadam"]


@pytest.mark.parametrize("method", SCOPE)
def test_graphed_steps_equal_eager_steps_bit_for_bit(method):
    want_sim = build_simulation(config(method, 1))
    want = records(want_sim, 3)
    sim = build_simulation(config(method, 1))
    steps = graph(sim)
    got = records(sim, 3)
    assert got == want  # every metric, loss term, norm and evaluation of every round
    for a, b in zip(*(list(graphed_leaves(s)) for s in (sim, want_sim)), strict=True):
        assert a[0] == b[0] and torch.equal(a[1], b[1]), a[0]  # final weights, server and client state
    assert steps.num_captures == 1  # one batch shape, one learning rate: captured once for 12 clients


def graphed_leaves(sim: Simulation):
    from tests.engine.test_grouped import leaves

    return ((p, torch.as_tensor(v)) for p, v in leaves({"server": sim.server, "clients": sim.client_states}))


def test_adam_partial_batches_and_a_learning_rate_schedule_each_get_their_own_graph():
    """Adam (its moments and step count reset in place per client); clients of 44 samples in batches of
    16 without drop_last (16, 16, 12); the learning rate halving every round."""
    train = dict(optimizer="adam", lr=0.01, local_steps=None, local_epochs=1, drop_last=False,
                 lr_schedule="exponential", lr_decay=0.5)
    raw = config("fedprox", 1, **train).to_dict()
    raw["data"]["options"].update(num_clients=4, samples_per_client=44)
    want = records(build_simulation(validate(raw)), 3)
    sim = build_simulation(validate(raw))
    steps = graph(sim)
    got = records(sim, 3)
    assert got == want
    sizes = {len(c.train) for c in sim.fleet.clients}
    shapes = {(16,)} | {(n % 16,) for n in sizes if n % 16 > 1}
    assert steps.num_captures == 3 * len(shapes)  # every batch shape, once per round's learning rate
    assert len(shapes) == 2, sizes  # the federation does give a partial batch


def test_graphs_over_the_limit_are_dropped_and_captured_again_with_the_same_numbers():
    raw = config("scaffold", 1, local_steps=None, local_epochs=1, drop_last=False).to_dict()
    raw["data"]["options"].update(num_clients=4, samples_per_client=44)
    want = records(build_simulation(validate(raw)), 2)
    sim = build_simulation(validate(raw))
    steps = graph(sim, max_graphs=1)
    assert records(sim, 2) == want
    assert len(steps.graphs) == 1
    assert steps.num_captures > 2  # full and partial batches took turns: captured again and again


def test_graph_key_is_the_batch_shape_and_the_learning_rate():
    x, y = torch.zeros(40, 3, 8, 8), torch.zeros(40, dtype=torch.long)
    assert graph_key(16, x, y, 0.05) == ((16, 3, 8, 8), (16,), 0.05)
    assert graph_key(8, x, y, 0.05) != graph_key(16, x, y, 0.05)  # a last partial batch
    assert graph_key(16, x, y, 0.025) != graph_key(16, x, y, 0.05)  # a scheduled learning rate
    seg = torch.zeros(40, 8, 8, dtype=torch.long)  # segmentation masks: the target shape counts too
    assert graph_key(16, x, seg, 0.05) == ((16, 3, 8, 8), (16, 8, 8), 0.05)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=5e-4),
    lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=5e-4),
], ids=["sgd", "adam"])
def test_an_optimiser_reset_in_place_steps_as_a_fresh_one(make):
    g = torch.Generator().manual_seed(0)
    start = torch.randn(5, 3, generator=g)
    grads = [torch.randn(5, 3, generator=g) for _ in range(3)]

    def run(opt: torch.optim.Optimizer, p: nn.Parameter) -> Tensor:
        with torch.no_grad():
            p.copy_(start)
        for grad in grads:
            p.grad = grad.clone()
            opt.step()
        return p.detach().clone()

    used = nn.Parameter(torch.zeros(5, 3))
    opt = make([used])
    run(opt, used)  # a previous client's steps leave momentum / moments and a step count
    before = [t.data_ptr() for s in opt.state.values() for t in s.values()]
    reset_optimizer_state_(opt)
    assert all(not t.any() for s in opt.state.values() for t in s.values())
    assert [t.data_ptr() for s in opt.state.values() for t in s.values()] == before  # in place
    fresh = nn.Parameter(torch.zeros(5, 3))
    assert torch.equal(run(opt, used), run(make([fresh]), fresh))  # bit for bit


def test_resetting_an_optimiser_without_state_leaves_it_without_state():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
    reset_optimizer_state_(opt)
    assert not opt.state


def test_copy_state_copies_in_place_and_names_another_structure():
    dst = {"fedprox": {"anchor": {"w": torch.zeros(2, 3)}}, "scaffold": {}}
    ptr = dst["fedprox"]["anchor"]["w"].data_ptr()
    copy_state_(dst, {"fedprox": {"anchor": {"w": torch.ones(2, 3)}}, "scaffold": {}})
    assert dst["fedprox"]["anchor"]["w"].data_ptr() == ptr and bool((dst["fedprox"]["anchor"]["w"] == 1).all())
    with pytest.raises(ValueError, match=r"^captured state/fedprox/anchor has keys \['b', 'w'\], the graph's copy "
                                         r"\['w'\]: a component's group_capture must give every client the same "
                                         r"structure$"):
        copy_state_(dst, {"fedprox": {"anchor": {"w": torch.ones(2, 3), "b": torch.ones(3)}}, "scaffold": {}})
    with pytest.raises(ValueError, match=r"^captured state/fedprox/anchor/w has shape \(3,\), the graph's copy "
                                         r"\(2, 3\): a component's group_capture must give every client the same "
                                         r"shapes$"):
        copy_state_(dst, {"fedprox": {"anchor": {"w": torch.ones(3)}}, "scaffold": {}})


def test_graph_blockers_add_the_components_that_draw_in_every_step():
    conv = nn.Sequential(nn.Conv2d(1, 4, 3))
    assert graph_blockers(Recipe(FedAvg(), [FedFA(kernel="off", at=["0"])]), conv) == [
        "'fedfa' (it draws random numbers in every step, which a captured step does not take yet)"]
    assert graph_blockers(Recipe(FedDyn(), []), nn.Sequential(nn.Conv2d(1, 4, 3), nn.Dropout(0.5))) == [
        "'feddyn' (it overrides receive, reply, loss_terms without a grouped form)",
        "the model (Sequential: its dropout draws from the global random stream)",
    ]
    assert graph_blockers(Recipe(FedAvg(), []), conv) == []


def test_exactly_the_groupable_components_that_draw_nothing_per_step_can_be_captured():
    import fedaug.methods.addon  # noqa: F401  (registers every component)
    import fedaug.methods.aug  # noqa: F401
    import fedaug.methods.objective  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # options that warn at their defaults
        capturable = [name for name in METHODS_REGISTRY.names() if not graph_blocker(METHODS_REGISTRY.get(name)())]
    assert capturable == [name for name in GROUPABLE if name != "fedfa"]


@pytest.fixture
def cuda_model(monkeypatch) -> None:
    """graphed_steps sees the worker model on CUDA (it then builds the real capture, which is not called)."""
    monkeypatch.setattr(graphed, "module_device", lambda model: torch.device("cuda", 0))


#: the notice of a recipe that cannot be captured (moon has no grouped forms; fedfa draws in every step)
NOTICE = ("train.cuda_graph=true: clients train eagerly, since 'moon' (it has no grouped form of its client hooks); "
          "'fedfa' (it draws random numbers in every step, which a captured step does not take yet) cannot be captured")


def test_a_recipe_that_cannot_be_captured_trains_eagerly_after_one_notice(cuda_model):
    raw = {**config("moon", 1, rounds=2).to_dict(), "method": {"base": "moon", "augs": ["fedfa"],
                                                              "options": {"fedfa": {"kernel": "off"}}}}
    want = records(build_simulation(validate(raw)), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = build_simulation(validate({**raw, "train": {**raw["train"], "cuda_graph": True}}))
        got = records(sim, 2)
    assert [str(w.message) for w in caught if "cuda_graph" in str(w.message)] == [NOTICE]
    assert sim.fleet.worker.graphs is None
    assert got == want  # today's engine, bit for bit


def test_a_recipe_in_scope_gets_graphed_steps_with_a_cuda_capture(cuda_model):
    raw = config("scaffold", 1).to_dict()
    sim = build_simulation(validate({**raw, "train": {**raw["train"], "cuda_graph": True}}))
    assert isinstance(sim.fleet.worker.graphs, GraphedSteps)
    assert isinstance(sim.fleet.worker.graphs.capture, graphed.CudaGraphs)
    assert graphed_steps(TrainConfig(), sim.recipe, sim.fleet.worker.model) is None  # off by default


def test_cuda_graph_on_a_device_that_auto_resolves_to_the_cpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("device = 'auto' resolves to CUDA on this machine")
    raw = tiny_raw(cuda_graph=True)
    with pytest.raises(ConfigError, match=r"^train\.cuda_graph=true captures CUDA graphs, but the model is on cpu: "
                                          r"set device='cuda' \(or 'auto' on a machine with CUDA\) or "
                                          r"train\.cuda_graph=false$"):
        build_simulation(validate(raw))


def test_a_step_that_draws_from_the_global_random_stream_is_refused_when_captured():
    sim = build_simulation(config("fedavg", 1, rounds=1))
    graph(sim)
    noisy = lambda module, inputs, out: out + 1e-3 * torch.randn_like(out)  # noqa: E731  (not a Dropout module)
    sim.fleet.worker.model.register_forward_hook(noisy)
    with pytest.raises(ConfigError, match=r"^train\.cuda_graph=true: a training step of this model draws from the "
                                          r"global random stream \(a random layer other than dropout\), which a "
                                          r"captured step would replay with other numbers; set "
                                          r"train\.cuda_graph=false$"):
        records(sim, 1)


@pytest.mark.parametrize(("changes", "message"), [
    ({"train": {"cuda_graph": 1}}, r"'train\.cuda_graph' must be true or false, got 1"),
    ({"device": "cpu"}, r"'train\.cuda_graph' = true captures CUDA graphs, got device = 'cpu': set device = 'cuda' "
                        r"or train\.cuda_graph = false"),
    ({"devices": ["cuda:0", "mps"]}, r"'train\.cuda_graph' = true captures CUDA graphs, got devices\[1\] = 'mps': "
                                     r"set devices\[1\] = 'cuda' or train\.cuda_graph = false"),
    ({"train": {"group_clients": 4}}, r"'train\.cuda_graph' = true captures one client's steps at a time, but "
                                      r"train\.group_clients = 4: set train\.group_clients = 1 or "
                                      r"train\.cuda_graph = false"),
    ({"precision": "bf16-mixed"}, r"'train\.cuda_graph' = true trains in float32 only, got precision = "
                                  r"'bf16-mixed': set precision = '32' or train\.cuda_graph = false"),
])
def test_bad_cuda_graph_settings_are_refused_naming_the_fix(changes: dict[str, Any], message: str):
    raw = tiny_raw(cuda_graph=True)
    raw.update({k: v for k, v in changes.items() if k != "train"})
    raw["train"].update(changes.get("train", {}))
    with pytest.raises(ConfigError, match=message):
        validate(raw)
