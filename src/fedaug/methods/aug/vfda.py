"""VFDA: vicinal feature-statistics augmentation for federated (3D) segmentation (Huang et al.,
2023, Sec. 2.1-2.4), with its ablations "w/o Global" and "w/o EMD"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from torch import Tensor

from fedaug.layers.ffa import NOISE_SCALES, FFALayer, NoiseScaling
from fedaug.layers.kernel import KernelMode
from fedaug.methods.aug.featstats import RUNNING, FeatureStatsAug
from fedaug.methods.options import DEFAULT_STATS_BETA, check_choice, check_probability, check_range
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import METHODS
from fedaug.methods.recorded import Recorded
from fedaug.methods.robust import StatsRule
from fedaug.privacy.noise import NoiseScale


def emd_momentum(eta0: float, round_: int) -> float:
    """VFDA's exponential momentum decay ``eta = eta0 * exp(-r)``, clipped to [0, 1].

    Eq. 4 weights the old running statistic by eta; the paper's eta0 = 10 gives 3.7 and 1.4 in
    rounds 1 and 2, which would extrapolate away from the data. Read as a weight, eta is clipped
    to 1 (keep the old value), so the statistics first move in round 3 (eta = 0.50).

    >>> [round(emd_momentum(10.0, r), 3) for r in (1, 2, 3, 4)]
    [1.0, 1.0, 0.498, 0.183]
    """
    return min(1.0, eta0 * math.exp(-round_))


@METHODS.register("vfda", "VFDA (Huang et al. 2023): vicinal feature-statistics augmentation for segmentation")
class VFDA(FeatureStatsAug):
    """Vicinal feature-level data augmentation: an :class:`~fedaug.layers.ffa.FFALayer` after each
    encoder layer, sampling variance = global variance x local variance (product fusion, no
    t-modulation), running statistics with exponential momentum decay over rounds (EMD).

    Running statistics are per-client state carried across rounds (the decay is over rounds); a
    client's first update copies its first batch's statistics (the paper gives no initial value).
    Before the server has statistics (round 1) the global variance is 1, so the local variance
    alone is used.

    Args:
        p: probability of augmenting per layer and forward (the paper always augments: 1).
        eta0: initial EMD momentum (paper 10); see :func:`emd_momentum`.
        emd: ``False`` is the ablation "w/o EMD": constant ``momentum``.
        momentum: the constant weight of the old statistic when ``emd`` is off.
        global_variance: ``False`` is the ablation "w/o Global": local variance only, nothing sent.
        noise_scale: ``"std"`` (default) scales the noise by the square root of the fused
            variance, Eq. 6's ``N(mu, Sigma^2)``; ``"variance"`` by the fused variance itself, Eq. 7
            as printed (the default until issue 18: that noise measured 5e-8 to 2e-3 of the
            features' spread, below float32 resolution for up to half of the channel means, so
            VFDA was its base algorithm in practice; docs/fedfa.md). Recorded in every run.
        at: module names; default the model's ``feature_stages`` (``unet3d``: the encoder).
        eps: added to the spatial variance before the square root.
        share_noise, share_noise_scale, dp_clip, dp_noise: as
            :class:`~fedaug.methods.aug.featstats.FeatureStatsAug`.
        kernel: ``"off"`` (default, the pure-PyTorch path), ``"on"`` (the device's fused kernel) or
            ``"triton"`` (the Triton path, the only one that trains grouped: it keeps each client's
            first-batch weight and momentum in tensors); see
            :class:`~fedaug.methods.aug.featstats.FeatureStatsAug`.
        stats_rule: ``"mean"`` (default), ``"median"`` or ``"trimmed_mean"``: the global variance as
            a robust spread (:meth:`~fedaug.methods.aug.featstats.FeatureStatsAug.cross_client_variance`).
        stats_beta: as :class:`~fedaug.methods.aug.featstats.FeatureStatsAug`.

    >>> vfda = VFDA(noise_scale="variance", at=["enc1", "enc2"])  # Eq. 7 as printed
    """

    name = "vfda"
    recorded_options: ClassVar[dict[str, Recorded]] = {**FeatureStatsAug.recorded_options, "noise_scale": Recorded(
        default="std", legacy="variance", legacy_known=True,
        legacy_help="VFDA's noise was scaled by the fused variance (Eq. 7 as printed) until the default "
                    "became 'std' (issue 18)")}

    def __init__(self, *, p: float = 1.0, eta0: float = 10.0, emd: bool = True, momentum: float = 0.99,
                 global_variance: bool = True, noise_scale: NoiseScaling = "std",
                 at: Sequence[str] | None = None, eps: float = 1e-6, share_noise: float = 0.0,
                 share_noise_scale: NoiseScale = "absolute", dp_clip: float | None = None, dp_noise: float | None = None,
                 kernel: KernelMode = "off", stats_rule: StatsRule = "mean", stats_beta: float = DEFAULT_STATS_BETA) -> None:
        super().__init__(at=at, p=p, share_noise=share_noise, share_noise_scale=share_noise_scale, dp_clip=dp_clip,
                         dp_noise=dp_noise, kernel=kernel, stats_rule=stats_rule, stats_beta=stats_beta)
        check_range("vfda.eta0", eta0, lo=0.0)
        check_range("vfda.eps", eps, lo=0.0, lo_open=True)
        self.eta0, self.emd, self.eps = float(eta0), bool(emd), float(eps)
        self.momentum = check_probability(self.name, "momentum", momentum)
        self.global_variance = bool(global_variance)
        self.noise_scale = check_choice(self.name, "noise_scale", noise_scale, NOISE_SCALES)
        if self.global_variance:
            self.down_keys, self.up_keys = ("var_mu", "var_sigma"), RUNNING
        self.warn_if_stats_unused()
        self.declare_releases()

    def make_layer(self, channels: int) -> FFALayer:
        return FFALayer(channels, p=self.p, variance="product" if self.global_variance else "client",
                        noise_scale=self.noise_scale, eps=self.eps, kernel=self.kernel)

    def configure_layer(self, ctx: ClientCtx, name: str, layer: FFALayer, down: dict[str, Tensor],
                        state: State) -> None:
        layer.momentum = emd_momentum(self.eta0, ctx.round) if self.emd else self.momentum
        if f"{name}.running_mean" in state:
            layer.reset_running_stats(state[f"{name}.running_mean"], state[f"{name}.running_std"])
        else:
            layer.reset_running_stats(from_first_batch=True)
        if down:
            layer.set_server_variances(down["var_mu"], down["var_sigma"])
        else:
            layer.clear_shared()

    def client_state(self, layers: dict[str, FFALayer]) -> State:
        if not self.global_variance:
            return {}
        return {f"{n}.{k}": getattr(layer, k).detach().clone() for n, layer in layers.items() for k in RUNNING}

    def server_quantities(self, means: Tensor, stds: Tensor) -> dict[str, Tensor]:
        return {"var_mu": self.cross_client_variance(means), "var_sigma": self.cross_client_variance(stds)}  # Eq. 5
