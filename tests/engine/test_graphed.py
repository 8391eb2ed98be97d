"""CUDA graphs (``train.cuda_graph``, issues 39 and 45), proven on the CPU.

:class:`~fedaug.engine.client.graphed.GraphedSteps` takes its capture as an argument; here it is
:class:`~fedaug.engine.client.capture.TracedCapture`, which gives a capture CUDA graphs' semantics on the CPU:
the step is traced once into its tensor operations and only those are replayed (Python runs at capture
alone), on the same tensors, and a host read cannot be captured. So the whole path runs: the static tensors a
real graph reads at fixed addresses (the worker model's parameters, the optimiser state reset in place, the
components' captured tensors copied in, each step's input and draws copied into the graph's, the sums), the
warm-up that is undone, the keying by input shapes and learning rate. A step that read a stale or replaced
tensor, or kept what it changes in a Python attribute, gives other numbers than eager training, so the
records must equal eager training's **bit for bit** (same kernels). The SCAFFOLD defect the first GPU run
found (issue 45) is kept here as a regression test: the old stand-in capture (:class:`EagerReplay`, which
re-ran the Python step on every "replay") could not see it, the emulation does. What the CPU cannot show,
CUDA's own kernels and capturable Adam, is tests/gpu/test_cuda.py's.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fedaug.config.schema import RunConfig, TrainConfig, choice_text, validate
from fedaug.core.errors import ConfigError
from fedaug.data.registry import load_dataset
from fedaug.engine.client import graphed
from fedaug.engine.client.capture import CudaGraphs, TracedCapture
from fedaug.engine.client.graphed import (GraphedSteps, copy_state_, graph_key, graphed_steps,
                                          reset_optimizer_state_)
from fedaug.engine.client.grouped_graphs import GroupGraphs
from fedaug.engine.client.step import StepInputs, step_blocker, step_blockers
from fedaug.engine.run import Simulation, build_simulation
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.base.feddyn import FedDyn
from fedaug.methods.base.scaffold import SCAFFOLD
from fedaug.methods.recipe import METHODS as METHODS_REGISTRY
from fedaug.methods.recipe import Recipe
from tests.conftest import tiny_raw
from tests.engine.test_grouped import GROUPABLE, config, records


class EagerReplay:
    """The stand-in capture before issue 45: it keeps the step and runs it, Python and all, on every replay
    (kept to show what it could not see)."""

    def warm_up(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capture(self, body):
        return body

    def rng_state(self) -> Tensor:
        return torch.get_rng_state()


def graph(sim: Simulation, max_graphs: int = graphed.MAX_GRAPHS, capture: Any = None) -> GraphedSteps:
    """Train ``sim``'s clients by :class:`GraphedSteps` with ``capture`` (default: the emulation,
    :class:`~fedaug.engine.client.capture.TracedCapture`); returns it."""
    worker = sim.fleet.worker
    worker.graphs = GraphedSteps(worker.recipe, worker.model, worker.cfg.train, capture or TracedCapture(), max_graphs)
    return worker.graphs


#: every capturable method (and variants that exercise more of the static state), by config() name: issue
#: 39's baselines, and the papers' methods FedFA (its noise drawn before each step and copied into the
#: graph), VFDA, FedRDN and FLea (issue 45; its buffer's size changes after round 1: new static tensors). Not FedFA with kernel = "on" on the CPU: the compiled C++ kernel
#: computes outside torch's dispatcher, where no trace sees it, and a CUDA graph never meets it (on CUDA,
#: "on" is the Triton kernel; tests/layers/test_triton_ffa.py traces that one).
SCOPE = ["fedavg", "fedbn", "fedprox", "scaffold", "fedavg_clip", "median", "fedadam", "fedfa", "vfda", "fedrdn",
         "flea"]


@pytest.mark.parametrize("method", SCOPE)
def test_graphed_steps_equal_eager_steps_bit_for_bit(method):
    _, steps = replays_equal(config(method, 1).to_dict(), graph)
    # one batch shape, one learning rate: captured once for 12 clients (FLea: again when its buffer fills)
    assert steps.num_captures == (2 if method == "flea" else 1)


def replays_equal(raw: dict[str, Any], install: Any) -> tuple[Simulation, Any]:
    """The run of config ``raw`` trained 3 rounds with its steps replayed (``install`` puts the captures on a
    simulation and returns them) equals it trained without, bit for bit: every record and the final states.
    Returns the simulation and its captures."""
    want_sim = build_simulation(validate(raw))
    want = records(want_sim, 3)
    sim = build_simulation(validate(raw))
    steps = install(sim)
    assert records(sim, 3) == want  # every metric, loss term, norm and evaluation of every round
    assert_same_state(sim, want_sim)
    return sim, steps


def assert_same_state(a: Simulation, b: Simulation) -> None:
    """The final weights, server and client states of two simulations, bit for bit."""
    for x, y in zip(graphed_leaves(a), graphed_leaves(b), strict=True):
        assert x[0] == y[0], x[0]
        assert torch.equal(x[1], y[1]) if isinstance(y[1], Tensor) else x[1] == y[1], x[0]


def graphed_leaves(sim: Simulation):
    from tests.engine.test_grouped import leaves

    return ((p, torch.as_tensor(v) if isinstance(v, (int, float)) else v)
            for p, v in leaves({"server": sim.server, "clients": sim.client_states}))


def test_partial_batches_and_a_learning_rate_schedule_each_get_their_own_graph():
    """Clients of 44 samples in batches of 16 without drop_last (16, 16, 12); the learning rate halving
    every round; SGD's momentum reset in place per client."""
    train = dict(lr=0.01, local_steps=None, local_epochs=1, drop_last=False, lr_schedule="exponential", lr_decay=0.5)
    raw = config("fedprox", 1, **train).to_dict()
    raw["data"]["options"].update(num_clients=4, samples_per_client=44)
    sim, steps = replays_equal(raw, graph)
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


