"""FedFA: federated feature augmentation (Zhou & Konukoglu, ICLR 2023, arXiv:2301.12995, Alg. 1-2),
its ablations (FedFA-R, FedFA-C, direct fusion: Sec. 4.1, Table 7; eligible layers: Table 8) and a
switch reproducing the authors' public code (docs/fedfa.md)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.layers.ffa import FFALayer
from fedaug.layers.functional import client_sharing_variance, t_modulation
from fedaug.layers.kernel import KernelMode
from fedaug.methods.aug.featstats import RUNNING, FeatureStatsAug
from fedaug.methods.options import DEFAULT_STATS_BETA, check_choice, check_probability, check_range
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import METHODS
from fedaug.methods.robust import StatsRule
from fedaug.privacy.noise import NoiseScale

#: the variance option's values
Variance = Literal["fused", "direct", "client", "fixed"]
#: variance option -> (downlink quantities per layer, uplink quantities per layer)
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fused": (("gamma_mu", "gamma_sigma"), RUNNING),  # FedFA, Eq. 5-7
    "direct": (("var_mu", "var_sigma"), RUNNING),  # Table 7, "Direct Fusion"
    "client": ((), ()),  # FedFA-C
    "fixed": ((), ()),  # FedFA-R
}
#: what the public code exchanges per layer: averaged running statistics and raw variances down.
COMPAT_DOWN = ("running_mean", "running_std", "var_mu", "var_sigma")
#: the public code's epsilon in the fusion coefficient ``1 / (1 + 1 / (v + eps))``.
COMPAT_EPS = 1e-6


@METHODS.register("fedfa", "FedFA (ICLR 2023): federation-aware Gaussian resampling of feature statistics")
class FedFA(FeatureStatsAug):
    """Federated feature augmentation: an :class:`~fedaug.layers.ffa.FFALayer` after each attach point.

    Each round the client resets its running statistics to 0/1 (Alg. 1 line 3), trains with the
    layers active, and uploads them (Eq. 4); the server computes the per-channel variance of the
    participating clients' statistics (Eq. 5) and its Student's-t modulation gamma (Eq. 6), which
    it sends to every client for the next round (Eq. 7). Round 1 has no statistics yet: gamma = 1.

    Args:
        p: probability of augmenting at each layer per forward pass (paper 0.5).
        momentum: alpha of the running statistics (Eq. 4, paper 0.99).
        variance: ``"fused"`` (FedFA, Eq. 7), ``"direct"`` (Table 7: ``(var + 1) * v``, raw
            variances sent), ``"client"`` (FedFA-C: client-specific variance only, nothing
            exchanged), ``"fixed"`` (FedFA-R: std ``lam`` for every channel, nothing exchanged).
        lam: the standard deviation of ``variance="fixed"`` (paper 0.5).
        at: module names to attach after; default the model's ``feature_stages`` (Table 8 sets
            are lists of stage names).
        official_compat: reproduce the public code instead of the paper: unbiased spatial and
            batch variances (+1e-6), one scalar client-sharing variance (so gamma = 1 in every
            channel), fusion coefficient computed by the client with its epsilon, running
            statistics averaged by the server (uniformly) and carried into the next round. Pair
            it with ``fedavg.weighting = "uniform"`` (preset ``fedfa_official``).
        eps: added to the spatial variance before the square root.
        share_noise, share_noise_scale, dp_clip, dp_noise: as
            :class:`~fedaug.methods.aug.featstats.FeatureStatsAug`.
        kernel: ``"off"`` (default, the pure-PyTorch path), ``"on"`` (the device's fused kernel) or
            ``"triton"`` (the Triton path); see :class:`~fedaug.methods.aug.featstats.FeatureStatsAug`.
        stats_rule: ``"mean"`` (default, Eq. 5), ``"median"`` or ``"trimmed_mean"``: the
            cross-client variance of Eq. 5 as a robust spread
            (:meth:`~fedaug.methods.aug.featstats.FeatureStatsAug.cross_client_variance`); not with
            ``official_compat``.
        stats_beta: as :class:`~fedaug.methods.aug.featstats.FeatureStatsAug`.

    >>> fedfa = FedFA(p=0.5, variance="fused", at=["block1", "block2"])
    """

    name = "fedfa"

    def __init__(self, *, p: float = 0.5, momentum: float = 0.99, variance: Variance = "fused",
                 lam: float | None = None, at: Sequence[str] | None = None,
                 official_compat: bool = False, eps: float = 1e-6, share_noise: float = 0.0,
                 share_noise_scale: NoiseScale = "absolute", dp_clip: float | None = None, dp_noise: float | None = None,
                 kernel: KernelMode = "off", stats_rule: StatsRule = "mean", stats_beta: float = DEFAULT_STATS_BETA) -> None:
        super().__init__(at=at, p=p, share_noise=share_noise, share_noise_scale=share_noise_scale, dp_clip=dp_clip,
                         dp_noise=dp_noise, kernel=kernel, stats_rule=stats_rule, stats_beta=stats_beta)
        self.momentum = check_probability(self.name, "momentum", momentum)
        self.variance = check_choice(self.name, "variance", variance, tuple(VARIANTS))
        if lam is not None:
            check_range("fedfa.lam", lam, lo=0.0)
        check_range("fedfa.eps", eps, lo=0.0, lo_open=True)
        if lam is not None and variance != "fixed":
            warnings.warn(f"fedfa.lam={lam} does nothing with variance={variance!r} (only 'fixed' uses it)",
                          stacklevel=2)
        self.lam = 0.5 if lam is None else float(lam)
        if official_compat and variance != "fused":
            raise ConfigError(f"fedfa.official_compat reproduces the public code's fused variance; "
                              f"got variance={variance!r}: drop one of the two options")
        if official_compat and self.stats_rule != "mean":
            raise ConfigError(f"fedfa.official_compat reproduces the public code, which averages; got "
                              f"stats_rule={stats_rule!r}: drop one of the two options")
        if self.p == 0.0:
            warnings.warn("fedfa.p=0 never augments: FedFA is then FedAvg plus statistics traffic", stacklevel=2)
        self.official_compat, self.eps = bool(official_compat), float(eps)
        self.down_keys, self.up_keys = (COMPAT_DOWN, RUNNING) if official_compat else VARIANTS[variance]
        self.warn_if_stats_unused()
        self.declare_releases()

    def make_layer(self, channels: int) -> FFALayer:
        return FFALayer(channels, p=self.p, momentum=self.momentum, variance=self.variance, lam=self.lam,
                        estimator="official" if self.official_compat else "paper", eps=self.eps, kernel=self.kernel)

    def configure_layer(self, ctx: ClientCtx, name: str, layer: FFALayer, down: dict[str, Tensor],
                        state: State) -> None:
        if self.official_compat:  # carried over: the federation's average (0/1 before any)
            layer.reset_running_stats(down.get("running_mean"), down.get("running_std"))
            if down:
                layer.set_gamma(t_modulation(down["var_mu"], eps=COMPAT_EPS),
                                t_modulation(down["var_sigma"], eps=COMPAT_EPS))
            else:
                layer.clear_shared()
            return
        layer.reset_running_stats()  # Alg. 1, line 3
        if "gamma_mu" in down:
            layer.set_gamma(down["gamma_mu"], down["gamma_sigma"])
        elif "var_mu" in down:
            layer.set_server_variances(down["var_mu"], down["var_sigma"])
        else:
            layer.clear_shared()

    def server_quantities(self, means: Tensor, stds: Tensor) -> dict[str, Tensor]:
        if self.official_compat:
            return {"running_mean": means.mean(0), "running_std": stds.mean(0),
                    "var_mu": client_sharing_variance(means, per_channel=False, unbiased=True),
                    "var_sigma": client_sharing_variance(stds, per_channel=False, unbiased=True)}
        var_mu, var_sigma = self.cross_client_variance(means), self.cross_client_variance(stds)  # Eq. 5
        if self.variance == "fused":
            return {"gamma_mu": t_modulation(var_mu), "gamma_sigma": t_modulation(var_sigma)}  # Eq. 6
        return {"var_mu": var_mu, "var_sigma": var_sigma}
