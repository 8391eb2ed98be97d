"""FFALayer and its pure functions against golden values computed here from the paper's equations
(FedFA, ICLR 2023, Eq. 2-9), with the layer's random draws reproduced from the same seed. Every test
runs twice: through the compiled kernel and through the pure-PyTorch path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.layers import FFALayer
from fedaug.layers.functional import (
    StatNoise,
    autograd_map,
    channel_stats,
    client_sharing_variance,
    perturb_channel_stats,
    restyle,
    t_modulation,
)

EPS = 1e-6


@pytest.fixture(params=["on", "off"], ids=["kernel", "pytorch"])
def kernel_mode(request):
    """The layer's ``kernel`` option: the test runs with the compiled kernel (skipped where it
    cannot be built), then on the pure-PyTorch path."""
    if request.param == "on":
        request.getfixturevalue("needs_kernel")
    return request.param

# (B=3, C=2, H=2, W=2) features with distinct per-sample statistics
X = np.array([
    [[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [1.0, 1.0]]],
    [[[2.0, 2.0], [2.0, 6.0]], [[-1.0, 1.0], [-1.0, 1.0]]],
    [[[0.0, 5.0], [1.0, 2.0]], [[3.0, 3.0], [3.0, 7.0]]],
])  # fmt: skip


def np_stats(x: np.ndarray, ddof: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2 over every axis after the channel axis."""
    axes = tuple(range(2, x.ndim))
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    return x.mean(axis=axes), np.sqrt(flat.var(axis=2, ddof=ddof) + EPS)