def test_adam_on_the_cpu_reads_its_step_count_on_the_host_which_the_emulation_refuses():
    """torch.optim's Adam keeps its step count on the host except where it is capturable (CUDA); a CUDA graph
    could not capture that read, and neither does the emulation (tests/gpu covers capturable Adam)."""
    sim = build_simulation(config("fedavg", 1, rounds=1, optimizer="adam", lr=0.01))
    graph(sim)
    with pytest.raises(ConfigError, match=r"^train\.cuda_graph=true: a training step reads a tensor's value on the "
                                          r"host \(aten\._local_scalar_dense\.default\)"):
        records(sim, 1)


def test_graph_key_is_the_inputs_shapes_and_the_learning_rate():
    x, y = torch.zeros(16, 3, 8, 8), torch.zeros(16, dtype=torch.long)
    key = graph_key(StepInputs(x, y, {}), 0.05)
    assert key == (((16, 3, 8, 8), torch.float32), ((16,), torch.int64), 0.05)
    assert graph_key(StepInputs(x[:8], y[:8], {}), 0.05) != key  # a last partial batch
    assert graph_key(StepInputs(x, y, {}), 0.025) != key  # a scheduled learning rate
    seg = torch.zeros(16, 8, 8, dtype=torch.long)  # segmentation masks: the target shape counts too
    assert graph_key(StepInputs(x, seg, {}), 0.05)[1] == ((16, 8, 8), torch.int64)
    soft = torch.zeros(16, 4)  # soft labels (a mixing augmentation): another dtype
    assert graph_key(StepInputs(x, soft, {}), 0.05)[1] == ((16, 4), torch.float32)
    drawn = {"fedfa": {"0": {"use": True, "noise": torch.zeros(2, 16, 4)}}}  # a step's draws are inputs too
    assert graph_key(StepInputs(x, y, drawn), 0.05)[2:] == (((), torch.bool), ((2, 16, 4), torch.float32), 0.05)


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


def test_a_component_that_draws_in_every_step_can_be_captured():
    conv = nn.Sequential(nn.Conv2d(1, 4, 3))
    assert step_blockers(Recipe(FedAvg(), [FedFA(kernel="off", at=["0"])]), conv) == []
    assert step_blockers(Recipe(FedDyn(), []), nn.Sequential(nn.Conv2d(1, 4, 3), nn.Dropout(0.5))) == [
        "'feddyn' (it overrides receive, reply, loss_terms without a step form)",
        "the model (Sequential: its dropout draws from the global random stream)",
    ]


