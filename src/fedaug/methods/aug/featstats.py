"""What FedFA and VFDA share: FFA layers after named modules, running statistics up, per-channel
quantities down (FedFA, ICLR 2023, Alg. 1; VFDA Sec. 2.3).

Every message key is ``"<module name>.<quantity>"``, one ``(C,)`` float32 tensor each. The layers are
attached when a worker model is set up, sized by a dry forward pass of a zero input of the
federation's input shape; until the server has received statistics, it sends zero-length tensors,
which the layers read as "no federation information yet" (their neutral values, see
:class:`~fedaug.layers.ffa.FFALayer`).
"""

from __future__ import annotations

import abc
import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fedaug.core.device import module_device
from fedaug.core.errors import ConfigError, PayloadError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.layers import kernel as compiled
from fedaug.layers.kernel import KernelMode
from fedaug.layers.attach import AttachHandle, attach, stage_channels
from fedaug.layers.ffa import Drawn, FFALayer, KernelState
from fedaug.layers.functional import client_sharing_variance
from fedaug.methods.component import ClientCtx, Component, Phase, State, Uplink
from fedaug.methods.options import (DEFAULT_STATS_BETA, attach_points, check_at, check_choice, check_dp, check_noise,
                                    check_probability, check_stats_rule)
from fedaug.methods.recorded import Recorded
from fedaug.methods.robust import StatsRule, robust_variance
from fedaug.privacy.clip import clip_by_l2
from fedaug.privacy.mechanism import gaussian_mechanism
from fedaug.privacy.noise import NoiseScale, add_gaussian_noise
from fedaug.privacy.release import GaussianRelease

#: the uplink quantities of every layer: the client's running statistics (Eq. 4).
RUNNING = ("running_mean", "running_std")
#: a layer's per-client state in a grouped step (:class:`~fedaug.layers.ffa.Drawn`).
#: a layer's per-client state in a step on the PyTorch path (:class:`~fedaug.layers.ffa.Drawn`)
LAYER_STATE = ("running_mean", "running_std", "shared_mu", "shared_sigma", "update_weights", "momentum_weights")
#: and on the Triton path, where the kernel draws and keeps the first-batch weight (:class:`~fedaug.layers.ffa.KernelState`)
KERNEL_STATE = ("running_mean", "running_std", "shared_mu", "shared_sigma", "seed", "offset", "ema")
#: the layers' computation paths (option ``kernel``): the pure-PyTorch path, the device's fused kernel.
KERNEL_MODES = compiled.MODES