def np_gamma(var: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Eq. 6 literally: C (1 + 1/v_j)^-1 / sum_c (1 + 1/v_c)^-1."""
    a = 1.0 / (1.0 + 1.0 / (var + eps))
    return len(var) * a / a.sum()


def draws(seed: int, b: int, c: int, p: float) -> tuple[bool, np.ndarray]:
    """The layer's draws from a generator seeded with ``seed``: coin (if 0 < p < 1), then noise."""
    g = torch.Generator().manual_seed(seed)
    fired = True if p >= 1.0 else bool(torch.rand((), generator=g) < p)
    return fired, torch.randn((2, b, c), generator=g).double().numpy()


def np_ffa(x: np.ndarray, shared_mu: np.ndarray, shared_sigma: np.ndarray, noise: np.ndarray,
           fusion: str = "fused", scale: str = "std", official: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Alg. 2 lines 2-10: output, and the two fused variances (Eq. 7 or its variants); ``official``:
    the public code's N - 1, B - 1 and + 1e-6."""
    ddof = int(official)
    mu, sig = np_stats(x, ddof)
    v_mu, v_sig = mu.var(axis=0, ddof=ddof) + 1e-6 * ddof, sig.var(axis=0, ddof=ddof) + 1e-6 * ddof  # Eq. 3
    if fusion == "fused":
        f_mu, f_sig = (shared_mu + 1) * v_mu, (shared_sigma + 1) * v_sig
    elif fusion == "product":
        f_mu, f_sig = shared_mu * v_mu, shared_sigma * v_sig
    else:
        f_mu, f_sig = v_mu, v_sig
    s_mu, s_sig = (np.sqrt(f_mu), np.sqrt(f_sig)) if scale == "std" else (f_mu, f_sig)
    mu_hat, sig_hat = mu + noise[0] * s_mu, sig + noise[1] * s_sig  # Eq. 9
    e = (slice(None), slice(None)) + (None,) * (x.ndim - 2)
    return sig_hat[e] * (x - mu[e]) / sig[e] + mu_hat[e], f_mu, f_sig  # Eq. 8


def test_channel_stats_golden():
    mu, sigma = channel_stats(torch.tensor(X))
    want_mu, want_sigma = np_stats(X)
    np.testing.assert_allclose(mu.numpy(), want_mu, rtol=1e-12)
    np.testing.assert_allclose(sigma.numpy(), want_sigma, rtol=1e-12)
    _, sigma_unbiased = channel_stats(torch.tensor(X), unbiased=True)
    np.testing.assert_allclose(sigma_unbiased.numpy(), np_stats(X, ddof=1)[1], rtol=1e-12)


def test_client_specific_and_fused_variances_golden():
    # (B=3, C=2) statistics -> (C,) client-specific variance (Eq. 3) and fused variance (Eq. 7)
    mu = np.array([[1.0, 2.0], [3.0, 2.0], [8.0, 5.0]])
    sigma = np.array([[0.5, 1.0], [1.5, 2.0], [1.0, 0.0]])
    gamma = np.array([[0.4, 1.6], [1.5, 0.5]])
    noise = torch.zeros(2, 3, 2, dtype=torch.float64)
    for ddof, extra in ((0, 0.0), (1, 1e-6)):
        sn = StatNoise(noise, mult=torch.tensor(gamma + 1), correction=ddof, extra=extra)
        sn(torch.tensor(np.stack((mu, sigma))))
        want = np.stack((mu.var(axis=0, ddof=ddof), sigma.var(axis=0, ddof=ddof))) + extra
        np.testing.assert_allclose(sn.variance.numpy(), want, rtol=1e-12)
        np.testing.assert_allclose(sn.fused.numpy(), (gamma + 1) * want, rtol=1e-12)
    one = StatNoise(noise[:, :1], mult=torch.ones(2, 2, dtype=torch.float64), correction=1)
    one(torch.tensor(np.stack((mu[:1], sigma[:1]))))
    assert one.variance.tolist() == [[0.0, 0.0], [0.0, 0.0]]  # B = 1: no NaN


@pytest.mark.parametrize("noise_scale", ["std", "variance"])
@pytest.mark.parametrize("correction", [0, 1])
def test_stat_noise_vjp_equals_autograd(noise_scale, correction):
    g = torch.Generator().manual_seed(2)
    mu, sigma = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.rand(5, 3, generator=g, dtype=torch.float64)
    noise, mult = torch.randn(2, 5, 3, generator=g, dtype=torch.float64), torch.rand(2, 3, generator=g, dtype=torch.float64)
    sn = StatNoise(noise, mult=mult, noise_scale=noise_scale, correction=correction, extra=1e-6 * correction)

    def plain(m: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.stack((m, s))
        f = mult * (z.var(dim=1, correction=correction) + 1e-6 * correction)
        scale = f.sqrt() if noise_scale == "std" else f
        z_hat = z + noise * scale.unsqueeze(1)
        return z_hat[0], z_hat[1]

    z = torch.stack((mu, sigma))
    got, vjp = sn(z)
    ref, ref_vjp = autograd_map(plain)(z)
    torch.testing.assert_close(got, ref)
    grad = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(vjp(grad), ref_vjp(grad))


@pytest.mark.parametrize("stats, per_channel, unbiased, expected", [
    ([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]], True, False, [8 / 3, 2.0]),  # Eq. 5, 1/M per channel
    ([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]], False, True, [2.8, 2.8]),  # public code: one scalar
    ([[5.0, -1.0]], True, False, [0.0, 0.0]),  # a single client
])  # fmt: skip
def test_client_sharing_variance_golden(stats, per_channel, unbiased, expected):
    got = client_sharing_variance(torch.tensor(stats, dtype=torch.float64), per_channel=per_channel, unbiased=unbiased)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("var, eps, expected", [
    ([0.0, 1.0, 3.0], 0.0, [0.0, 1.2, 1.8]),  # a = 0, 1/2, 3/4; gamma = 3 a / 1.25
    ([0.5, 0.5], 1e-6, [1.0, 1.0]),  # equal variances: gamma = 1
    ([0.0, 0.0, 0.0], 0.0, [1.0, 1.0, 1.0]),  # 0/0: the equal-variance limit
])  # fmt: skip
def test_t_modulation_golden(var, eps, expected):
    np.testing.assert_allclose(t_modulation(torch.tensor(var, dtype=torch.float64), eps=eps).numpy(), expected, rtol=1e-12)


def test_t_modulation_sums_to_c_and_is_monotone():
    var = np.array([0.01, 0.3, 0.05, 2.0, 0.7])
    gamma = t_modulation(torch.tensor(var)).numpy()
    np.testing.assert_allclose(gamma, np_gamma(var), rtol=1e-12)
    assert gamma.sum() == pytest.approx(5.0)
    order = np.argsort(var)
    assert np.all(np.diff(gamma[order]) > 0)


@pytest.mark.parametrize("fusion, scale", [("fused", "std"), ("product", "variance"), ("client", "std")])
def test_layer_output_and_running_stats_golden(fusion, scale, kernel_mode):
    shared_mu, shared_sigma = np.array([0.4, 1.6]), np.array([1.5, 0.5])
    layer = FFALayer(2, kernel=kernel_mode, p=1.0, momentum=0.99, variance=fusion, noise_scale=scale,
                     generator=torch.Generator().manual_seed(3)).double()
    if fusion == "fused":
        layer.set_gamma(torch.tensor(shared_mu), torch.tensor(shared_sigma))
    elif fusion == "product":
        layer.set_server_variances(torch.tensor(shared_mu), torch.tensor(shared_sigma))
    y = layer(torch.tensor(X))
    _, noise = draws(3, 3, 2, p=1.0)
    want, _, _ = np_ffa(X, shared_mu, shared_sigma, noise, fusion, scale)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-10, atol=1e-12)
    mu, sig = np_stats(X)  # Eq. 4 from 0 / 1
    np.testing.assert_allclose(layer.running_mean.numpy(), 0.01 * mu.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(layer.running_std.numpy(), 0.99 + 0.01 * sig.mean(axis=0), rtol=1e-10)


def test_official_estimators_golden(kernel_mode):
    gamma = np.array([0.7, 1.3])
    layer = FFALayer(2, p=1.0, estimator="official", generator=torch.Generator().manual_seed(4),
                     kernel=kernel_mode).double()
    layer.set_gamma(torch.tensor(gamma), torch.tensor(gamma))
    _, noise = draws(4, 3, 2, p=1.0)
    want, _, _ = np_ffa(X, gamma, gamma, noise, official=True)
    np.testing.assert_allclose(layer(torch.tensor(X)).detach().numpy(), want, rtol=1e-10, atol=1e-12)
    mu, sig = np_stats(X, ddof=1)
    np.testing.assert_allclose(layer.running_std.numpy(), 0.99 + 0.01 * sig.mean(axis=0), rtol=1e-10)


def test_server_variances_become_gamma_in_fused_mode():
    var = np.array([0.2, 0.05])
    layer = FFALayer(2).double()
    layer.set_server_variances(torch.tensor(var), torch.tensor(var[::-1].copy()))
    np.testing.assert_allclose(layer.shared_mu.numpy(), np_gamma(var), rtol=1e-12)
    np.testing.assert_allclose(layer.shared_sigma.numpy(), np_gamma(var[::-1]), rtol=1e-12)


def test_fixed_variance_uses_lambda_for_every_channel(kernel_mode):
    layer = FFALayer(2, p=1.0, variance="fixed", lam=0.5, generator=torch.Generator().manual_seed(1),
                     kernel=kernel_mode).double()
    y = layer(torch.tensor(X)).detach().numpy()
    _, noise = draws(1, 3, 2, 1.0)
    mu, sig = np_stats(X)
    mu_hat, sig_hat = mu + 0.5 * noise[0], sig + 0.5 * noise[1]
    want = sig_hat[..., None, None] * (X - mu[..., None, None]) / sig[..., None, None] + mu_hat[..., None, None]
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)