def test_exactly_the_groupable_components_can_be_captured():
    import fedaug.methods.addon  # noqa: F401  (registers every component)
    import fedaug.methods.aug  # noqa: F401
    import fedaug.methods.objective  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # options that warn at their defaults
        capturable = [name for name in METHODS_REGISTRY.names() if not step_blocker(METHODS_REGISTRY.get(name)())]
    assert capturable == GROUPABLE


@pytest.fixture
def cuda_model(monkeypatch) -> None:
    """graphed_steps sees the worker model on CUDA (it then builds the real capture, which is not called)."""
    monkeypatch.setattr(graphed, "module_device", lambda model: torch.device("cuda", 0))


#: the notice of a recipe that cannot be captured (moon has no step forms; fedfa could be), per train.cuda_graph
NOTICE = ("train.cuda_graph={}: clients train eagerly, since 'moon' (it has no grouped form of its client hooks) "
          "cannot be captured")


def with_train(raw: dict[str, Any], **train: Any) -> RunConfig:
    """``raw`` with ``train`` options changed, validated."""
    return validate({**raw, "train": {**raw["train"], **train}})


def cuda_graph_notices(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "cuda_graph" in str(w.message)]


@pytest.mark.parametrize("mode", [True, "auto"])
def test_a_recipe_that_cannot_be_captured_trains_eagerly_after_one_notice(cuda_model, mode):
    raw = {**config("moon", 1, rounds=2).to_dict(), "method": {"base": "moon", "augs": ["fedfa"],
                                                              "options": {"fedfa": {"kernel": "off"}}}}
    want = records(build_simulation(with_train(raw, cuda_graph=False)), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = build_simulation(with_train(raw, cuda_graph=mode))
        got = records(sim, 2)
    assert cuda_graph_notices(caught) == [NOTICE.format(choice_text(mode))]
    assert sim.fleet.worker.graphs is None and sim._environment()["execution"] == "eager"
    assert got == want  # today's engine, bit for bit


def test_auto_on_a_cuda_worker_captures_a_recipe_that_can_be_captured(cuda_model):
    raw = config("scaffold", 1).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no notice
        auto = build_simulation(validate(raw)).fleet.worker.graphs  # the default: train.cuda_graph = "auto"
    strict = build_simulation(with_train(raw, cuda_graph=True)).fleet.worker.graphs
    for graphs, is_strict in ((auto, False), (strict, True)):
        assert isinstance(graphs, GraphedSteps) and isinstance(graphs.capture, CudaGraphs)
        assert graphs.strict is is_strict
    assert graphed_steps(TrainConfig(cuda_graph=False), strict.recipe, strict.model) is None  # never


def test_auto_at_a_mixed_precision_on_a_cuda_worker_trains_eagerly_after_one_notice(cuda_model):
    raw = {**config("fedavg", 1).to_dict(), "precision": "bf16-mixed"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = build_simulation(validate(raw))
    assert sim.fleet.worker.graphs is None
    assert cuda_graph_notices(caught) == ["train.cuda_graph=auto: clients train eagerly, since a step at precision "
                                          "'bf16-mixed' (captured steps train in float32) cannot be captured"]


def test_auto_with_grouped_clients_leaves_the_reasons_to_the_grouping_notice(cuda_model):
    raw = {**config("moon", 2).to_dict(), "method": {"base": "moon"}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = build_simulation(validate(raw))
    assert sim.fleet.worker.graphs is None and sim.fleet.group_size == 1
    assert [str(w.message) for w in caught if "train." in str(w.message)] == [
        "train.group_clients=2: clients train one at a time, since 'moon' (it has no grouped form of its client "
        "hooks) cannot train grouped"]


@pytest.mark.parametrize(("group", "packed", "execution"), [
    (1, False, "captured"), (2, False, "grouped captured"), (1, True, "packed captured")])
def test_the_summary_records_the_execution_that_ran(cuda_model, group, packed, execution):
    trainer = (lambda worker, r, lr, jobs: []) if packed else None  # a pack's slot (never called here)
    sim = build_simulation(config("fedavg", group), trainer=trainer)
    assert sim._environment()["execution"] == execution
    assert isinstance(sim.fleet.worker.group_graphs, GroupGraphs)


@pytest.mark.parametrize(("group", "execution"), [(1, "eager"), (2, "grouped")])
def test_auto_on_the_cpu_trains_eagerly_without_a_notice_as_false_does(group, execution):
    raw = config("fedavg", group, rounds=2).to_dict()
    want = records(build_simulation(with_train(raw, cuda_graph=False)), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim = build_simulation(validate(raw))
        assert sim.cfg.train.cuda_graph == "auto" and sim.fleet.worker.graphs is None
        assert records(sim, 2) == want
    assert sim._environment()["execution"] == execution and sim._environment()["data"] == "host"


def test_cuda_graph_on_a_device_that_auto_resolves_to_the_cpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("device = 'auto' resolves to CUDA on this machine")
    raw = tiny_raw(cuda_graph=True)
    with pytest.raises(ConfigError, match=r"^train\.cuda_graph=true captures CUDA graphs, but the model is on cpu: "
                                          r"set device='cuda' \(or 'auto' on a machine with CUDA\) or "
                                          r"train\.cuda_graph=false$"):
        build_simulation(validate(raw))


def noisy(module: nn.Module, inputs: Any, out: Tensor) -> Tensor:
    """A forward hook that draws from the global random stream in training (not a Dropout module, so no blocker sees
    it); in evaluation, which draws from no seeded stream, it is the identity."""
    return out + 1e-3 * torch.randn_like(out) if module.training else out


def test_a_step_that_draws_from_the_global_random_stream_is_refused_when_captured():
    sim = build_simulation(config("fedavg", 1, rounds=1))
    graph(sim)
    sim.fleet.worker.model.register_forward_hook(noisy)
    with pytest.raises(ConfigError, match=r"^train\.cuda_graph=true: a training step of this model draws from the "
                                          r"global random stream \(a random layer other than dropout\), which a "
                                          r"captured step would replay with other numbers; set "
                                          r"train\.cuda_graph=false$"):
        records(sim, 1)


def test_auto_trains_eagerly_from_a_step_refused_when_first_captured_after_one_notice():
    """``"auto"``'s graphs (not strict): the refused capture is undone (the warm-up's weights and draws), the client
    goes on with eager steps and every later client trains eagerly: the records of eager training, bit for bit."""
    def noisy_sim() -> Simulation:
        sim = build_simulation(config("fedavg", 1, rounds=2))
        sim.fleet.worker.model.register_forward_hook(noisy)
        return sim

    want = records(noisy_sim(), 2)
    sim = noisy_sim()
    worker = sim.fleet.worker
    worker.graphs = GraphedSteps(worker.recipe, worker.model, worker.cfg.train, TracedCapture(), strict=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = records(sim, 2)
    assert cuda_graph_notices(caught) == [
        "train.cuda_graph=auto: clients train eagerly, since a training step of this model draws from the global "
        "random stream (a random layer other than dropout), which a captured step would replay with other numbers"]
    assert worker.graphs is None and worker.group_graphs is None and sim._environment()["execution"] == "eager"
    assert got == want


@pytest.mark.parametrize(("changes", "message"), [
    ({"train": {"cuda_graph": 1}}, r"'train\.cuda_graph' must be one of true, false, auto, got 1"),
    ({"train": {"cuda_graph": "on"}}, r"'train\.cuda_graph' must be one of true, false, auto, got 'on'"),
    ({"device": "cpu"}, r"'train\.cuda_graph' = true captures CUDA graphs, got device = 'cpu': set device = 'cuda' "
                        r"or train\.cuda_graph = false"),
    ({"devices": ["cuda:0", "mps"]}, r"'train\.cuda_graph' = true captures CUDA graphs, got devices\[1\] = 'mps': "
                                     r"set devices\[1\] = 'cuda' or train\.cuda_graph = false"),
    ({"precision": "bf16-mixed"}, r"'train\.cuda_graph' = true trains in float32 only, got precision = "
                                  r"'bf16-mixed': set precision = '32' \(or 'tf32'\) or train\.cuda_graph = false"),
])
def test_bad_cuda_graph_settings_are_refused_naming_the_fix(changes: dict[str, Any], message: str):
    raw = tiny_raw(cuda_graph=True)
    raw.update({k: v for k, v in changes.items() if k != "train"})
    raw["train"].update(changes.get("train", {}))
    with pytest.raises(ConfigError, match=message):
        validate(raw)


class PythonMomentumScaffold(SCAFFOLD):
    """SCAFFOLD as it was before issue 45: the local momentum read off the optimiser in the first step's
    gradient hook and kept in a Python attribute, which a replayed step never sets again (each later client's
    control variate then takes the normaliser of plain SGD)."""

    name = "scaffold"

    def receive(self, ctx, part, state) -> None:
        super().receive(ctx, part, state)
        if ctx.training:
            self._momentum = None

    def group_before_step(self, grads, captured, optimizer) -> None:
        if self._momentum is None:
            self._momentum = float(optimizer.param_groups[0]["momentum"])
        super().group_before_step(grads, captured, optimizer)

    def reply(self, ctx):
        if ctx.training:
            self._momentum = self._momentum or 0.0
        return super().reply(ctx)


def scaffold_sim(component: SCAFFOLD) -> Simulation:
    cfg = config("scaffold", 1, rounds=2)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    return Simulation(cfg, data, Recipe(component))


def test_the_emulation_sees_state_kept_in_a_python_attribute_which_the_old_stand_in_did_not():
    """The CUDA-graphed SCAFFOLD defect (issue 45: round 2 test loss 1.332065 graphed, 1.332281 eager on an
    H100). With momentum 0.9, a wrong normaliser moves every control variate, so the records differ."""
    want = records(scaffold_sim(PythonMomentumScaffold()), 2)
    assert want == records(scaffold_sim(SCAFFOLD()), 2)  # eagerly, the old form was right
    old_stand_in = scaffold_sim(PythonMomentumScaffold())
    graph(old_stand_in, capture=EagerReplay())
    assert records(old_stand_in, 2) == want  # the stand-in re-ran the Python hook: it could not see the defect
    emulated = scaffold_sim(PythonMomentumScaffold())
    graph(emulated, capture=TracedCapture())
    got = records(emulated, 2)
    assert got[0]["train"] == want[0]["train"]  # the first client's round is right (captured with it) ...
    assert got[1]["eval"] != want[1]["eval"]  # ... the later clients' variates are not: round 2 moves
    fixed = scaffold_sim(SCAFFOLD())
    graph(fixed, capture=TracedCapture())
    assert records(fixed, 2) == want  # the momentum known at receive, from the training options


def test_a_traced_capture_computes_nothing_and_its_replay_runs_only_the_recorded_operations():
    w = torch.ones(3)
    calls = []

    def body() -> None:
        calls.append(1)  # Python: runs when the step is traced, never on replay
        w.mul_(2.0).add_(1.0)

    replay = TracedCapture().capture(body)
    assert calls == [1] and torch.equal(w, torch.ones(3))  # traced, and what it wrote undone
    replay()
    replay()
    assert calls == [1] and torch.equal(w, torch.full((3,), 7.0))  # (1 * 2 + 1) * 2 + 1, on the same tensor


def test_a_traced_capture_refuses_a_step_that_reads_a_tensor_on_the_host():
    w = torch.ones(3)

    def body() -> None:
        if w.sum() > 0:  # a branch on a tensor: a CUDA graph cannot capture it
            w.add_(1.0)

    with pytest.raises(ConfigError, match=r"a training step reads a tensor.s value on the host \(aten\.(_local_scalar_dense|is_nonzero)"):
        TracedCapture().capture(body)
    assert torch.equal(w, torch.ones(3))


@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_the_triton_path_is_captured_and_replayed_with_new_draws_bit_for_bit(aug):
    """FedFA and VFDA on the Triton kernel (kernel = "triton", under Triton's interpreter here): the kernel draws
    from each client's seed and a step counter on the device, so a captured step replays with new draws and the
    records equal eager steps' bit for bit."""
    from tests.engine.test_grouped import triton_config

    want = records(build_simulation(triton_config(aug, 1)), 2)
    sim = build_simulation(triton_config(aug, 1))
    steps = graph(sim)
    assert records(sim, 2) == want
    assert steps.num_captures == 1
