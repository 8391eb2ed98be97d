"""What FedFA and VFDA share: FFA layers after named modules, running statistics up, per-channel
quantities down (FedFA, ICLR 2023, Alg. 1; VFDA Sec. 2.3).

Every message key is ``"<module name>.<quantity>"``, one ``(C,)`` float32 tensor each. Channel counts
are read once per worker from the first client's data (the server never needs data): until the
server has received statistics, it sends zero-length tensors, which the layers read as "no
federation information yet" (their neutral values, see :class:`~fedaug.layers.ffa.FFALayer`).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError, PayloadError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.layers import kernel as compiled
from fedaug.layers.attach import AttachHandle, attach, stage_channels
from fedaug.layers.ffa import FFALayer
from fedaug.methods.component import ClientCtx, Component, State, Uplink
from fedaug.methods.recorded import Recorded
from fedaug.privacy.noise import add_gaussian_noise, check_noise

#: the uplink quantities of every layer: the client's running statistics (Eq. 4).
RUNNING = ("running_mean", "running_std")
#: the layers' computation paths (option ``kernel``): the pure-PyTorch path, the compiled kernel.
KERNEL_MODES = compiled.MODES


def check_probability(owner: str, key: str, value: float) -> float:
    """``value`` if in [0, 1], else a :class:`ConfigError` naming ``owner.key``."""
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{owner}.{key} must be in [0, 1], got {value}")
    return float(value)


def check_choice(owner: str, key: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if in ``allowed``, else a :class:`ConfigError` listing the choices."""
    if value not in allowed:
        raise ConfigError(f"{owner}.{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


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
        kernel: the layers' computation path: ``"off"`` (default), the pure-PyTorch path, whose
            numbers are the same on every machine; ``"on"``, the compiled CPU kernel
            (:mod:`fedaug.layers.kernel`): faster on small maps, needs a C++ compiler (built at
            setup, before training), float32 results that differ from ``"off"`` in the last bits
            (enough to move a 30-round run by points, docs/fedfa.md) and may differ between CPU models.
            Recorded in every run's config (:mod:`fedaug.methods.recorded`).
    """

    role = "augmentation"
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
                 share_noise_scale: str = "absolute", kernel: str = "off") -> None:
        if at is not None and (isinstance(at, str) or not all(isinstance(n, str) for n in at) or not at):
            raise ConfigError(f"{self.name}.at must be a non-empty list of module names, got {at!r}")
        self.at = None if at is None else list(at)
        self.p = check_probability(self.name, "p", p)
        check_noise(self.name, share_noise, share_noise_scale)
        self.share_noise, self.share_noise_scale = float(share_noise), share_noise_scale
        if kernel == "auto":
            raise ConfigError(f"{self.name}.kernel must be one of {', '.join(KERNEL_MODES)}, got 'auto': 'auto' (the "
                              "kernel when it builds) made a run's numbers depend on the machine; choose one")
        self.kernel = check_choice(self.name, "kernel", kernel, KERNEL_MODES)
        self.handle: AttachHandle | None = None

    # --- subclass hooks ------------------------------------------------------------------------
    @abc.abstractmethod
    def make_layer(self, channels: int) -> FFALayer:
        """The layer for one attach point with ``channels`` channels."""

    @abc.abstractmethod
    def receive(self, ctx: ClientCtx, name: str, layer: FFALayer, down: dict[str, Tensor],
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
    def names(self, model: nn.Module) -> list[str]:
        """The attach points: ``at``, or ``model.feature_stages``."""
        names = self.at if self.at is not None else list(getattr(model, "feature_stages", ()))
        if not names:
            raise ConfigError(
                f"{self.name}: {type(model).__name__} declares no feature_stages; set "
                f"method.options.{self.name}.at to a list of module names"
            )
        return names

    @property
    def layers(self) -> dict[str, FFALayer]:
        """Attached layers by module name (empty before the first round on this worker)."""
        return dict(self.handle.layers) if self.handle is not None else {}  # type: ignore[arg-type]

    def attach_to(self, model: nn.Module, example_input: Tensor) -> dict[str, FFALayer]:
        """Attach one layer per attach point, sized by a dry forward pass on ``example_input``."""
        if self.handle is None:
            channels = stage_channels(model, example_input, self.names(model))
            self.handle = attach(model, {n: self.make_layer(c) for n, c in channels.items()})
        return self.layers

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module) -> None:
        self.names(model)  # fail before training if there is nowhere to attach
        if self.kernel == "on":
            compiled.restyle_op()  # build or load it now: without a compiler, fail before training

    def round_start(self, ctx: ClientCtx, part: Part, state: State) -> None:
        layers = self.attach_to(ctx.model, ctx.data.x[:2])
        g = ctx.rng(self.purpose)
        for name, layer in layers.items():
            down = {k: part[f"{name}.{k}"] for k in self.down_keys}
            sizes = {t.numel() for t in down.values()}
            if sizes - {0, layer.num_channels} or len(sizes) > 1:
                raise PayloadError(
                    f"{self.name} downlink for layer '{name}': expected {layer.num_channels} values per "
                    f"quantity (or 0 before the first aggregation), got {sorted(t.numel() for t in down.values())}"
                )
            layer.generator = g
            self.receive(ctx, name, layer, down if sizes == {layer.num_channels} else {}, state)

    def round_end(self, ctx: ClientCtx) -> tuple[Part, State]:
        g = ctx.rng("noise")
        up = {f"{n}.{k}": add_gaussian_noise(getattr(layer, k).detach().clone().float(), self.share_noise, g,
                                             scale=self.share_noise_scale)
              for n, layer in self.layers.items() for k in self.up_keys}
        return up, self.client_state(self.layers)

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> State:
        names = self.names(model)
        empty = torch.zeros(0)
        return {"layers": names, "part": {f"{n}.{k}": empty for n in names for k in self.down_keys},
                "channels": {}}

    def downlink(self, server: State, client_id: int) -> Part:
        return dict(server["part"])

    def downlink_spec(self, model: nn.Module) -> Spec:
        return {f"{n}.{k}": TensorSpec((None,), torch.float32) for n in self.names(model) for k in self.down_keys}

    def uplink_spec(self, server: State) -> Spec:
        channels: dict[str, Any] = server["channels"]
        return {f"{n}.{k}": TensorSpec((channels.get(n),), torch.float32)
                for n in server["layers"] for k in self.up_keys}

    def aggregate(self, server: State, uplinks: Sequence[Uplink]) -> State:
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