def test_coin_is_drawn_first_and_skips_when_lost(kernel_mode):
    x = torch.tensor(X)
    for seed in range(8):
        fired, _ = draws(seed, 3, 2, p=0.5)
        y = FFALayer(2, kernel=kernel_mode, p=0.5, generator=torch.Generator().manual_seed(seed)).double()(x)
        assert (y is x) == (not fired)


def test_eval_and_p0_are_the_identity(kernel_mode):
    x = torch.randn(4, 3, 5, 5)
    layer = FFALayer(3, kernel=kernel_mode, p=1.0)
    assert layer.eval()(x) is x
    assert FFALayer(3, kernel=kernel_mode, p=0.0)(x) is x


@pytest.mark.parametrize("variance, noise_scale, estimator", [
    ("fused", "std", "paper"), ("fused", "std", "official"), ("direct", "std", "paper"),
    ("product", "variance", "paper"), ("client", "std", "official"), ("fixed", "std", "paper"),
    ("fixed", "variance", "official"),
])  # fmt: skip
def test_gradients_reach_the_input_exactly(variance, noise_scale, estimator, kernel_mode):
    x = torch.tensor(X, requires_grad=True)
    layer = FFALayer(2, kernel=kernel_mode, p=1.0, variance=variance, noise_scale=noise_scale, estimator=estimator,
                     generator=torch.Generator().manual_seed(0)).double()
    if variance in ("fused", "direct", "product"):
        layer._set_shared(torch.tensor([0.5, 1.5], dtype=torch.float64), torch.ones(2, dtype=torch.float64))

    def fresh(inp):
        layer.generator = torch.Generator().manual_seed(0)
        return layer(inp)

    assert torch.autograd.gradcheck(fresh, (x,))
    fresh(x).pow(2).sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)


