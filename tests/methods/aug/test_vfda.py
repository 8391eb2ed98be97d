"""The vfda component: EMD momentum, product fusion with the global variance, per-client running
statistics carried across rounds, the ablations, and a 3D U-Net round in the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.data.base import Split
from fedaug.engine.run import build_simulation
from fedaug.methods import METHODS, ClientCtx, Uplink
from fedaug.methods.aug.vfda import VFDA, emd_momentum
from fedaug.models import build_model
from tests.conftest import tiny_raw

MEANS = np.array([[0.1, 0.5, -0.2], [0.3, 0.5, 0.6]])  # (M=2, C=3)
STDS = np.array([[1.0, 0.9, 1.2], [1.1, 0.7, 0.8]])


def ctx(net, r: int) -> ClientCtx:
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(r))
    return ClientCtx(net, 0, r, 0, Split(x, torch.zeros(8, dtype=torch.long)), component="vfda")


def net():
    return build_model("small_cnn", in_channels=1, num_classes=4, width=3)


def test_registered():
    assert METHODS.get("vfda") is VFDA


@pytest.mark.parametrize("eta0, r, expected", [
    (10.0, 1, 1.0), (10.0, 2, 1.0), (10.0, 3, 10 * np.exp(-3)), (10.0, 6, 10 * np.exp(-6)), (0.5, 1, 0.5 * np.exp(-1)),
])  # fmt: skip
def test_emd_momentum_golden(eta0, r, expected):
    assert emd_momentum(eta0, r) == pytest.approx(expected)


def test_server_sends_per_channel_global_variances():
    vfda = VFDA(at=["block1"])
    ups = [Uplink(m, 5, {"block1.running_mean": torch.tensor(MEANS[m], dtype=torch.float32),
                         "block1.running_std": torch.tensor(STDS[m], dtype=torch.float32)}) for m in range(2)]
    part = vfda.downlink(vfda.aggregate(vfda.init_server(net(), 2), ups), 0)
    np.testing.assert_allclose(part["block1.var_mu"].numpy(), MEANS.var(axis=0), rtol=1e-5)  # Eq. 5
    np.testing.assert_allclose(part["block1.var_sigma"].numpy(), STDS.var(axis=0), rtol=1e-5)
    model = net()
    vfda.setup(model, (1, 8, 8))
    vfda.receive(ctx(model, 4), part, {})
    layer = vfda.layers["block1"]
    assert layer.variance == "product" and layer.noise_scale == "std"  # Eq. 6 (the default since issue 18)
    np.testing.assert_allclose(layer.shared_mu.numpy(), MEANS.var(axis=0), rtol=1e-5)  # no t-modulation
    assert layer.momentum == pytest.approx(10 * np.exp(-4))


def test_running_stats_start_from_the_first_batch_and_carry_over():
    vfda = VFDA(at=["block1"], p=1.0)
    model = net()
    vfda.setup(model, (1, 8, 8))
    server = vfda.init_server(model, 3)
    c1 = ctx(model, 1)
    vfda.receive(c1, vfda.downlink(server, 0), {})
    layer = vfda.layers["block1"]
    assert torch.equal(layer.shared_mu, torch.ones(3))  # round 1: global variance 1 (local only)
    model.train()
    feats = {}
    hook = model.block1[-1].register_forward_hook(lambda m, i, o: feats.setdefault("x", o.detach()))  # pre-FFA
    model(c1.data.x)
    hook.remove()
    torch.testing.assert_close(layer.running_mean, feats["x"].mean(dim=(2, 3)).mean(0))  # copied, eta = 1 ignored
    up, state = vfda.reply(c1)
    torch.testing.assert_close(state["block1.running_mean"], up["block1.running_mean"])
    vfda.receive(ctx(model, 2), vfda.downlink(server, 0), state)
    torch.testing.assert_close(layer.running_mean, state["block1.running_mean"])


def test_ablations_and_options():
    without_global = VFDA(global_variance=False)
    assert without_global.down_keys == () and without_global.up_keys == ()
    assert VFDA(emd=False, momentum=0.9).momentum == 0.9
    with pytest.raises(ConfigError, match=r"vfda\.eta0 must be >= 0"):
        VFDA(eta0=-1.0)
    with pytest.raises(ConfigError, match=r"vfda\.noise_scale must be one of std, variance"):
        VFDA(noise_scale="sd")
    with pytest.raises(ConfigError, match=r"vfda\.p must be in \[0, 1\]"):
        VFDA(p=2)


@pytest.mark.parametrize("options", [{}, {"global_variance": False, "noise_scale": "std"}])
def test_unet3d_encoder_round_is_finite(options):
    vfda = VFDA(p=1.0, **options)
    model = build_model("unet3d", in_channels=1, num_classes=3, features=(2, 4, 8))
    x = torch.randn(4, 1, 8, 8, 8, generator=torch.Generator().manual_seed(0))
    c = ClientCtx(model, 0, 1, 0, Split(x, torch.zeros(4, 8, 8, 8, dtype=torch.long)), component="vfda")
    vfda.setup(model, (1, 8, 8, 8))
    vfda.receive(c, vfda.downlink(vfda.init_server(model, 3), 0), {})
    assert list(vfda.layers) == list(model.feature_stages)
    model.train()
    out = model(x)
    out.square().mean().backward()
    assert out.shape == (4, 3, 8, 8, 8) and torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    up, _ = vfda.reply(c)
    assert all(torch.isfinite(t).all() for t in up.values())


def test_engine_runs_are_deterministic_and_order_free():
    def make():
        raw = tiny_raw()
        raw["method"] = {"base": "fedavg", "augs": ["vfda"]}
        return build_simulation(validate(raw))

    a, b = make(), make()
    b.order = lambda ids: ids[::-1]
    for r in (1, 2):
        assert a.run_round(r)["train"]["clients"] == b.run_round(r)["train"]["clients"]
    assert a.client_states.keys() == b.client_states.keys() and "vfda" in a.client_states[0]
