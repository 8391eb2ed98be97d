"""CUDA runs against CPU runs, deterministic CUDA runs, and resume on CUDA (issue 17, Must show 2).

CUDA random streams are CUDA generators (:mod:`fedaug.core.rng`): with the same seeds they draw
other numbers than the CPU's, so a CUDA run and a CPU run of a method that draws (batch order,
augmentation noise) are two samples of the same experiment, not the same numbers. Hence two
tolerances:

* :data:`EXACT_RTOL`: methods trained full-batch (one batch of all of a client's samples per step:
  the batch order cannot matter) and without random augmentation (fedavg, fedbn, scaffold, moon):
  every loss and accuracy within 1e-3 relative (float32 kernels sum in another order; cuDNN
  convolutions may use TF32-free but differently blocked algorithms);
* :data:`SAMPLE_RTOL`: the augmentations (fedfa, vfda in 3D, fedrdn, flea), whose draws differ:
  training losses within 15 % relative after 2 rounds, and every exact field (sampled clients,
  steps, bytes of every message part, per-client state bytes) equal.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.payload import FUSED_MAX, Against, TensorSpec, validate_part, value_extremes
from fedaug.core.runtime import deterministic_algorithms
from fedaug.engine.run import Simulation, build_simulation, resume_experiment, run_experiment
from fedaug.layers.functional import StatNoise, restyle
from fedaug.methods.recipe import build_recipe
from tests.conftest import tiny_raw
from tests.engine.toyseg import toy_segmentation
from tests.engine.test_resume import interrupted, summary_numbers

EXACT_RTOL = 1e-3
SAMPLE_RTOL = 0.15
DETERMINISTIC = ("fedavg", "fedbn", "scaffold", "moon")
AUGMENTED = ("fedfa", "fedrdn", "flea")


def raw_for(name: str, device: str, **top: Any) -> dict[str, Any]:
    raw = tiny_raw(rounds=2, participation=0.67)
    if name in DETERMINISTIC:
        raw["train"]["batch_size"] = 64  # full batch: the shuffle order cannot change a step
    base, augs = (name, []) if name in ("fedavg", "fedbn", "scaffold") else ("fedavg", [name])
    options = {name: {"kernel": "off"}} if name in ("fedfa", "vfda") else {}
    raw["method"] = {"base": base, "augs": augs, "options": options}
    raw.update(device=device, **top)
    return raw


def records(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Two rounds' records (times left out), under the config's deterministic setting as ``run`` applies it."""
    cfg = validate(raw)
    sim = build_simulation(cfg)
    out = []
    with deterministic_algorithms(cfg.deterministic):
        for r in range(1, 3):
            rec = sim.run_round(r)
            rec["eval"] = sim.evaluate()
            rec.pop("time")
            out.append(json.loads(json.dumps(rec)))
    return out


def exact_fields(rec: dict[str, Any]) -> dict[str, Any]:
    return {"sampled": rec["sampled"], "comm": rec["comm"], "client_state": rec["client_state"],
            "steps": {c: m["steps"] for c, m in rec["train"]["clients"].items()},
            "eval_comm": rec["eval"]["comm"]}


def assert_close(cpu: list[dict[str, Any]], cuda: list[dict[str, Any]], rtol: float, evaluation: bool) -> None:
    for a, b in zip(cpu, cuda, strict=True):
        assert exact_fields(a) == exact_fields(b)
        assert b["train"]["loss"] == pytest.approx(a["train"]["loss"], rel=rtol)
        if evaluation:
            assert b["eval"]["mean"] == pytest.approx(a["eval"]["mean"], rel=rtol, abs=rtol)


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_cuda_equals_cpu_within_float_tolerance(name: str) -> None:
    assert_close(records(raw_for(name, "cpu")), records(raw_for(name, "cuda")), EXACT_RTOL, evaluation=True)


@pytest.mark.parametrize("name", AUGMENTED)
def test_cuda_augmentations_match_cpu_in_distribution(name: str) -> None:
    assert_close(records(raw_for(name, "cpu")), records(raw_for(name, "cuda")), SAMPLE_RTOL, evaluation=False)