@pytest.mark.parametrize("variance, noise_scale, estimator", [
    ("fused", "std", "paper"), ("product", "variance", "official"), ("client", "std", "official"),
    ("fixed", "std", "paper"),
])  # fmt: skip
def test_pytorch_path_has_exact_second_derivatives(variance, noise_scale, estimator):
    """FedMix differentiates an input gradient (create_graph): the gradient through the layer must
    itself be differentiable, and its first derivative the same as the plain backward's."""
    x = torch.tensor(X, requires_grad=True)
    layer = FFALayer(2, p=1.0, variance=variance, noise_scale=noise_scale, estimator=estimator,
                     generator=torch.Generator().manual_seed(0)).double()
    if variance in ("fused", "product"):
        layer._set_shared(torch.tensor([0.5, 1.5], dtype=torch.float64), torch.ones(2, dtype=torch.float64))

    def fresh(inp):
        layer.generator = torch.Generator().manual_seed(0)
        return layer(inp)

    assert torch.autograd.gradgradcheck(fresh, (x,))
    weights = torch.linspace(-1.0, 1.0, x.numel(), dtype=torch.float64).view_as(x)
    (plain,) = torch.autograd.grad((fresh(x) * weights).pow(2).sum(), x)
    (graphed,) = torch.autograd.grad((fresh(x) * weights).pow(2).sum(), x, create_graph=True)
    assert graphed.requires_grad
    torch.testing.assert_close(graphed.detach(), plain, rtol=1e-12, atol=1e-12)


def test_autograd_map_has_second_derivatives():
    def shift(mu: torch.Tensor, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mu + 0.5 * mu.pow(2), sigma * (1.0 + sigma.mean(0))  # couples the samples

    x = torch.tensor(X, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: restyle(t, autograd_map(shift))[0], (x,))


@pytest.mark.parametrize("shape", [(6, 4, 7, 5), (3, 4, 16, 16)])  # short rows and long rows (N >= 64)
def test_fused_backward_matches_plain_autograd(shape, kernel_mode):
    torch.manual_seed(0)
    x = (3.0 + 2.0 * torch.randn(*shape, dtype=torch.float64)).requires_grad_()
    noise = torch.randn(2, *shape[:2], dtype=torch.float64)
    var_mu, var_sigma = torch.rand(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    y = perturb_channel_stats(x, var_mu, var_sigma, noise_mu=noise[0], noise_sigma=noise[1], kernel=kernel_mode)
    mu, sigma = channel_stats(x)
    mu_hat, sigma_hat = mu + noise[0] * var_mu.sqrt(), sigma + noise[1] * var_sigma.sqrt()
    ref = sigma_hat[..., None, None] * (x - mu[..., None, None]) / sigma[..., None, None] + mu_hat[..., None, None]
    w = torch.randn_like(y)
    g1, = torch.autograd.grad((y * w).sum(), x)
    g2, = torch.autograd.grad((ref * w).sum(), x)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(g1, g2)


def test_1d_2d_3d_agree_on_reshaped_data(kernel_mode):
    x = torch.randn(5, 3, 4, 6)
    outs = []
    for shaped in (x.reshape(5, 3, 24), x, x.reshape(5, 3, 2, 2, 6)):
        layer = FFALayer(3, kernel=kernel_mode, p=1.0, generator=torch.Generator().manual_seed(11))
        layer.set_gamma(torch.tensor([0.5, 1.0, 1.5]), torch.tensor([1.0, 1.0, 1.0]))
        outs.append(layer(shaped).reshape(5, 3, 4, 6))
        running = (layer.running_mean.clone(), layer.running_std.clone())
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[2], outs[1])
    assert running[0].shape == (3,)


def test_same_seed_same_output_other_seed_differs(kernel_mode):
    x = torch.randn(8, 4, 5, 5)
    run = lambda seed: FFALayer(4, p=1.0, generator=torch.Generator().manual_seed(seed), kernel=kernel_mode)(x)  # noqa: E731
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))


@pytest.mark.parametrize("variance", ["fused", "direct", "product", "client", "fixed"])
@pytest.mark.parametrize("estimator", ["paper", "official"])
@pytest.mark.parametrize("shape", [(1, 3, 4, 4), (4, 3, 1, 1), (4, 3, 1), (1, 3, 1, 1, 1)])
def test_degenerate_inputs_give_no_nan(variance, estimator, shape, kernel_mode):
    layer = FFALayer(3, p=1.0, variance=variance, estimator=estimator, generator=torch.Generator().manual_seed(0),
                     kernel=kernel_mode)
    for x in (torch.randn(shape), torch.zeros(shape), torch.full(shape, 3.0)):  # incl. zero variance
        x = x.requires_grad_()
        y = layer(x)
        y.sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
        assert torch.isfinite(layer.running_mean).all() and torch.isfinite(layer.running_std).all()


