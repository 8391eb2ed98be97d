"""The feature-statistics augmentation layer of FedFA (ICLR 2023, arXiv:2301.12995, Alg. 2) and VFDA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError
from fedaug.layers import kernel as compiled
from fedaug.layers.functional import StatNoise, check_kernel, momentum_update, restyle, restyle_autograd, t_modulation

#: how the sampling variance (Eq. 7) is formed from the client-specific variance ``v`` (Eq. 3)
#: and the server's per-channel quantity ``s``.
VARIANCES = {
    "fused": "(gamma + 1) * v, s = gamma (FedFA Eq. 7, adaptive fusion)",
    "direct": "(var + 1) * v, s = client-sharing variance (FedFA Table 7, direct fusion)",
    "product": "var * v, s = global variance (VFDA Sec. 2.3)",
    "client": "v (FedFA-C; VFDA w/o Global)",
    "fixed": "lam ** 2 for every channel (FedFA-R)",
}
#: what multiplies the standard normal noise (Eq. 9).
NoiseScaling = Literal["std", "variance"]
NOISE_SCALES: tuple[str, ...] = get_args(NoiseScaling)
ESTIMATORS = ("paper", "official")
_NEUTRAL = {"fused": 1.0, "direct": 0.0, "product": 1.0, "client": 0.0, "fixed": 0.0}


@dataclass(frozen=True)
class Drawn:
    """One client's forward in a training step (:mod:`fedaug.engine.client.step`, every execution): what an
    :class:`FFALayer` draws in this forward (:meth:`FFALayer.draw`, drawn before the step) and the
    per-client state it reads and updates in place (copies of the layer's buffers; inside
    ``torch.func.vmap``, one client's slices of the group's stacked copies).

    Args:
        use: whether this forward augments (the coin of Alg. 2 line 1): a Python bool in an eager step, a
            ``()`` bool tensor where the step is batched or captured.
        noise: ``(2, B, C)`` standard normal draws (zeros where ``use`` is false).
        running_mean, running_std: ``(C,)``, the client's running statistics, updated in place.
        shared_mu, shared_sigma: ``(C,)``, the server's quantities as the client received them.
        update_weights: ``(2,)``, ``(keep, take)`` of the next Eq. 4 update (``(0, 1)`` where it takes the
            first batch's statistics), updated in place.
        momentum_weights: ``(2,)``, ``(m, 1 - m)`` of the layer's momentum (VFDA's changes every round).
    """

    use: bool | Tensor
    noise: Tensor
    running_mean: Tensor
    running_std: Tensor
    shared_mu: Tensor
    shared_sigma: Tensor
    update_weights: Tensor
    momentum_weights: Tensor


@dataclass(frozen=True)
class KernelState:
    """One client's part of a grouped forward on the Triton path (:func:`fedaug.layers.kernel.uses_triton`):
    the per-client tensors the kernel reads and updates in place (the layer's buffers of the same names),
    each a slice of the group's stacked tensors inside ``torch.func.vmap``. Nothing is drawn outside: the
    kernel draws from ``seed`` and ``offset``.

    Args:
        running_mean, running_std: ``(C,)``, the client's running statistics.
        shared_mu, shared_sigma: ``(C,)``, the server's quantities as the client received them.
        seed, offset: ``()`` int64, the client's random stream.
        ema: ``(2,)``, the running statistics' next weight and momentum (:attr:`FFALayer.ema`).
    """

    running_mean: Tensor
    running_std: Tensor
    shared_mu: Tensor
    shared_sigma: Tensor
    seed: Tensor
    offset: Tensor
    ema: Tensor


def _choice(what: str, value: str, allowed: object) -> str:
    if value not in allowed:  # type: ignore[operator]
        raise ConfigError(f"FFALayer.{what} must be one of {', '.join(allowed)}, got {value!r}")  # type: ignore[arg-type]
    return value


class FFALayer(nn.Module):
    """Resample every sample's channel statistics from a federation-aware Gaussian (FedFA Alg. 2).

    In training mode, with probability ``p`` per forward (one draw for the whole batch, Alg. 2
    line 1), computes each sample's channel mean and std ``(B, C)`` (Eq. 2), their variances over
    the batch ``(C,)`` (Eq. 3), the sampling variance (Eq. 7, see :data:`VARIANCES`), draws new
    statistics (Eq. 9) and re-styles the features (Eq. 8), then updates the running statistics
    (Eq. 4). Eval mode, ``p = 0`` and a losing draw return the input itself (on the Triton path a
    losing draw returns its values).

    Random draws, in order: the coin ``torch.rand(())`` (only when ``0 < p < 1``), then
    ``torch.randn(2, B, C)`` (noise of the means, then of the stds), from :attr:`generator`
    (``None``: torch's default generator, like ``nn.Dropout``; fedaug's components always set a
    seeded one). On the Triton path (``kernel="triton"``, or ``"on"`` on CUDA) the kernel draws
    both itself, with Philox, from the :attr:`seed` and :attr:`offset` tensors (:meth:`set_stream`;
    :mod:`fedaug.layers.triton_ffa`), and updates the running statistics in the same launch: no host
    synchronisation, so a CUDA graph of a training step replays it, with new draws each replay.

    Args:
        num_channels: C, channels of the features ``(B, C, *spatial)`` (any spatial rank >= 1).
        p: probability of augmenting a forward pass.
        momentum: weight of the old running statistic in Eq. 4 (the paper's alpha, 0.99).
        variance: a key of :data:`VARIANCES`.
        lam: the fixed standard deviation of ``variance="fixed"`` (FedFA-R, 0.5).
        noise_scale: ``"std"`` scales the noise by the square root of Eq. 7 (FedFA Eq. 9);
            ``"variance"`` by Eq. 7 itself (VFDA Eq. 7 as printed).
        estimator: ``"paper"`` (spatial and batch variances divide by N and B) or
            ``"official"`` (the public code: N - 1 and B - 1, plus 1e-6 on the batch variances).
        eps: added to the spatial variance before the square root.
        generator: source of the coin and the noise.
        kernel: ``"off"`` (default): the pure-PyTorch path, the same numbers on every machine;
            ``"on"``: the device's fused kernel (:mod:`fedaug.layers.kernel`): compiled C++ on
            the CPU (faster on small maps, needs a C++ compiler; float32 results differ from
            ``"off"`` in the last bits), the Triton path on CUDA (needs ``triton``; other draws);
            ``"triton"``: the Triton path on any device (a CPU runs it under Triton's interpreter,
            ``TRITON_INTERPRET=1``, slowly: for tests). Results may differ between CPU or GPU models.

    Attributes:
        running_mean, running_std: ``(C,)`` buffers, the client's running statistics (Eq. 4).
        shared_mu, shared_sigma: ``(C,)`` buffers, the server's per-channel quantities (gamma or
            variances); neutral (1 for gamma and products, 0 for direct fusion) until set.
        seed, offset: ``()`` int64 buffers, the Triton path's random stream: a forward draws from
            (seed, offset) and advances the offset by C, on the device.
        ema: ``(2,)`` buffer, the Triton path's weight of the old running statistic in the next
            update (0 after ``reset_running_stats(from_first_batch=True)``, else :attr:`momentum`),
            then the momentum; the other paths keep the first-batch flag on the host.

    >>> import torch
    >>> layer = FFALayer(4, p=1.0, generator=torch.Generator().manual_seed(0))
    >>> layer.set_server_variances(torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.full((4,), 0.2))
    >>> layer.shared_mu.sum().item()  # gamma (Eq. 6) sums to C
    4.0
    >>> x = torch.randn(8, 4, 5, 5)
    >>> y = layer(x)
    >>> y.shape, bool((y != x).any())
    (torch.Size([8, 4, 5, 5]), True)
    >>> torch.equal(layer.eval()(x), x)
    True
    """

    def __init__(self, num_channels: int, *, p: float = 0.5, momentum: float = 0.99,
                 variance: str = "fused", lam: float = 0.5, noise_scale: str = "std",
                 estimator: str = "paper", eps: float = 1e-6,
                 generator: torch.Generator | None = None, kernel: str = "off") -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ConfigError(f"FFALayer.p must be in [0, 1], got {p}")
        if not 0.0 <= momentum <= 1.0:
            raise ConfigError(f"FFALayer.momentum must be in [0, 1], got {momentum}")
        if num_channels < 1:
            raise ConfigError(f"FFALayer.num_channels must be >= 1, got {num_channels}")
        self.num_channels, self.p, self.lam, self.eps = num_channels, p, lam, eps
        self.variance = _choice("variance", variance, VARIANCES)
        self.noise_scale = _choice("noise_scale", noise_scale, NOISE_SCALES)
        self.estimator = _choice("estimator", estimator, ESTIMATORS)
        self.kernel = check_kernel(kernel, "FFALayer.kernel")
        self.generator = generator
        #: one client's draws and state during a grouped step (set by its component; ``None`` elsewhere)
        self.drawn: Drawn | KernelState | None = None
        self._init_from_batch = False
        self.register_buffer("running_mean", torch.zeros(num_channels))
        self.register_buffer("running_std", torch.ones(num_channels))
        neutral = _NEUTRAL[variance]
        self.register_buffer("shared_mu", torch.full((num_channels,), neutral))
        self.register_buffer("shared_sigma", torch.full((num_channels,), neutral))
        self.register_buffer("seed", torch.zeros((), dtype=torch.int64))
        self.register_buffer("offset", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ema", torch.zeros(2))
        self.register_buffer("momentum_weights", torch.zeros(2))
        self.register_buffer("update_weights", torch.zeros(2))
        self.momentum = momentum

    @property
    def momentum(self) -> float:
        """Weight of the old running statistic in Eq. 4 (VFDA sets it every round); setting it sets the
        weights' tensors (:meth:`_set_weights`)."""
        return self._momentum

    @momentum.setter
    def momentum(self, value: float) -> None:
        self._momentum = float(value)
        self._set_weights()

    def _set_weights(self) -> None:
        """Eq. 4's weights as tensors, from :attr:`momentum` and the first-batch flag, for the paths that must
        not read them on the host: the Triton path's :attr:`ema` ``(next update's weight, m)``; the PyTorch
        step path's :attr:`momentum_weights` ``(m, 1 - m)`` and :attr:`update_weights` (the next update's
        ``(keep, take)``), each the rounding of the float64 value, as :func:`momentum_update` rounds them."""
        m, first = self._momentum, self._init_from_batch
        with torch.no_grad():
            self.ema.copy_(torch.tensor([0.0 if first else m, m], dtype=torch.float64))
            self.momentum_weights.copy_(torch.tensor([m, 1.0 - m], dtype=torch.float64))
            self.update_weights.copy_(torch.tensor([0.0, 1.0]) if first else self.momentum_weights)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """After a dtype or device change, the weights hold :attr:`momentum` anew in their new dtype (a
        float32 0.99 cast to float64 is not 0.99); a pending first-batch update (weight 0) stays pending."""
        super()._apply(fn, recurse)
        m = self._momentum
        with torch.no_grad():
            self.ema[0].masked_fill_(self.ema[0] != 0, m)
            self.ema[1].fill_(m)
            pending = self.update_weights[0] == 0
            self.momentum_weights.copy_(torch.tensor([m, 1.0 - m], dtype=torch.float64))
            self.update_weights.copy_(torch.where(pending, torch.tensor([0.0, 1.0]).to(self.update_weights),
                                                  self.momentum_weights))
        return self

    # --- what the federation sets ----------------------------------------------------------
    def set_gamma(self, gamma_mu: Tensor, gamma_sigma: Tensor) -> None:
        """Set the modulated client-sharing variances ``(C,)`` (Eq. 6) of ``variance="fused"``."""
        if self.variance != "fused":
            raise ValueError(f"set_gamma needs variance='fused', this layer has {self.variance!r}; "
                             "use set_server_variances")
        self._set_shared(gamma_mu, gamma_sigma)

    def set_server_variances(self, var_mu: Tensor, var_sigma: Tensor) -> None:
        """Set the client-sharing variances ``(C,)`` (Eq. 5); ``"fused"`` turns them into gamma (Eq. 6)."""
        if self.variance == "fused":
            var_mu, var_sigma = t_modulation(var_mu), t_modulation(var_sigma)
        elif self.variance not in ("direct", "product"):
            raise ValueError(f"variance={self.variance!r} uses no server variances")
        self._set_shared(var_mu, var_sigma)

    def clear_shared(self) -> None:
        """Forget the server's quantities: back to the neutral values (no federation information)."""
        self.shared_mu.fill_(_NEUTRAL[self.variance])
        self.shared_sigma.fill_(_NEUTRAL[self.variance])

    def _set_shared(self, mu: Tensor, sigma: Tensor) -> None:
        for name, t in (("mu", mu), ("sigma", sigma)):
            if tuple(t.shape) != (self.num_channels,):
                raise ValueError(f"FFALayer: server {name} quantity must have shape ({self.num_channels},), "
                                 f"got {tuple(t.shape)}")
        self.shared_mu.copy_(mu)
        self.shared_sigma.copy_(sigma)

    def reset_running_stats(self, mean: Tensor | None = None, std: Tensor | None = None, *,
                            from_first_batch: bool = False) -> None:
        """Set the running statistics: to ``mean, std`` ``(C,)`` if given, else to 0 and 1 (Alg. 1
        line 3); with ``from_first_batch`` the next update copies the batch's means instead."""
        if mean is None:
            self.running_mean.zero_()
        else:
            self.running_mean.copy_(mean)
        if std is None:
            self.running_std.fill_(1.0)
        else:
            self.running_std.copy_(std)
        self._init_from_batch = from_first_batch
        self._set_weights()

    def set_stream(self, seed: Tensor | int) -> None:
        """Start the Triton path's random stream at ``seed`` (``()`` int64 tensor, on any device, or an
        int): :attr:`seed` set, :attr:`offset` 0 (no host read of a tensor ``seed``)."""
        if isinstance(seed, Tensor):
            self.seed.copy_(seed)
        else:
            self.seed.fill_(seed)
        self.offset.zero_()

    # --- forward ---------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """Augment ``x`` ``(B, C, *spatial)``; returns ``x`` itself when inactive (eval mode, ``p = 0``, a
        lost coin), except that on the Triton path a lost coin gives a new tensor of ``x``'s values (the
        coin is decided on the device)."""
        if not self.training or self.p == 0.0:
            return x
        if x.dim() < 3 or x.shape[1] != self.num_channels:
            raise ValueError(f"FFALayer({self.num_channels}) expects (B, {self.num_channels}, *spatial), "
                             f"got shape {tuple(x.shape)}")
        if compiled.uses_triton(self.kernel, x.device):
            return self._forward_triton(x, self if self.drawn is None else self.drawn)  # type: ignore[arg-type]
        if self.drawn is not None:
            return self._forward_drawn(x, self.drawn)  # type: ignore[arg-type]
        noise = self._draw(x.shape[0], self.generator, x.device)
        if noise is None:
            return x
        if noise.dtype != x.dtype or noise.device != x.device:
            noise = noise.to(device=x.device, dtype=x.dtype)
        y, mu, sigma = restyle(x, self._stat_noise(noise), eps=self.eps, unbiased=self.estimator == "official",
                               kernel=self.kernel)
        with torch.no_grad():
            weight = 0.0 if self._init_from_batch else self.momentum
            momentum_update(self.running_mean, mu, weight)
            momentum_update(self.running_std, sigma, weight)
            self._init_from_batch = False
            self._set_weights()
        return y

    def _draw(self, batch_size: int, g: torch.Generator | None, device: torch.device) -> Tensor | None:
        """One training forward's draws from ``g`` (on its own device; ``device`` without one): the
        coin (Alg. 2 line 1, only when ``p < 1``), then, if it wins, the noise ``(2, B, C)``; ``None``
        when it loses."""
        where = g.device if g is not None else device
        if self.p < 1.0 and not bool(torch.rand((), generator=g, device=where) < self.p):
            return None
        return torch.randn((2, batch_size, self.num_channels), generator=g, device=where)

    def draw(self, batch_size: int, generator: torch.Generator) -> tuple[bool, Tensor]:
        """What one training forward of a batch of ``batch_size`` draws from ``generator`` (the stream
        :attr:`generator` would be), drawn now, before the step (:class:`Drawn`).

        Returns:
            ``(use, noise)``: ``use``, whether the forward augments; ``noise`` ``(2, B, C)`` float32, zeros
            where it does not (nothing drawn for it), on the generator's device.
        """
        where = generator.device
        noise = self._draw(batch_size, generator, where) if self.p > 0.0 else None
        if noise is None:
            return False, torch.zeros((2, batch_size, self.num_channels), device=where)
        return True, noise

    def _forward_drawn(self, x: Tensor, d: Drawn) -> Tensor:
        """The training forward of one client in a step (:class:`Drawn`): with the drawn ``d.noise`` where
        ``d.use``, else ``x`` itself; the running statistics ``d.running_*`` updated in place where ``d.use``
        (Eq. 4 with ``d.update_weights``). One definition for every execution: ``use`` a Python bool (eager)
        picks a branch; a tensor (batched, captured) selects with ``torch.where``, which gives the same
        values. Batched (``torch.func.vmap``) the restyling takes pure autograd operations
        (:func:`~fedaug.layers.functional.restyle_autograd`, which round differently); otherwise
        :func:`~fedaug.layers.functional.restyle`, as the layer's own forward."""
        eager = isinstance(d.use, bool)
        if eager and not d.use:
            return x
        noise = d.noise.to(device=x.device, dtype=x.dtype)
        fn, unbiased = self._stat_noise(noise, d.shared_mu, d.shared_sigma), self.estimator == "official"
        if torch._C._functorch.is_batchedtensor(x):
            y, mu, sigma = restyle_autograd(x, fn, eps=self.eps, unbiased=unbiased)
        else:
            y, mu, sigma = restyle(x, fn, eps=self.eps, unbiased=unbiased, kernel=self.kernel)
        with torch.no_grad():
            keep, take = d.update_weights[0], d.update_weights[1]
            for running, stat in ((d.running_mean, mu), (d.running_std, sigma)):
                new = torch.addcmul(running * keep, stat.mean(0), take)  # Eq. 4, with momentum_update's bits
                running.copy_(new if eager else torch.where(d.use, new, running))
            d.update_weights.copy_(d.momentum_weights if eager else torch.where(d.use, d.momentum_weights,
                                                                                 d.update_weights))
        return y if eager else torch.where(d.use, y, x)

    def _forward_triton(self, x: Tensor, state: KernelState | FFALayer) -> Tensor:
        """The training forward on the Triton path (:func:`fedaug.layers.triton_op.ffa_train`), on
        ``state``'s per-client tensors: this layer's buffers, or one client's slices of a grouped step."""
        official = self.estimator == "official"
        if self.variance == "fixed":
            const = self.lam**2 if self.noise_scale == "variance" else self.lam
        else:
            const = 1.0 if self.variance == "client" else None
        t = self._buffers if state is self else state.__dict__  # the buffers read without Module.__getattr__
        shared = (None, None) if const is not None else (t["shared_mu"], t["shared_sigma"])
        return compiled.triton_on(x.device.type, "FFALayer.kernel").ffa_train(
            x, t["seed"], t["offset"], t["ema"], t["running_mean"], t["running_std"], *shared, p=self.p,
            const=const, shift=0.0 if self.variance == "product" else 1.0, fixed=self.variance == "fixed",
            std_scale=self.noise_scale == "std", correction=int(official), extra=1e-6 if official else 0.0,
            eps=self.eps, unbiased=official)

    def _stat_noise(self, noise: Tensor, shared_mu: Tensor | None = None,
                    shared_sigma: Tensor | None = None) -> StatNoise:
        """The map ``(mu, sigma) -> (mu_hat, sigma_hat)`` of Eq. 3, 7, 9 for ``(2, B, C)`` noise, with the
        server's quantities ``shared_mu, shared_sigma`` ``(C,)`` (default: this layer's buffers)."""
        if self.variance == "fixed":
            fixed = self.lam**2 if self.noise_scale == "variance" else self.lam
            return StatNoise(noise, scale=torch.full((2, self.num_channels), fixed, dtype=noise.dtype,
                                                     device=noise.device))
        shift = {"fused": 1.0, "direct": 1.0, "product": 0.0}.get(self.variance)
        if shift is None:  # "client": v itself
            mult = torch.ones((2, self.num_channels), dtype=noise.dtype, device=noise.device)
        else:
            shared = (self.shared_mu if shared_mu is None else shared_mu,
                      self.shared_sigma if shared_sigma is None else shared_sigma)
            mult = torch.stack(shared) + shift
        official = self.estimator == "official"
        return StatNoise(noise, mult=mult, noise_scale=self.noise_scale, correction=int(official),
                         extra=1e-6 if official else 0.0)

    def extra_repr(self) -> str:
        return (f"{self.num_channels}, p={self.p}, momentum={self.momentum}, variance={self.variance!r}, "
                f"noise_scale={self.noise_scale!r}, estimator={self.estimator!r}, kernel={self.kernel!r}")