def vfda_3d(device: str, **train: Any) -> Simulation:
    """VFDA on a small 3D U-Net over synthetic 16^3 volumes (tests/engine/toyseg.py: no data set needed)."""
    raw = {"seed": 1, "device": device, "model": {"name": "unet3d", "options": {"features": [4, 8]}},
           "method": {"base": "fedavg", "augs": ["vfda"], "options": {"vfda": {"kernel": "off"}}},
           "train": {"rounds": 2, "local_steps": 2, "batch_size": 4, "lr": 0.01, **train}, "eval": {"every": 1}}
    return Simulation(validate(raw), toy_segmentation(3, dims=3), build_recipe("fedavg", ["vfda"],
                                                                                  raw["method"]["options"]))


def sim_records(sim: Simulation, rounds: int = 2) -> list[dict[str, Any]]:
    out = []
    for r in range(1, rounds + 1):
        rec = sim.run_round(r)
        rec["eval"] = sim.evaluate()
        rec.pop("time")
        out.append(json.loads(json.dumps(rec)))
    return out


def test_vfda_3d_on_cuda_matches_cpu_in_distribution() -> None:
    """VFDA on the 3D U-Net, CUDA against the CPU (their streams differ: in distribution)."""
    assert_close(sim_records(vfda_3d("cpu")), sim_records(vfda_3d("cuda")), SAMPLE_RTOL, evaluation=False)


def test_vfda_3d_grouped_on_cuda_equals_one_at_a_time_on_cuda() -> None:
    """The 3D U-Net and VFDA's layers under vmap on the GPU, within the CPU's bound (true float32: no TF32)."""
    from tests.engine.test_grouped import METHODS, assert_close_trees

    one, grouped = vfda_3d("cuda"), vfda_3d("cuda", group_clients=3)
    assert_close_trees(sim_records(grouped), sim_records(one), METHODS["vfda"][3])


def test_float32_means_no_tf32_and_tf32_is_asked_for_by_name() -> None:
    """The precision contract on the GPU (issue 45): under ``"32"`` a convolution and a matrix product equal
    their float64 values to float32 rounding; under ``"tf32"`` (10-bit mantissa products) they do not."""
    from fedaug.core.device import float32_math

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8, 64, 32, 32, device="cuda", generator=g)
    w = torch.randn(64, 64, 3, 3, device="cuda", generator=g)
    a, b = torch.randn(512, 512, device="cuda", generator=g), torch.randn(512, 512, device="cuda", generator=g)
    conv64 = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    mm64 = a.double() @ b.double()

    def errors(precision: str) -> tuple[float, float]:
        with float32_math(precision):
            conv = torch.nn.functional.conv2d(x, w, padding=1)
            mm = a @ b
        return (float(((conv.double() - conv64).abs().max() / conv64.abs().max())),
                float(((mm.double() - mm64).abs().max() / mm64.abs().max())))

    exact, tf32 = errors("32"), errors("tf32")
    assert max(exact) < 1e-5, exact
    if torch.cuda.get_device_capability()[0] >= 8:  # TF32 exists from Ampere on
        assert min(tf32) > 1e-4, tf32