def test_restyle_with_identity_map_returns_the_input(kernel_mode):
    x = torch.randn(3, 2, 5, dtype=torch.float64)
    y, mu, sigma = restyle(x, autograd_map(lambda m, s: (m, s)), kernel=kernel_mode)
    torch.testing.assert_close(y, x)
    assert mu.shape == sigma.shape == (3, 2) and not mu.requires_grad


def test_bad_options_and_shapes_are_named():
    with pytest.raises(ConfigError, match=r"FFALayer\.p must be in \[0, 1\], got 1\.5"):
        FFALayer(2, p=1.5)
    with pytest.raises(ConfigError, match=r"FFALayer\.variance must be one of"):
        FFALayer(2, variance="mixed")
    with pytest.raises(ValueError, match=r"expects \(B, 2, \*spatial\)"):
        FFALayer(2, p=1.0)(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"set_server_variances"):
        FFALayer(2, variance="direct").set_gamma(torch.ones(2), torch.ones(2))


# --- grouped clients (issue 39): the layer on drawn noise under torch.func.vmap ------------------------
@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_draw_consumes_the_stream_exactly_as_a_training_forward(p):
    x = torch.randn(4, 3, 5, 5)
    for seed in range(6):
        forward_g, draw_g = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        layer = FFALayer(3, p=p, generator=forward_g)
        y = layer(x)
        use, noise = FFALayer(3, p=p).draw(4, draw_g)
        assert bool(use) == (y is not x) and noise.shape == (2, 4, 3)
        assert torch.equal(forward_g.get_state(), draw_g.get_state())
        if not use:
            assert torch.equal(noise, torch.zeros(2, 4, 3))


@pytest.mark.parametrize(("variance", "estimator"), [("fused", "paper"), ("direct", "official"), ("client", "paper"),
                                                     ("fixed", "paper")])
def test_a_grouped_forward_under_vmap_equals_each_clients_own_forward_in_float64(variance, estimator):
    """Three clients, each with its own running statistics, server quantities and stream (seeds 0, 1, 3:
    clients 0 and 2 augment, client 1 loses the coin): outputs, input gradients and updated running
    statistics of the batched drawn path equal each client's own forward (:class:`~fedaug.layers.ffa.Drawn`)."""
    from torch.func import vmap

    from fedaug.layers.ffa import Drawn

    g_count, b, c, seeds = 3, 4, 2, (0, 1, 3)
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(g_count, b, c, 3, 3, generator=gen, dtype=torch.float64)
    state = {k: torch.rand(g_count, c, generator=gen, dtype=torch.float64) + 0.5
             for k in ("running_mean", "running_std", "shared_mu", "shared_sigma")}
    weights = torch.randn(g_count, b, c, 3, 3, generator=gen, dtype=torch.float64)
    layer = FFALayer(c, p=0.5, variance=variance, estimator=estimator).double()
    want_y, want_grad, want_stats = [], [], []
    for i in range(g_count):
        for k in state:
            getattr(layer, k).copy_(state[k][i])
        layer.generator = torch.Generator().manual_seed(seeds[i])
        xi = x[i].clone().requires_grad_()
        yi = layer(xi)
        (yi * weights[i]).sum().backward()
        want_y.append(yi.detach())
        want_grad.append(xi.grad)
        want_stats.append(torch.stack((layer.running_mean.clone(), layer.running_std.clone())))
    drawn = [layer.draw(b, torch.Generator().manual_seed(seed)) for seed in seeds]
    assert [bool(u) for u, _ in drawn] == [True, False, True]
    use, noise = torch.tensor([u for u, _ in drawn]), torch.stack([n for _, n in drawn])
    stacked = {k: v.clone() for k, v in state.items()}
    stacked |= {k: getattr(layer, k).expand(g_count, 2).clone() for k in ("update_weights", "momentum_weights")}

    def one_client(xi, ui, ni, rm, rs, smu, ssig, uw, mw):
        layer.drawn = Drawn(ui, ni, rm, rs, smu, ssig, uw, mw)
        try:
            return layer(xi)
        finally:
            layer.drawn = None

    xg = x.clone().requires_grad_()
    y = vmap(one_client)(xg, use, noise, *stacked.values())
    (y * weights).sum().backward()
    torch.testing.assert_close(y.detach(), torch.stack(want_y))
    torch.testing.assert_close(xg.grad, torch.stack(want_grad))
    torch.testing.assert_close(torch.stack((stacked["running_mean"], stacked["running_std"]), 1), torch.stack(want_stats))
    assert torch.equal(stacked["running_mean"][1], state["running_mean"][1])  # the client that did not augment
