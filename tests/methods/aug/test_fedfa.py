"""The fedfa component: server golden values (Eq. 5-6), per-round client behaviour (paper vs
official-compat), options, communication accounting (Appendix D) and determinism in the engine."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
import torch

import fedaug.layers
from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError, PayloadError
from fedaug.data.base import Split
from fedaug.engine.run import Simulation, build_simulation
from fedaug.layers import kernel
from fedaug.layers.attach import stage_channels
from fedaug.methods import METHODS, ClientCtx, Uplink
from fedaug.methods.aug import featstats
from fedaug.methods.aug.fedfa import FedFA
from fedaug.models import build_model
from tests.conftest import requires_kernel, tiny_raw

MEANS = np.array([[0.1, 0.5, -0.2], [0.3, 0.5, 0.6], [0.2, 0.4, 0.1]])  # (M=3, C=3)
STDS = np.array([[1.0, 0.9, 1.2], [1.1, 0.9, 0.8], [0.7, 1.0, 1.0]])


def np_gamma(var: np.ndarray, eps: float = 0.0) -> np.ndarray:
    a = 1.0 / (1.0 + 1.0 / (var + eps))
    return len(var) * a / a.sum()


def uplinks(layer: str = "block1") -> list[Uplink]:
    return [Uplink(m, 10 * (m + 1), {f"{layer}.running_mean": torch.tensor(MEANS[m], dtype=torch.float32),
                                     f"{layer}.running_std": torch.tensor(STDS[m], dtype=torch.float32)})
            for m in range(3)]


def model():
    return build_model("small_cnn", in_channels=1, num_classes=4, width=3)


def test_registered():
    assert METHODS.get("fedfa") is FedFA


def test_server_sends_gamma_of_per_channel_variances():
    fedfa = FedFA(at=["block1"])
    server = fedfa.aggregate(fedfa.init_server(model(), 3), uplinks())
    part = fedfa.downlink(server, 0)
    assert sorted(part) == ["block1.gamma_mu", "block1.gamma_sigma"]
    np.testing.assert_allclose(part["block1.gamma_mu"].numpy(), np_gamma(MEANS.var(axis=0)), rtol=1e-5)
    np.testing.assert_allclose(part["block1.gamma_sigma"].numpy(), np_gamma(STDS.var(axis=0)), rtol=1e-5)
    assert part["block1.gamma_mu"].sum().item() == pytest.approx(3.0)
    assert server["channels"] == {"block1": 3}


def test_direct_fusion_sends_raw_variances():
    fedfa = FedFA(at=["block1"], variance="direct")
    part = fedfa.downlink(fedfa.aggregate(fedfa.init_server(model(), 3), uplinks()), 0)
    np.testing.assert_allclose(part["block1.var_mu"].numpy(), MEANS.var(axis=0), rtol=1e-5)


def test_official_compat_gives_gamma_one_in_every_channel():
    fedfa = FedFA(at=["block1"], official_compat=True)
    part = fedfa.downlink(fedfa.aggregate(fedfa.init_server(model(), 3), uplinks()), 0)
    scalar = MEANS.var(ddof=1)  # one variance over all M x C entries
    np.testing.assert_allclose(part["block1.var_mu"].numpy(), np.full(3, scalar), rtol=1e-5)
    np.testing.assert_allclose(part["block1.running_mean"].numpy(), MEANS.mean(axis=0), rtol=1e-5)  # uniform
    net = model()
    fedfa.setup(net, (1, 8, 8))
    fedfa.receive(ctx(net, 2), part, {})
    layer = fedfa.layers["block1"]
    np.testing.assert_allclose(layer.shared_mu.numpy(), np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(layer.shared_sigma.numpy(), np.ones(3), rtol=1e-6)


def ctx(net, r: int, cid: int = 0) -> ClientCtx:
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(cid))
    return ClientCtx(net, cid, r, 0, Split(x, torch.zeros(8, dtype=torch.long)), component="fedfa")


@pytest.mark.parametrize("compat", [False, True])
def test_running_stats_reset_per_round_or_carried(compat):
    fedfa = FedFA(at=["block1"], official_compat=compat, p=1.0)
    net = model()
    fedfa.setup(net, (1, 8, 8))
    server = fedfa.aggregate(fedfa.init_server(net, 3), uplinks())
    fedfa.receive(ctx(net, 2), fedfa.downlink(server, 0), {})
    layer = fedfa.layers["block1"]
    want_mean, want_std = (MEANS.mean(axis=0), STDS.mean(axis=0)) if compat else (np.zeros(3), np.ones(3))
    np.testing.assert_allclose(layer.running_mean.numpy(), want_mean, rtol=1e-6)
    np.testing.assert_allclose(layer.running_std.numpy(), want_std, rtol=1e-6)
    net.train()
    net(ctx(net, 2).data.x)
    up, state = fedfa.reply(ctx(net, 2))
    assert not torch.allclose(up["block1.running_mean"], torch.tensor(want_mean, dtype=torch.float32))
    assert state == {}


def test_round_one_has_no_statistics_and_gamma_is_one():
    fedfa = FedFA(at=["block1"])
    net = model()
    fedfa.setup(net, (1, 8, 8))
    server = fedfa.init_server(net, 3)
    assert all(t.numel() == 0 for t in fedfa.downlink(server, 0).values())
    fedfa.receive(ctx(net, 1), fedfa.downlink(server, 0), {})
    assert torch.equal(fedfa.layers["block1"].shared_mu, torch.ones(3))


def test_a_downlink_of_the_wrong_size_fails_loudly():
    fedfa = FedFA(at=["block1"])
    net = model()
    fedfa.setup(net, (1, 8, 8))
    with pytest.raises(PayloadError, match=r"block1.*expected 3 values"):
        fedfa.receive(ctx(net, 2), {"block1.gamma_mu": torch.ones(5), "block1.gamma_sigma": torch.ones(5)}, {})


def test_attached_layers_leave_the_state_dict_unchanged():
    net = model()
    keys = {k: v.clone() for k, v in net.state_dict().items()}
    fedfa = FedFA()
    fedfa.setup(net, (1, 8, 8))
    fedfa.receive(ctx(net, 1), fedfa.downlink(fedfa.init_server(net, 3), 0), {})
    assert list(net.state_dict()) == list(keys) and len(fedfa.layers) == 4


def test_options_are_validated():
    with pytest.raises(ConfigError, match=r"fedfa\.p must be in \[0, 1\], got 1\.5"):
        FedFA(p=1.5)
    with pytest.raises(ConfigError, match=r"fedfa\.variance must be one of fused, direct, client, fixed"):
        FedFA(variance="random")
    with pytest.raises(ConfigError, match=r"fedfa\.official_compat"):
        FedFA(official_compat=True, variance="client")
    with pytest.raises(ConfigError, match=r"fedfa\.at"):
        FedFA(at="block1")
    with pytest.warns(UserWarning, match=r"fedfa\.lam"):
        FedFA(lam=0.3)
    with pytest.raises(ConfigError, match=r"fedfa\.momentum"):
        FedFA(momentum=2.0)


@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_kernel_option_is_validated_with_the_choices(aug):
    cls = METHODS.get(aug)
    with pytest.raises(ConfigError, match=rf"{aug}\.kernel must be one of off, on, triton, got 'fast'"):
        cls(kernel="fast")
    with pytest.raises(ConfigError, match=rf"{aug}\.kernel must be one of off, on, triton, got 'auto': 'auto' \(the kernel "
                                          r"when it builds\) made a run's numbers depend on the machine"):
        cls(kernel="auto")
    raw = tiny_raw()
    raw["method"] = {"base": "fedavg", "augs": [aug], "options": {aug: {"kernel": True}}}
    with pytest.raises(ConfigError, match=rf"{aug}\.kernel must be one of off, on, triton, got True"):
        build_simulation(validate(raw))


def ffa_sim(aug: str, **options) -> Simulation:
    raw = tiny_raw()
    raw["method"] = {"base": "fedavg", "augs": [aug], "options": {aug: options}}
    return build_simulation(validate(raw))


def count_op_calls(monkeypatch) -> list[int]:
    """Replace the loaded compiled op by a counting wrapper of it (one entry per call)."""
    calls: list[int] = []
    real = kernel.restyle_op

    def spy():
        op = real()
        return lambda *args: calls.append(1) or op(*args)

    monkeypatch.setattr(kernel, "restyle_op", spy)
    return calls


@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_kernel_off_never_calls_the_compiled_op(aug, monkeypatch):
    def forbidden():
        raise AssertionError("the compiled kernel was asked for")

    monkeypatch.setattr(kernel, "restyle_op", forbidden)
    for s in (ffa_sim(aug), ffa_sim(aug, kernel="off")):  # the default is "off"
        s.run_round(1)
        assert {layer.kernel for layer in s.recipe.components[1].layers.values()} == {"off"}


@requires_kernel
@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_kernel_on_calls_the_compiled_op(aug, monkeypatch):
    calls = count_op_calls(monkeypatch)
    s = ffa_sim(aug, kernel="on")
    s.run_round(1)
    assert {layer.kernel for layer in s.recipe.components[1].layers.values()} == {"on"}
    assert len(calls) > 0


def test_kernel_on_without_a_compiler_fails_before_training_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setenv(kernel.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(kernel._STATE, "op", None)
    monkeypatch.setitem(kernel._STATE, "error", None)
    with pytest.raises(kernel.KernelBuildError, match=r"(?s)compiling ffa_restyle\.cpp.*kernel option to \"off\""):
        ffa_sim("fedfa", kernel="on")  # setup builds it: no round has started


@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_kernel_on_refuses_a_device_without_a_fused_kernel(aug):
    with pytest.raises(ConfigError, match=rf"{aug}\.kernel='on' runs a fused kernel, which exists for cpu and cuda "
                                          rf"models, but the model is on meta; set {aug}\.kernel='off'"):
        METHODS.get(aug)(kernel="on").setup(model().to("meta"), (1, 8, 8))


def test_kernel_on_a_cuda_model_without_triton_fails_before_training_with_the_fix(monkeypatch):
    """A CUDA model takes the Triton kernel: setup imports it, so a missing triton fails there (the model
    is a CPU one that claims to be on CUDA, so that this runs without a GPU: setup stops before using it)."""
    monkeypatch.setattr(featstats, "module_device", lambda m: torch.device("cuda"))
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    for name in ("triton_ffa", "triton_op"):
        monkeypatch.delitem(sys.modules, f"fedaug.layers.{name}", raising=False)
        monkeypatch.delattr(fedaug.layers, name, raising=False)
    with pytest.raises(kernel.KernelBuildError, match=r"the CUDA FFA kernel is written in Triton.*pip install "
                                                      r"'fedaug\[gpu\]'"):
        FedFA(kernel="on").setup(model(), (1, 8, 8))


def sim(**fedfa_options) -> Simulation:
    raw = tiny_raw()
    raw["method"] = {"base": "fedavg", "augs": ["fedfa"], "options": {"fedfa": fedfa_options}}
    return build_simulation(validate(raw))


def test_extra_communication_is_four_sum_c_floats_per_client():
    s = sim()
    s.run_round(1)
    record = s.run_round(2)
    channels = [layer.num_channels for layer in s.recipe.components[1].layers.values()]
    per_client = 4 * sum(channels) * 4  # Appendix D: 4 sum_k C_k float32 values
    clients = len(record["sampled"])
    assert record["comm"]["up"]["fedfa"] + record["comm"]["down"]["fedfa"] == clients * per_client
    assert record["comm"]["up"]["fedfa"] == record["comm"]["down"]["fedfa"]


def test_appendix_d_figures_for_alexnet_and_unet():
    alex = stage_channels(build_model("alexnet_bn", in_channels=3, num_classes=10), torch.zeros(2, 3, 64, 64))
    unet = stage_channels(build_model("unet2d", in_channels=3, num_classes=2), torch.zeros(2, 3, 32, 32))
    assert 4 * sum(alex.values()) * 4 / 1024 == 18.0
    assert 4 * sum(unet.values()) * 4 / 1024 == 15.5


@pytest.mark.parametrize("options", [{}, {"official_compat": True}, {"variance": "fixed"}])
def test_engine_runs_are_deterministic_and_order_free(options):
    a = sim(**options)
    b = sim(**options)
    b.order = lambda ids: ids[::-1]
    for r in (1, 2):
        ra, rb = a.run_round(r), b.run_round(r)
        assert ra["train"]["clients"] == rb["train"]["clients"]
    ea, eb = a.evaluate(), b.evaluate()
    assert ea["mean"] == eb["mean"]
    assert all(np.isfinite(m["loss"]) for m in ra["train"]["clients"].values())


def test_kernel_triton_runs_are_deterministic_and_order_free():
    """``method.options.fedfa.kernel=triton`` end to end (Triton's interpreter on the CPU, so two 2-channel
    layers, 2 rounds of 2 clients x 1 step; VFDA's Triton runs: tests/engine/test_grouped.py): every layer
    of every client draws in the kernel from its own seed (one draw from the client's ``ffa`` stream), so
    two runs, one with the clients in reverse order, give the same records, evaluation and server state
    bit for bit."""
    pytest.importorskip("triton", reason="kernel='triton' needs triton: pip install -e '.[gpu]'")

    def run(order):
        raw = tiny_raw(rounds=2, local_steps=1)
        raw["data"]["options"]["num_clients"] = 2
        raw["model"]["options"]["width"] = 2
        raw["method"] = {"base": "fedavg", "augs": ["fedfa"],
                         "options": {"fedfa": {"kernel": "triton", "at": ["block2", "block3"]}}}
        s = build_simulation(validate(raw))
        s.order = order
        records = []
        for r in (1, 2):
            record = s.run_round(r)
            record.pop("time")
            records.append(record)
        return records, s.evaluate(), s

    (ra, ea, a), (rb, eb, b) = run(lambda ids: ids), run(lambda ids: ids[::-1])
    assert ra == rb and ea == eb
    assert all(torch.equal(a.server["fedavg"]["weights"][k], v) for k, v in b.server["fedavg"]["weights"].items())
    layers = a.recipe.components[1].layers
    assert {layer.offset.item() for layer in layers.values()} == {2}  # the last client's forward, C = 2
    assert len({layer.seed.item() for layer in layers.values()}) == 2  # a stream per layer
    assert all(np.isfinite(m["loss"]) for m in ra[-1]["train"]["clients"].values())


@pytest.mark.parametrize("aug", ["fedfa", "vfda"])
def test_resume_from_a_checkpoint_gives_the_same_round(aug):
    def make():
        raw = tiny_raw()
        raw["method"] = {"base": "fedavg", "augs": [aug]}
        return build_simulation(validate(raw))

    full = make()
    full.run_round(1)
    payload = copy.deepcopy(full.checkpoint())  # as written to disk: later rounds must not alias it
    expected = full.run_round(2)["train"]["clients"]
    resumed = make()
    resumed.restore(payload)
    assert resumed.run_round(2)["train"]["clients"] == expected
