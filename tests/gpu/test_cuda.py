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

from fedaug.config.load import load_config
from fedaug.config.schema import validate
from fedaug.core.payload import FUSED_MAX, Against, TensorSpec, validate_part, value_extremes
from fedaug.core.runtime import deterministic_algorithms
from fedaug.engine.simulate import build_simulation, resume_experiment, run_experiment
from fedaug.layers.functional import StatNoise, restyle
from tests.conftest import tiny_raw
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


def test_vfda_3d_on_cuda_matches_cpu_in_distribution() -> None:
    """VFDA on the 3D U-Net: the ``vfda_brain_mri_3d`` preset, small (16^3 patches, 2 rounds)."""
    def raw(device: str) -> dict[str, Any]:
        cfg, _ = load_config("vfda_brain_mri_3d", ["train.rounds=2", "train.local_steps=2", "data.options.patch=16",
                                                   "data.options.size=32", "method.options.vfda.kernel=off",
                                                   f"device={device}"])
        return cfg.to_dict()

    assert_close(records(raw("cpu")), records(raw("cuda")), SAMPLE_RTOL, evaluation=False)


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
    """``kernel="on"`` on CUDA runs the Triton kernel (fedaug.layers.triton_ffa, compiled here; CI runs it
    under Triton's interpreter, tests/layers/test_triton_ffa.py): forward, statistics and input gradient
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
            assert (y.grad_fn.name() == "_TritonRestyleBackward") == (mode == "on")
            (gx,) = torch.autograd.grad(y, xd, gy)
            out[mode] = [t.detach() for t in (y, mu, sigma, gx)]
        for a, b in zip(out["on"], out["off"], strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_fedfa_on_the_triton_kernel_trains_like_the_pytorch_path() -> None:
    """A FedFA run on CUDA with ``kernel = "on"`` against ``"off"``: the same draws from the same CUDA
    generators, so only float32 rounding differs (:data:`EXACT_RTOL` after 2 rounds)."""
    on = raw_for("fedfa", "cuda")
    on["method"]["options"]["fedfa"]["kernel"] = "on"
    assert_close(records(raw_for("fedfa", "cuda")), records(on), EXACT_RTOL, evaluation=True)


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


#: the update norms of the records of grouped and one-at-a-time clients on CUDA (issue 48): a parameter
#: update ``||w_k - w||`` is about a tenth of the weights, so the weights' own differences (cuDNN's
#: algorithms) are ten times larger relative to it; measured up to 3.6 % (scaffold's), on an H100
UPDATE_NORM_TOL = {"rtol": 5e-2, "atol": 2.5e-3}


@pytest.mark.parametrize("name", ["fedavg", "fedbn", "fedprox", "scaffold", "fedfa"])
def test_grouped_clients_on_cuda_equal_one_at_a_time_on_cuda(name: str) -> None:
    """``train.group_clients`` on CUDA (issue 39): the same draws as one at a time on CUDA (both use the
    clients' CUDA streams), so every record value and the final server state agree up to float rounding.
    The bound is the CPU test's fedfa bound times 5 (cuDNN picks other algorithms for the batched,
    grouped convolutions); not yet run on a GPU when written."""
    from tests.engine.test_grouped import assert_close_trees, config
    from tests.engine.test_grouped import records as grouped_records

    sims = [build_simulation(validate({**config(name, g).to_dict(), "device": "cuda"})) for g in (1, 4)]
    one, grouped = (grouped_records(sim, 3) for sim in sims)
    tol = {"rtol": 1e-2, "atol": 2.5e-3}
    assert_close_trees([r.pop("updates") for r in grouped], [r.pop("updates") for r in one], UPDATE_NORM_TOL)
    assert_close_trees(grouped, one, tol)  # the screening's decisions (rejected) exactly
    assert_close_trees(sims[1].server, sims[0].server, tol)


#: train.cuda_graph against eager steps on the same GPU (issue 39). A replay runs the kernels the capture
#: recorded, and with SGD they are eager training's (a zeroed momentum buffer's first step equals a fresh
#: one's), so the numbers are expected to be the same; the bound allows for cuBLAS or cuDNN choosing
#: another algorithm under capture, and for capturable Adam, which computes its bias corrections on the
#: device in float32 where eager Adam computes them on the host in float64.
GRAPH_TOL = {"rtol": 1e-5, "atol": 1e-6}
GRAPH_ADAM_TOL = {"rtol": 1e-4, "atol": 1e-5}


def graphed_pair(raw: dict[str, Any], rounds: int) -> tuple[list[Any], list[Any], Any, Any]:
    """Eager and graphed records of ``raw`` on CUDA, and the two simulations."""
    from tests.engine.test_grouped import records as grouped_records

    sims = [build_simulation(validate({**raw, "device": "cuda", "train": {**raw["train"], "cuda_graph": g}}))
            for g in (False, True)]
    assert sims[0].fleet.worker.graphs is None and sims[1].fleet.worker.graphs is not None
    eager, graphed = (grouped_records(sim, rounds) for sim in sims)
    return eager, graphed, sims[0], sims[1]


@pytest.mark.parametrize("name", ["fedavg", "fedbn", "fedprox", "scaffold"])
def test_cuda_graph_steps_equal_eager_steps_on_cuda(name: str) -> None:
    """``train.cuda_graph`` (issue 39): every record value, the final server state and the client states
    of 3 rounds of 4 clients (3 SGD steps with momentum each) within :data:`GRAPH_TOL` of eager steps on
    the same GPU, from one captured graph; not yet run on a GPU when written."""
    from tests.engine.test_grouped import assert_close_trees, config

    eager, graphed, one, cap = graphed_pair(config(name, 1).to_dict(), 3)
    assert cap.fleet.worker.graphs.num_captures == 1
    assert_close_trees(graphed, eager, GRAPH_TOL)
    assert_close_trees(cap.server, one.server, GRAPH_TOL)
    assert_close_trees(cap.client_states, one.client_states, GRAPH_TOL)


def test_cuda_graph_with_adam_partial_batches_and_a_schedule_equals_eager_steps_on_cuda() -> None:
    """FedProx with Adam (capturable on CUDA), a last partial batch (44 samples in batches of 16) and a
    halving learning rate: a graph per batch shape and round, within :data:`GRAPH_ADAM_TOL`."""
    from tests.engine.test_grouped import assert_close_trees, config

    raw = config("fedprox", 1, optimizer="adam", lr=0.01, local_steps=None, local_epochs=1, drop_last=False,
                 lr_schedule="exponential", lr_decay=0.5).to_dict()
    raw["data"]["options"].update(num_clients=4, samples_per_client=44)
    eager, graphed, one, cap = graphed_pair(raw, 3)
    assert cap.fleet.worker.graphs.num_captures == 6  # (16, 12) x 3 learning rates
    assert_close_trees(graphed, eager, GRAPH_ADAM_TOL)
    assert_close_trees(cap.server, one.server, GRAPH_ADAM_TOL)


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