#: a model whose CUDA backward has deterministic kernels (docs/engine.md)
DETERMINISTIC_MODEL = {"name": "digit_model", "options": {"input_size": 8}}


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("spatial", [(3, 5), (9, 10)])  # 15 < 64 <= 90 positions: both moment paths
def test_restyle_on_cuda_equals_the_cpu_for_the_same_noise(dtype: torch.dtype, tol: float, spatial) -> None:
    """FedFA Eq. 8 with Eq. 3/7/9's resampling, forward and backward, on CUDA against the CPU: the
    ATen batch-norm kernels :func:`restyle` runs on differ per device, the maths must not."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, *spatial, generator=g, dtype=dtype) * 3 + 1
    noise, mult = torch.randn(2, 6, 4, generator=g, dtype=dtype), torch.rand(2, 4, generator=g, dtype=dtype) + 1
    gy = torch.randn(x.shape, generator=g, dtype=dtype)
    out = {}
    for device in ("cpu", "cuda"):
        xd = x.to(device).requires_grad_()
        y, mu, sigma = restyle(xd, StatNoise(noise.to(device), mult=mult.to(device)))
        (gx,) = torch.autograd.grad(y, xd, gy.to(device))
        out[device] = [t.detach().cpu() for t in (y, mu, sigma, gx)]
    for a, b in zip(out["cpu"], out["cuda"], strict=True):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, tol, shape", [
    (torch.float64, 1e-10, (6, 4, 15)), (torch.float64, 1e-10, (2, 3, 4, 4, 5)),  # 1D, 3D
    (torch.float32, 2e-5, (3, 4, 9, 10)), (torch.float32, 2e-5, (2, 2, 2100)),  # 2D, a row longer than a block
])  # fmt: skip  (few shapes and dtypes: each combination compiles its own kernels)
def test_triton_kernel_on_cuda_equals_the_pytorch_path(dtype: torch.dtype, tol: float, shape) -> None:
    """``kernel="on"`` on CUDA runs the Triton kernel (fedaug.layers.triton_op, compiled here; CI runs it
    under Triton's interpreter, tests/layers/test_triton_ffa.py) on given noise: forward, statistics and input gradient
    equal the pure-PyTorch path on the same device, for fixed scales (FedFA-R), FedFA's std scale with
    the public code's estimators, and VFDA's variance scale."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g, dtype=dtype) * 3 + 1).cuda()
    noise = torch.randn(2, *shape[:2], generator=g, dtype=dtype).cuda()
    param = (torch.rand(2, shape[1], generator=g, dtype=dtype) + 0.5).cuda()
    gy = torch.randn(shape, generator=g, dtype=dtype).cuda()
    maps = [(StatNoise(noise, scale=param), False), (StatNoise(noise, mult=param, correction=1, extra=1e-6), True),
            (StatNoise(noise, mult=param, noise_scale="variance"), False)]
    for sn, unbiased in maps:
        out = {}
        for mode in ("on", "off"):
            xd = x.clone().requires_grad_()
            y, mu, sigma = restyle(xd, sn, unbiased=unbiased, kernel=mode)
            assert (y.grad_fn.next_functions[0][0].name() == "_FFABackward") == (mode == "on")  # under a squeeze
            (gx,) = torch.autograd.grad(y, xd, gy)
            out[mode] = [t.detach() for t in (y, mu, sigma, gx)]
        for a, b in zip(out["on"], out["off"], strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_fedfa_on_the_triton_path_is_deterministic_and_trains_like_the_pytorch_path() -> None:
    """A FedFA run on CUDA with ``kernel = "on"``, the Triton path, whose kernel draws the coin and noise
    itself (Philox, issue 46), against ``"off"`` (torch's CUDA generators): two samples of the same
    experiment (:data:`SAMPLE_RTOL`); two ``"on"`` runs are identical."""
    on = raw_for("fedfa", "cuda", deterministic=True)  # cuDNN's own kernels deterministic too
    on["method"]["options"]["fedfa"]["kernel"] = "on"
    first = records(on)
    assert records(on) == first
    assert_close(records(raw_for("fedfa", "cuda")), first, SAMPLE_RTOL, evaluation=False)


@pytest.mark.parametrize("shape", [(32, 32, 14, 14), (8, 16, 64, 64)])
def test_ffa_on_the_triton_path_launches_no_more_kernels_than_instance_norm(shape) -> None:
    """Issue 46: per layer and training step, FFALayer(kernel="on") on CUDA launches one kernel forward and
    one backward (coin, noise and running statistics inside), no more than nn.InstanceNorm2d, and
    synchronises with the host nowhere (``torch.cuda.set_sync_debug_mode("error")``)."""
    from benchmarks.bench_ffa import kernels_per_step
    from fedaug.layers import FFALayer

    device = torch.device("cuda")
    x = torch.randn(shape, device=device, requires_grad=True)
    ffa = FFALayer(shape[1], p=0.5, kernel="on").cuda()
    ffa.set_stream(3)
    ffa_names = kernels_per_step(ffa, device, shape)
    torch.cuda.set_sync_debug_mode("error")  # a host read in the layer raises
    try:
        for _ in range(3):
            torch.autograd.grad(ffa(x), x, torch.ones_like(x))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    norm_names = kernels_per_step(torch.nn.InstanceNorm2d(shape[1]).cuda(), device, shape)
    print(f"{shape}: FFA {ffa_names}; InstanceNorm {norm_names}")
    assert ffa_names == ["_ffa_forward", "_ffa_backward"]
    assert len(ffa_names) <= len(norm_names)


def test_a_cuda_graph_of_a_step_with_ffa_layers_replays_as_eager_steps() -> None:
    """Issue 46, Must show 4 on a GPU: a whole SGD step of a model with two FFA layers on the Triton path,
    captured once in a CUDA graph and replayed 3 times, gives 3 eager steps' losses, weights and layer
    states (offsets exactly: each replay drew anew) within :data:`GRAPH_TOL`."""
    from tests.layers.test_triton_op import model_with_ffa, sgd_step

    net = model_with_ffa()
    step = sgd_step(net)
    x = torch.randn(4, 1, 6, 6, device="cuda")
    target = torch.tensor([0, 1, 0, 1], device="cuda")

    def state():
        return ({k: v.detach().clone().requires_grad_() for k, v in net.named_parameters()},
                {k: v.clone() for k, v in net.named_buffers()})

    warm, captured, eager = state(), state(), state()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(*warm, x, target)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step(*captured, x, target)
    replayed, stepped = [], []
    for _ in range(3):
        graph.replay()
        replayed.append(loss.clone())
        stepped.append(step(*eager, x, target))
    torch.testing.assert_close(torch.stack(replayed), torch.stack(stepped), **GRAPH_TOL)
    for k in eager[0]:
        torch.testing.assert_close(captured[0][k], eager[0][k], **GRAPH_TOL)
    for k in eager[1]:
        torch.testing.assert_close(captured[1][k], eager[1][k], **GRAPH_TOL)
    assert captured[1]["1.offset"].item() == eager[1]["1.offset"].item() == 3 * 2


def test_message_extremes_on_cuda_equal_the_cpus() -> None:
    """The fused reading of a message's value ranges (the CUDA default) against the CPU's per-tensor one,
    NaN and inf of either sign included."""
    g = torch.Generator().manual_seed(0)
    part = {f"w{i}": torch.randn(i + 1, 7, generator=g) * 100 for i in range(40)}
    part.update(half=torch.randn(5, generator=g).bfloat16(), count=torch.tensor(3), flag=torch.tensor([True]),
                big=torch.randn(FUSED_MAX + 5, generator=g), big_bad=torch.randn(FUSED_MAX, generator=g))
    for name, bad in (("w3", math.nan), ("w7", math.inf), ("w11", -math.inf)):
        part[name][0, 2] = bad
    part["big_bad"][-1] = math.inf  # read alone (not fused), as every tensor of FUSED_MAX values or more
    cpu = value_extremes(part)
    cuda = value_extremes({k: v.cuda() for k, v in part.items()})
    assert cuda.keys() == cpu.keys()
    for name in cpu:
        assert cuda[name] == pytest.approx(cpu[name], nan_ok=True), name
    assert all(math.isnan(cuda[n][0]) for n in ("w3", "w7", "w11", "big_bad"))


@pytest.mark.parametrize("name", ["fedavg", "fedfa", "flea"])
def test_deterministic_cuda_runs_are_identical(name: str) -> None:
    raw = raw_for(name, "cuda", deterministic=True, model=DETERMINISTIC_MODEL)
    assert records(raw) == records(raw)


def test_deterministic_cuda_names_an_operation_without_a_deterministic_kernel() -> None:
    """alexnet_bn pools to 6x6 (a 64x64 input leaves 1x1 maps): AdaptiveAvgPool2d's CUDA backward has no
    deterministic kernel. (Pooling to 1x1, as small_cnn does, is a mean in ATen and deterministic.)"""
    raw = raw_for("fedavg", "cuda", deterministic=True, model={"name": "alexnet_bn", "options": {"hidden": 16}})
    raw["data"]["options"]["size"] = 64
    with pytest.raises(RuntimeError, match="adaptive_avg_pool2d"):
        records(raw)


def test_resume_on_cuda_equals_an_uninterrupted_run(tmp_path) -> None:
    """A deterministic CUDA run cut after round 1 (as a kill leaves it) resumes to the uninterrupted numbers."""
    raw = raw_for("scaffold", "cuda", deterministic=True, model=DETERMINISTIC_MODEL)
    full, part = interrupted(tmp_path, raw, 1)
    resumed, _ = resume_experiment(str(part), quiet=True)
    assert summary_numbers(part) == summary_numbers(full)
    assert resumed["environment"]["device"].startswith("cuda")


def test_checkpoint_written_on_cuda_loads_on_the_cpu(tmp_path) -> None:
    raw = raw_for("fedavg", "cuda")
    raw["out_dir"] = str(tmp_path)
    _, run_dir = run_experiment(validate(raw), quiet=True)
    payload = run_dir.load_latest()
    assert all(t.device.type == "cpu" for t in payload["server"]["fedavg"]["weights"].values())
    cpu = build_simulation(validate({**raw, "device": "cpu"}))
    with pytest.warns(UserWarning, match=r"device 'cuda(:0)?' -> 'cpu'"):
        cpu.restore(payload)
    assert next(iter(cpu.server["fedavg"]["weights"].values())).device == torch.device("cpu")


#: the methods of the grouped and captured tests on CUDA: the baselines with a fast form and the papers'
#: methods (FedFA on both kernels: "on" is the Triton kernel on CUDA; VFDA; FedRDN)
FAST = ["fedavg", "fedbn", "fedprox", "scaffold", "fedfa", "fedfa_kernel", "vfda", "fedrdn"]


@pytest.mark.parametrize("name", FAST)
def test_grouped_clients_on_cuda_equal_one_at_a_time_on_cuda(name: str) -> None:
    """``train.group_clients`` on CUDA (issues 39, 45): the same draws as one at a time on CUDA (both use the
    clients' CUDA streams), so every record value and the final server state agree up to float rounding,
    within the CPU test's bound for the method (true float32 on both sides: no TF32)."""
    from tests.engine.test_grouped import METHODS, assert_close_trees, config
    from tests.engine.test_grouped import records as grouped_records

    sims = [build_simulation(validate({**config(name, g, cuda_graph=False).to_dict(), "device": "cuda"}))
            for g in (1, 4)]  # eager steps on both sides ("auto", the default, would capture both)
    one, grouped = (grouped_records(sim, 3) for sim in sims)
    tol = METHODS[name][3]
    assert_close_trees(grouped, one, tol)
    assert_close_trees(sims[1].server, sims[0].server, tol)


@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_triton_path_grouped_on_cuda_equals_one_at_a_time_on_cuda(aug: str) -> None:
    """FedFA and VFDA with ``kernel = "on"`` on CUDA (the Triton path) train grouped (issue 46): each client's
    draws come from its own seed and offset, so grouped equals one at a time up to float rounding (the CPU
    test's bound, true float32 on both sides)."""
    from tests.engine.test_grouped import assert_close_trees, triton_config
    from tests.engine.test_grouped import records as grouped_records

    def cfg(group: int) -> dict[str, Any]:
        raw = triton_config(aug, group).to_dict()
        raw["method"]["options"][aug]["kernel"] = "on"
        raw["train"]["cuda_graph"] = False  # eager steps on both sides ("auto", the default, would capture both)
        return {**raw, "device": "cuda"}

    sims = [build_simulation(validate(cfg(g))) for g in (1, 4)]
    assert sims[1].fleet.group_size == 4
    one, grouped = (grouped_records(sim, 2) for sim in sims)
    tol = {"rtol": 2e-5, "atol": 2e-6}
    assert_close_trees(grouped, one, tol)
    assert_close_trees(sims[1].server, sims[0].server, tol)


#: train.cuda_graph against eager steps on the same GPU (issues 39, 45), both with deterministic kernels. A replay
#: runs the kernels the capture recorded, which are eager training's (a zeroed momentum buffer's first step equals
#: a fresh one's; Adam is capturable in eager steps on CUDA too), so the numbers are expected to be the same; the
#: bound allows for cuBLAS or cuDNN choosing another algorithm under capture. Without deterministic kernels two
#: eager runs differ already (cuDNN's weight gradients sum with atomics): on an H100 that put FedFA's
#: client-sharing sigma (a spread across clients, which magnifies relative error) 1.4e-5 apart, and one Adam
#: weight 2.8e-6.
GRAPH_TOL = {"rtol": 1e-5, "atol": 1e-6}


def graphed_pair(raw: dict[str, Any], rounds: int) -> tuple[list[Any], list[Any], Any, Any]:
    """Eager and graphed records of ``raw`` on CUDA, and the two simulations."""
    from tests.engine.test_grouped import records as grouped_records

    sims = [build_simulation(validate({**raw, "device": "cuda", "deterministic": True,
                                       "train": {**raw["train"], "cuda_graph": g}})) for g in (False, True)]
    assert sims[0].fleet.worker.graphs is None and sims[1].fleet.worker.graphs is not None
    with deterministic_algorithms(True):
        eager, graphed = (grouped_records(sim, rounds) for sim in sims)
    return eager, graphed, sims[0], sims[1]


@pytest.mark.parametrize("name", FAST)
def test_cuda_graph_steps_equal_eager_steps_on_cuda(name: str) -> None:
    """``train.cuda_graph`` (issue 39): every record value, the final server state and the client states
    of 3 rounds of 4 clients (3 SGD steps with momentum each) within :data:`GRAPH_TOL` of eager steps on
    the same GPU, from one captured graph, under deterministic kernels (GRAPH_TOL)."""
    from tests.engine.test_grouped import assert_close_trees, config

    eager, graphed, one, cap = graphed_pair(config(name, 1).to_dict(), 3)
    assert cap.fleet.worker.graphs.num_captures == 1
    assert_close_trees(graphed, eager, GRAPH_TOL)
    assert_close_trees(cap.server, one.server, GRAPH_TOL)
    assert_close_trees(cap.client_states, one.client_states, GRAPH_TOL)


def test_cuda_graph_with_adam_partial_batches_and_a_schedule_equals_eager_steps_on_cuda() -> None:
    """FedProx with Adam (capturable on CUDA, eager and graphed), a last partial batch (44 samples in batches of
    16) and a halving learning rate: a graph per batch shape and round, within :data:`GRAPH_TOL`."""
    from tests.engine.test_grouped import assert_close_trees, config

    raw = config("fedprox", 1, optimizer="adam", lr=0.01, local_steps=None, local_epochs=1, drop_last=False,
                 lr_schedule="exponential", lr_decay=0.5).to_dict()
    raw["data"]["options"].update(num_clients=4, samples_per_client=44)
    eager, graphed, one, cap = graphed_pair(raw, 3)
    assert cap.fleet.worker.graphs.num_captures == 6  # (16, 12) x 3 learning rates
    assert_close_trees(graphed, eager, GRAPH_TOL)
    assert_close_trees(cap.server, one.server, GRAPH_TOL)


def test_auto_captures_on_cuda_what_can_be_captured_and_records_which_execution_ran() -> None:
    """``train.cuda_graph = "auto"`` and ``data.on_device = "auto"``, the defaults (issue 63), on CUDA: FedAvg's
    worker replays graphs (not strict: a refused capture would step eagerly) within :data:`GRAPH_TOL` of eager steps,
    the tiny data stays on the device, and the records say so; MOON, which cannot be captured, trains eagerly after
    one notice. Written without a GPU; not yet run on one."""
    from tests.engine.test_grouped import assert_close_trees, config
    from tests.engine.test_grouped import records as grouped_records

    raw = {**config("fedavg", 1).to_dict(), "device": "cuda", "deterministic": True}
    assert (validate(raw).train.cuda_graph, validate(raw).data.on_device) == ("auto", "auto")
    auto = build_simulation(validate(raw))
    eager = build_simulation(validate({**raw, "train": {**raw["train"], "cuda_graph": False}}))
    assert auto.fleet.worker.graphs is not None and not auto.fleet.worker.graphs.strict
    with deterministic_algorithms(True):
        got, want = grouped_records(auto, 3), grouped_records(eager, 3)
    assert auto.fleet.worker.graphs.num_captures == 1
    assert_close_trees(got, want, GRAPH_TOL)
    assert (auto._environment()["execution"], auto._environment()["data"]) == ("captured", "device")
    assert eager._environment()["execution"] == "eager"
    with pytest.warns(UserWarning, match=r"^train\.cuda_graph=auto: clients train eagerly, since 'moon'"):
        moon = build_simulation(validate({**raw, "method": {"base": "moon"}}))
    assert moon.fleet.worker.graphs is None and moon._environment()["execution"] == "eager"


def test_update_distances_on_cuda_equal_the_cpus_entries_without_counterpart_included() -> None:
    """The screen's terms (:class:`Against`) on CUDA, where the differences go through a buffer and each
    part's distances are read with one synchronisation: each entry's distance to what was sent, and for an
    entry the server sent no counterpart of (SCAFFOLD's ``dc/*``), its own norm, as on the CPU."""
    g = torch.Generator().manual_seed(0)
    sent = {f"w{i}": torch.randn(i + 3, 5, generator=g) for i in range(10)}
    part = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in sent.items()}
    part.update({f"dc/{i}": torch.randn(4, generator=g) for i in range(5)})
    spec = {n: TensorSpec(tuple(t.shape), t.dtype) for n, t in part.items()}
    cpu, cuda = Against(sent, {}), Against({k: v.cuda() for k, v in sent.items()}, {})
    validate_part(part, spec, "up", 1e6, cpu)
    validate_part({k: v.cuda() for k, v in part.items()}, spec, "up", 1e6, cuda)
    assert cuda.distances.keys() == cpu.distances.keys() == part.keys()
    for name, d in cpu.distances.items():
        assert cuda.distances[name] == pytest.approx(d, rel=1e-6), name


def test_the_screening_on_cuda_rejects_the_control_variates_the_cpu_rejects() -> None:
    """SCAFFOLD's ``dc/*`` of one client set to 1e3 (within ``trust.max_abs``): rejected as kind
    ``control`` on CUDA as on the CPU, with the same norms to float tolerance."""
    from tests.engine.test_screen import PoisonRound

    recs = {}
    for device in ("cpu", "cuda"):
        raw = raw_for("scaffold", device)
        raw["train"]["participation"] = 1.0  # three uploads: two cannot be screened
        sim = build_simulation(validate(raw))
        sim.fleet = PoisonRound(sim.fleet, 1, value=1e3, part="scaffold", prefix="dc/")
        recs[device] = sim.run_round(1)
    cpu, cuda = recs["cpu"], recs["cuda"]
    assert [x["client"] for x in cuda["rejected"]] == [x["client"] for x in cpu["rejected"]] != []
    assert "part 'scaffold', control: update norm" in cuda["rejected"][0]["reason"]
    for kind, norms in cpu["updates"]["norm"]["scaffold"].items():
        assert cuda["updates"]["norm"]["scaffold"][kind] == pytest.approx(norms, rel=EXACT_RTOL), kind