class FeatureStatsAug(Component, abc.ABC):
    """Base class of feature-statistics augmentations; subclasses say what travels and how layers use it.

    Args:
        at: module names to attach after (``model.named_modules()``); ``None``: the model's
            ``feature_stages``.
        p: probability of augmenting at each layer per forward pass.
        share_noise: std of Gaussian noise added to the running statistics a client uploads (0:
            none; a privacy perturbation, :mod:`fedaug.privacy.noise`); the client's own layers
            keep the clean values.
        share_noise_scale: ``"absolute"`` or ``"relative"`` (to each uploaded vector's std).
        dp_clip: C > 0: the Gaussian mechanism on the upload (:mod:`fedaug.privacy.mechanism`),
            **client-level**: the uploaded vector (every layer's running mean and std, together) is
            clipped to L2 norm C. The statistics are EMAs over the round's batches, so no per-sample
            bound holds; replacing a client's whole data by nothing (zero-out) moves the clipped
            vector by at most C. ``None`` (default): off.
        dp_noise: z >= 0: adds ``N(0, (z C)^2)`` to every uploaded value (needs ``dp_clip``); a
            noisy std is clamped at 0. Declares the release ``"<name> statistics"`` (every round,
            client). ``share_noise`` then adds its noise on top (post-processing).
        kernel: the layers' computation path: ``"off"`` (default), the pure-PyTorch path, whose
            numbers are the same on every machine; ``"on"``, the device's fused kernel
            (:mod:`fedaug.layers.kernel`): on the CPU the compiled C++ kernel (faster on small maps,
            needs a C++ compiler, built at setup, before training; float32 results that differ
            from ``"off"`` in the last bits, enough to move a 30-round run by points, docs/fedfa.md),
            on CUDA the Triton path (needs ``triton``, imported at setup): the kernel draws the coin
            and noise itself from a per-client seed (one draw from the client's ``ffa`` stream at
            :meth:`receive`) and updates the running statistics, with no host synchronisation,
            so it trains grouped and can be captured; ``"triton"``, the Triton path on any device
            (a CPU runs Triton's interpreter, ``TRITON_INTERPRET=1``: for tests). Results may
            differ between CPU or GPU models; a model on another device is refused at setup.
            Recorded in every run's config (:mod:`fedaug.methods.recorded`).
        stats_rule: how the server combines the clients' statistics across clients (Eq. 5):
            ``"mean"`` (the papers: their variance), ``"median"`` or ``"trimmed_mean"`` (a robust
            spread, :func:`~fedaug.methods.robust.robust_variance`, so that one client's outlying
            statistics cannot inflate every client's augmentation; docs/robustness.md).
        stats_beta: beta of ``stats_rule="trimmed_mean"``, the fraction of the clients trimmed at each
            end: per channel, the ``floor(beta M)`` largest and smallest of the M clients' statistics are
            dropped before the spread is taken; in [0, 0.5) (default 0.1); ignored by the other rules.
    """

    role = "augmentation"
    #: what the client uploads and how the server combines it
    pack_free: ClassVar[frozenset[str]] = frozenset({"share_noise", "share_noise_scale", "dp_clip", "dp_noise",
                                                    "stats_rule", "stats_beta"})
    #: per-layer quantities the server sends (subclasses set them per instance).
    down_keys: tuple[str, ...] = ()
    #: per-layer quantities the client sends.
    up_keys: tuple[str, ...] = ()
    #: the random stream of the layers' coin and noise (``ctx.rng``).
    purpose: ClassVar[str] = "ffa"
    #: written into every run's config even at the default (:mod:`fedaug.methods.recorded`).
    recorded_options: ClassVar[dict[str, Recorded]] = {"kernel": Recorded(
        default="off", legacy="auto",
        legacy_help="before the option existed, FEDAUG_FFA_KERNEL chose the path and its default 'auto' "
                    "took the compiled kernel whenever it built: 'on' if the run's machine had a C++ "
                    "compiler and FEDAUG_FFA_KERNEL was unset or auto, 'off' if it was off, or the run "
                    "predates the kernel")}

    def __init__(self, *, at: Sequence[str] | None, p: float, share_noise: float = 0.0,
                 share_noise_scale: NoiseScale = "absolute", dp_clip: float | None = None,
                 dp_noise: float | None = None, kernel: KernelMode = "off", stats_rule: StatsRule = "mean",
                 stats_beta: float = DEFAULT_STATS_BETA) -> None:
        self.at = check_at(self.name, at)
        self.p = check_probability(self.name, "p", p)
        check_noise(self.name, share_noise, share_noise_scale)
        self.share_noise, self.share_noise_scale = float(share_noise), share_noise_scale
        self.dp_clip, self.dp_noise = check_dp(self.name, dp_clip, dp_noise)
        if kernel == "auto":
            raise ConfigError(f"{self.name}.kernel must be one of {', '.join(KERNEL_MODES)}, got 'auto': 'auto' (the "
                              "kernel when it builds) made a run's numbers depend on the machine; choose one")
        self.kernel = check_choice(self.name, "kernel", kernel, KERNEL_MODES)
        self.double_backward = self.kernel == "off"  # the fused kernels' gradients are not differentiable
        self.stats_rule, self.stats_beta = check_stats_rule(self.name, stats_rule, stats_beta)
        self.handle: AttachHandle | None = None
        self._device: torch.device | None = None

    def declare_releases(self) -> None:
        """Set :attr:`releases` once the subclass has fixed :attr:`up_keys` (end of its ``__init__``):
        the client-level statistics release when ``dp_noise > 0`` and something is uploaded; a
        warning when the DP options are set but this variant uploads nothing."""
        if self.dp_clip is not None and not self.up_keys:
            warnings.warn(f"{self.name}.dp_clip/dp_noise do nothing: this variant uploads no statistics", UserWarning,
                          stacklevel=3)
        elif self.dp_clip is not None and self.dp_noise > 0:
            self.releases = (GaussianRelease(f"{self.name} statistics", self.dp_noise, self.dp_clip,
                                             "every_round", "client"),)

    # --- subclass hooks ------------------------------------------------------------------------
    @abc.abstractmethod
    def make_layer(self, channels: int) -> FFALayer:
        """The layer for one attach point with ``channels`` channels."""

    @abc.abstractmethod
    def configure_layer(self, ctx: ClientCtx, name: str, layer: FFALayer, down: dict[str, Tensor],
                        state: State) -> None:
        """Configure the ``layer`` after module ``name`` for this round from its downlink quantities
        (an empty dict before the first aggregation) and the per-client ``state``."""

    @abc.abstractmethod
    def server_quantities(self, means: Tensor, stds: Tensor) -> dict[str, Tensor]:
        """Per-layer downlink quantities ``(C,)`` from the clients' running statistics ``(M, C)``."""

    def client_state(self, layers: dict[str, FFALayer]) -> State:
        """Per-client state kept between rounds (default: none)."""
        return {}

    # --- helpers -------------------------------------------------------------------------------
    def cross_client_variance(self, stats: Tensor) -> Tensor:
        """The per-channel variance of the clients' statistics (FedFA Eq. 5, VFDA Eq. 5) under
        ``stats_rule``: :func:`~fedaug.layers.functional.client_sharing_variance` for ``"mean"``,
        else :func:`~fedaug.methods.robust.robust_variance`.

        Args:
            stats: ``(M, C)``, one running statistic per client.

        Returns:
            ``(C,)``, in ``stats``' dtype.
        """
        if self.stats_rule == "mean":
            return client_sharing_variance(stats)
        return robust_variance(stats, self.stats_rule, self.stats_beta).to(stats.dtype)

    def warn_if_stats_unused(self) -> None:
        """Warn that ``stats_rule`` does nothing when the variant exchanges no statistics."""
        if self.stats_rule != "mean" and not self.up_keys:
            warnings.warn(f"{self.name}.stats_rule={self.stats_rule!r} does nothing: this variant shares no "
                          "statistics", stacklevel=3)

    def names(self, model: nn.Module) -> list[str]:
        """The attach points: ``at``, or ``model.feature_stages``."""
        return attach_points(self.name, self.at, model)

    @property
    def triton_path(self) -> bool:
        """Whether the layers take the Triton path (:func:`fedaug.layers.kernel.uses_triton`): ``kernel =
        "triton"``, or ``"on"`` on a CUDA model (known after :meth:`setup`; before it, ``"on"`` counts as
        the CPU's compiled kernel)."""
        return self._device is not None and compiled.uses_triton(self.kernel, self._device)

    @property
    def layers(self) -> dict[str, FFALayer]:
        """Attached layers by module name (empty before :meth:`setup`)."""
        return dict(self.handle.layers) if self.handle is not None else {}  # type: ignore[arg-type]

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        """Attach one layer per attach point, sized by a dry forward pass of a zero ``(2, *input_shape)`` input.

        With ``kernel = "on"`` the device's fused kernel is built (CPU) or imported (CUDA: triton)
        here, and ``"triton"`` is checked against the device (:func:`~fedaug.layers.kernel.check_triton_device`),
        so a machine without a compiler or triton, or a CPU without Triton's interpreter, fails before training."""
        device = module_device(model)
        if self.kernel == "on":
            if device.type not in compiled.FUSED_DEVICES:
                raise ConfigError(f"{self.name}.kernel='on' runs a fused kernel, which exists for "
                                  f"{' and '.join(compiled.FUSED_DEVICES)} models, but the model is on {device}; "
                                  f"set {self.name}.kernel='off' (the PyTorch path, which runs on every device)")
            compiled.fused_op(device.type)
        elif self.kernel == "triton":
            compiled.check_triton_device(device, f"{self.name}.kernel")
        self._device = device
        names = self.names(model)
        reached = stage_channels(model, torch.zeros(2, *input_shape, device=device), names, call_order=True)
        self.handle = attach(model, {n: self.make_layer(reached[n]) for n in names}, owner=self.name)
        #: the attach points in the order a forward pass runs their layers (the order of their draws)
        self.call_order = list(reached)

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        """Configure every layer for the client (:meth:`configure_layer`); the layers draw from the
        client's ``ffa`` stream (:attr:`purpose`): on the Triton path each gets its seed from one draw of
        that stream (one int64 per layer, in call order, on the device) and its offset reset."""
        g = ctx.rng(self.purpose)
        seeds = dict(zip(self.call_order, torch.randint(2**63 - 1, (len(self.call_order),), generator=g,
                                                        device=g.device))) if self.triton_path else {}
        for name, layer in self.layers.items():
            down = {k: part[f"{name}.{k}"] for k in self.down_keys}
            sizes = {t.numel() for t in down.values()}
            if sizes - {0, layer.num_channels} or len(sizes) > 1:
                raise PayloadError(
                    f"{self.name} downlink for layer '{name}': expected {layer.num_channels} values per "
                    f"quantity (or 0 before the first aggregation), got {sorted(t.numel() for t in down.values())}"
                )
            layer.generator = g
            if seeds:
                layer.set_stream(seeds[name])
            self.configure_layer(ctx, name, layer, down if sizes == {layer.num_channels} else {}, state)

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        up = {f"{n}.{k}": getattr(layer, k).detach().clone().float() for n, layer in self.layers.items()
              for k in self.up_keys}
        if self.dp_clip is not None and up:
            up = self.privatize(up, ctx.rng("dp"))
        g = ctx.rng("noise")
        up = {k: add_gaussian_noise(v, self.share_noise, g, scale=self.share_noise_scale) for k, v in up.items()}
        return up, self.client_state(self.layers)

    # --- the step forms (fedaug.engine.client.step: eager, grouped and captured training) ------
    def group_blocker(self) -> str:
        """Nothing: the layers' draws are made before each step (the Triton kernel draws itself) and their state
        is the step's tensors. Under ``vmap`` the Triton path runs its batched launch; the others take the
        pure-PyTorch autograd path (the compiled CPU kernel has no batched form)."""
        return ""

    def group_capture(self, ctx: ClientCtx) -> State:
        """Each layer's running statistics and server quantities as :meth:`receive` set them ``(C,)``;
        on the Triton path also its seed, offset and first-batch weight (:data:`KERNEL_STATE`)."""
        keys = KERNEL_STATE if self.triton_path else LAYER_STATE
        return {n: {k: getattr(layer, k).detach().clone() for k in keys} for n, layer in self.layers.items()}

    def group_inputs(self, ctx: ClientCtx, batch_size: int) -> State:
        """Each layer's coin and noise of one forward (:meth:`~fedaug.layers.ffa.FFALayer.draw`), from
        the client's stream, in the order the forward runs the layers (as the layers draw them); nothing
        on the Triton path, whose kernel draws from the captured seed and offset."""
        if self.triton_path:
            return {}
        g, layers = ctx.rng(self.purpose), self.layers
        return {n: dict(zip(("use", "noise"), layers[n].draw(batch_size, g))) for n in self.call_order}

    @contextlib.contextmanager
    def group_forward(self, captured: State, inputs: State) -> Iterator[None]:
        """The layers run on one client's draws and state (:class:`~fedaug.layers.ffa.Drawn`), or on the
        Triton path on its state alone (:class:`~fedaug.layers.ffa.KernelState`)."""
        layers = self.layers
        try:
            if self.triton_path:
                for n, kept in captured.items():
                    layers[n].drawn = KernelState(**kept)
            for n, drawn in inputs.items():
                layers[n].drawn = Drawn(drawn["use"], drawn["noise"], **captured[n])
            yield
        finally:
            for layer in layers.values():
                layer.drawn = None

    def group_restore(self, ctx: ClientCtx, captured: State) -> None:
        """The client's layers as training left them (their running statistics, Eq. 4)."""
        with torch.no_grad():
            for n, layer in self.layers.items():
                for k, v in captured[n].items():
                    getattr(layer, k).copy_(v)

    def privatize(self, up: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
        """The client-level Gaussian mechanism on the upload: clip every ``(C,)`` statistic together
        to L2 norm ``dp_clip``, add ``N(0, (dp_noise * dp_clip)^2)`` to each value, clamp the stds at 0
        (post-processing; the uplink accepts no negative std)."""
        clipped, _ = clip_by_l2(up, self.dp_clip)
        noised = gaussian_mechanism(clipped, self.dp_clip, self.dp_noise, generator)
        return {k: v.clamp_min(0.0) if k.endswith(".running_std") else v for k, v in noised.items()}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        """An empty downlink, and each attach point's channel count from the layers :meth:`setup`
        attached (so uploads are checked against it from round 1)."""
        names = self.names(model)
        empty = torch.zeros(0, device=module_device(model))
        return {"layers": names, "part": {f"{n}.{k}": empty for n in names for k in self.down_keys},
                "channels": {n: layer.num_channels for n, layer in self.layers.items()}}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        return dict(server["part"])

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        return {f"{n}.{k}": TensorSpec((None,), torch.float32) for n in self.names(model) for k in self.down_keys}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        channels: dict[str, Any] = server["channels"]
        return {f"{n}.{k}": TensorSpec((channels.get(n),), torch.float32, low=0.0 if k == "running_std" else None)
                for n in server["layers"] for k in self.up_keys}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        if not self.up_keys:
            return server
        part, channels = {}, {}
        for n in server["layers"]:
            means = torch.stack([u.part[f"{n}.running_mean"] for u in uplinks])
            stds = torch.stack([u.part[f"{n}.running_std"] for u in uplinks])
            channels[n] = means.shape[1]
            for k, v in self.server_quantities(means, stds).items():
                part[f"{n}.{k}"] = v.float()
        return {**server, "part": part, "channels": channels}
