"""FedRDN: federated random data normalisation (FedRDN paper, Sec. 3.2, Alg. 1-2, Eq. 4-8).

Protocol (the paper computes statistics "before the start of training"; here, within the round hooks):

* The server keeps a per-client table ``ids (N,) int64, mean (N, C), std (N, C)`` and sends all of it
  to every sampled client each round (``8 N + 8 N C`` bytes).
* A client whose id is missing from the received table (its first round, or an upload that was
  rejected) or whose training set changed size computes its statistics (Eq. 4-5, on the raw training
  inputs) and uploads them once: ``mean, std`` of shape ``(1, C)``; otherwise ``(0, C)`` (0 bytes).
  It trains with the received table plus its own row, so in round 1 (empty table) a client
  normalises with its own statistics only; from round 2 on (full participation) every client draws
  from the whole federation. The server adds or replaces the uploaded rows.
* Training (``variant="random"``): every image is normalised with a matched ``(mean, std)`` pair
  drawn uniformly from the federation's pairs, re-drawn each time it is seen (Eq. 6).
  ``draw="batch"`` reproduces the public code instead: one draw per batch, mean and std drawn
  independently; in training mode BatchNorm removes a per-batch shift, so it augments far less.
* Evaluation on client k: its own pair (Eq. 7). ``variant="average"`` (FedRDN-V, Eq. 8): the
  unweighted average of the federation's pairs, in training and evaluation.
* ``stats_rule="median"`` or ``"trimmed_mean"`` (not in the paper; docs/robustness.md): the server
  keeps the rows as uploaded but sends them clamped per channel to the federation's robust range
  (:func:`~fedaug.methods.robust.clamp_to_robust_range`; the stds on a log scale, since a std is a
  scale), so one client's outlying pair cannot reach the other clients' inputs; FedRDN-V's average
  of the sent rows is then a winsorised mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal, NamedTuple, get_args

import torch
from torch import Tensor, nn

from fedaug.core.device import module_device
from fedaug.core.errors import ConfigError, PayloadError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.layers.functional import channel_stats, normalize_channels
from fedaug.layers.mixing import dataset_channel_stats
from fedaug.privacy.clip import clip_rows
from fedaug.privacy.mechanism import gaussian_mechanism
from fedaug.privacy.noise import NoiseScale, add_gaussian_noise
from fedaug.methods.options import DEFAULT_STATS_BETA, check_choice, check_dp, check_noise, check_stats_rule
from fedaug.methods.robust import StatsRule, clamp_to_robust_range
from fedaug.privacy.release import GaussianRelease
from fedaug.methods.component import Batch, ClientCtx, Component, Phase, State, Uplink
from fedaug.methods.recipe import METHODS

Variant = Literal["random", "average"]
VARIANTS: tuple[str, ...] = get_args(Variant)
Draw = Literal["image", "batch"]
DRAWS: tuple[str, ...] = get_args(Draw)


def client_stats(ctx: ClientCtx) -> tuple[Tensor, Tensor]:
    """This client's ``(mean, std)``, each ``(C,)``, from its raw training inputs (Eq. 4-5).

    Raises:
        ConfigError: a channel has zero spread over every image (normalising would divide by 0).
    """
    mean, std = dataset_channel_stats(ctx.data.x)
    if not bool((std > 0).all()):
        bad = torch.nonzero(std <= 0).flatten().tolist()
        raise ConfigError(f"fedrdn: client {ctx.client_id} has constant input channel(s) {bad} (std 0); "
                          "FedRDN cannot normalise them: drop those channels or use another augmentation")
    return mean, std


def private_client_stats(x: Tensor, max_norm: float, noise_multiplier: float, generator: torch.Generator,
                         *, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """The sample-level Gaussian mechanism on a client's statistics (Eq. 4-5 with a bounded sensitivity).

    Each image's vector ``v_i = (mu_i, sigma_i)`` of its channel means and stds (``2C`` values,
    Eq. 5) is clipped to L2 norm ``max_norm``; their average over the client's ``n`` images (Eq. 4)
    changes by at most ``max_norm / n`` when one image is added or removed (zero-out, ``n``
    public), so it gets ``N(0, (z max_norm / n)^2)`` per value. Without clipping's effect and
    noise this is :func:`~fedaug.layers.mixing.dataset_channel_stats`.

    Args:
        x: ``(n, C, *spatial)`` the client's raw training inputs.
        max_norm: C_clip > 0.
        noise_multiplier: z >= 0.
        generator: the client's ``ctx.rng("dp")``.
        chunk: images per step of the per-image statistics (bounds memory).

    Returns:
        ``mean, std``, each ``(C,)`` float32; the std clamped at 1e-6 (post-processing).
    """
    rows = torch.cat([torch.cat(channel_stats(x[i : i + chunk].to(torch.float64), eps=0.0), dim=1)
                      for i in range(0, x.shape[0], chunk)])  # (n, 2C)
    mean = clip_rows(rows, max_norm).mean(0)
    v = gaussian_mechanism({"v": mean}, max_norm / x.shape[0], noise_multiplier, generator)["v"].float()
    c = x.shape[1]
    return v[:c], v[c:].clamp_min(1e-6)


def draw_pairs(num_pairs: int, batch_size: int, draw: str, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Row indices of the means and of the stds used for each image, each ``(B,)`` int64.

    ``draw="image"``: one matched pair per image, uniform over ``num_pairs`` (Eq. 6).
    ``draw="batch"``: one mean row and one independent std row for the whole batch (public code).
    """
    if draw == "image":
        idx = torch.randint(num_pairs, (batch_size,), generator=generator, device=generator.device)
        return idx, idx
    if draw == "batch":
        i, j = torch.randint(num_pairs, (2,), generator=generator, device=generator.device)
        return i.expand(batch_size), j.expand(batch_size)
    raise ValueError(f"draw must be one of {', '.join(DRAWS)}, got {draw!r}")


class _Kept(NamedTuple):
    """What FedRDN keeps of one client for a phase, by client id (:meth:`FedRDN.receive`)."""

    train: tuple[Tensor, Tensor] | None  # (N', C) pairs, or one (C,) pair for FedRDN-V (training only)
    eval: tuple[Tensor, Tensor]  # one (C,) pair
    upload: tuple[Tensor, Tensor] | None  # the client's own pair, (1, C) each, when it was computed now
    channels: int


@METHODS.register("fedrdn", "FedRDN: normalise each input with a random client's channel statistics")
class FedRDN(Component):
    """Federated random data normalisation (Alg. 1: statistics; Alg. 2: augmentation).

    Put it first in ``method.augs``: it normalises the raw inputs, as conventional normalisation
    would. Works for any number of channels and spatial rank, classification or segmentation.

    Args:
        variant: ``"random"`` (FedRDN: Eq. 6 in training, Eq. 7 at test) or ``"average"``
            (FedRDN-V, Eq. 8: the federation's average pair in training and test).
        draw: ``"image"`` (the paper: a matched pair per image) or ``"batch"`` (the public code: one
            draw per batch, mean and std unmatched; weaker under BatchNorm).
        share_noise: std of Gaussian noise added to the statistics a client uploads (0: none; a
            privacy perturbation, :mod:`fedaug.privacy.noise`); a noisy std is clamped at 1e-6.
            Every client, the uploader included, then uses the table's (noisy) pairs.
        share_noise_scale: ``"absolute"`` or ``"relative"`` (to the std of the uploaded values).
        dp_clip: C > 0: the sample-level Gaussian mechanism on the uploaded statistics
            (:func:`private_client_stats`): each image's (channel means, channel stds) vector is
            clipped to C before the average over the client's n images; ``None`` (default): off.
        dp_noise: z >= 0, noise ``N(0, (z C / n)^2)`` per value (needs ``dp_clip``). Declares the
            release ``"fedrdn statistics"`` (once per client, sample-level; its sensitivity C is that
            of the sum, C / n that of the mean). ``share_noise`` then adds its noise on top.
        stats_rule: ``"mean"`` (default: the table as uploaded, the paper), ``"median"`` or
            ``"trimmed_mean"`` (the table sent clamped to the rows' robust range, see above). A
            client whose own pair lies outside that range also trains and is evaluated with the
            clamped pair.
        stats_beta: beta of ``stats_rule="trimmed_mean"``, the fraction of the clients trimmed at each
            end: per channel, the ``floor(beta M)`` largest and smallest of the M clients' statistics are
            dropped before the range is taken; in [0, 0.5) (default 0.1); ignored by the other rules.

    >>> fedrdn = FedRDN(variant="random", draw="image")
    """

    name = "fedrdn"
    #: every option: the statistics it uploads and the normalisation made per client before each step
    pack_free: ClassVar[frozenset[str]] = frozenset({"variant", "draw", "share_noise", "share_noise_scale", "dp_clip",
                                                    "dp_noise", "stats_rule", "stats_beta"})
    phases = ("train", "evaluate")

    def __init__(self, *, variant: Variant = "random", draw: Draw = "image", share_noise: float = 0.0,
                 share_noise_scale: NoiseScale = "absolute", dp_clip: float | None = None,
                 dp_noise: float | None = None, stats_rule: StatsRule = "mean", stats_beta: float = DEFAULT_STATS_BETA) -> None:
        check_noise(self.name, share_noise, share_noise_scale)
        self.stats_rule, self.stats_beta = check_stats_rule(self.name, stats_rule, stats_beta)
        self.share_noise, self.share_noise_scale = float(share_noise), share_noise_scale
        self.dp_clip, self.dp_noise = check_dp(self.name, dp_clip, dp_noise)
        if self.dp_clip is not None and self.dp_noise > 0:
            self.releases = (GaussianRelease("fedrdn statistics", self.dp_noise, self.dp_clip, "once", "sample"),)
        self.variant = check_choice(self.name, "variant", variant, VARIANTS)
        self.draw = check_choice(self.name, "draw", draw, DRAWS)
        self._phase: tuple[int, str] = (-1, "")  # the (round, phase) whose clients _clients keeps
        self._clients: dict[int, _Kept] = {}
        self._in_channels: int | None = None  # the inputs' channels, from setup

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        self._in_channels = input_shape[0]  # what every uploaded pair holds, known from round 1

    # --- client side -----------------------------------------------------------------------
    def _federation(self, ctx: ClientCtx, table: Part, state: State) -> tuple[Tensor, Tensor, int, bool]:
        """The federation's pairs ``(N', C)`` including this client's, the row of its own pair, and
        whether that pair was computed now (and must be uploaded)."""
        ids, mean, std = table["ids"], table["mean"], table["std"]
        if ids.shape[0] != mean.shape[0] or mean.shape != std.shape:
            raise PayloadError(f"fedrdn: inconsistent statistics table: ids {tuple(ids.shape)}, "
                               f"mean {tuple(mean.shape)}, std {tuple(std.shape)}")
        mine = ids == ctx.client_id
        if bool(mine.any()) and state.get("n") == len(ctx.data):
            return mean, std, int(torch.nonzero(mine)[0]), False
        own_mean, own_std = client_stats(ctx)
        if mean.shape[0] and mean.shape[1] != own_mean.shape[0]:
            raise PayloadError(f"fedrdn: the server's statistics have {mean.shape[1]} channels, "
                               f"client {ctx.client_id}'s inputs {own_mean.shape[0]}")
        others = ~mine
        if mean.shape[0] == 0:  # nothing received yet (round 1)
            mean, std = mean.reshape(0, own_mean.shape[0]), std.reshape(0, own_std.shape[0])
        mean, std = torch.cat([mean[others], own_mean[None]]), torch.cat([std[others], own_std[None]])
        return mean, std, mean.shape[0] - 1, True

    def _pairs(self, mean: Tensor, std: Tensor, own: int, training: bool) -> tuple[Tensor, Tensor]:
        if self.variant == "average":  # Eq. 8
            return mean.mean(0), std.mean(0)
        if training:  # Eq. 6: draw from all pairs
            return mean, std
        return mean[own], std[own]  # Eq. 7: the client's own pair

    def group_blocker(self) -> str:
        """Nothing: its per-step work is the input's normalisation, made before each step, and what it keeps
        of a client is kept by client id (so a group's clients, received one after another, keep theirs)."""
        return ""

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        mean, std, own, fresh = self._federation(ctx, part, state)
        if self._phase != (ctx.round, ctx.phase):  # what the last phase kept is no longer needed
            self._phase, self._clients = (ctx.round, ctx.phase), {}
        upload = (mean[own : own + 1], std[own : own + 1]) if fresh and ctx.training else None
        train = self._pairs(mean, std, own, training=True) if ctx.training else None
        # evaluation: the client's own pair (Eq. 7), or FedRDN-V's average (Eq. 8)
        self._clients[ctx.client_id] = _Kept(train, self._pairs(mean, std, own, training=False), upload, mean.shape[1])

    def transform_batch(self, ctx: ClientCtx, batch: Batch) -> Batch:
        kept = self._clients[ctx.client_id]
        mean, std = kept.train if ctx.training else kept.eval
        if mean.dim() == 1:  # evaluation, or FedRDN-V
            return Batch(normalize_channels(batch.x, mean, std), batch.y)
        i, j = draw_pairs(mean.shape[0], batch.x.shape[0], self.draw, ctx.rng("pick"))
        return Batch(normalize_channels(batch.x, mean[i], std[j]), batch.y)

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        kept = self._clients[ctx.client_id]
        empty = torch.zeros(0, kept.channels, device=ctx.device)
        mean, std = kept.upload or (empty, empty)
        if kept.upload is not None and self.dp_clip is not None:
            mean, std = (v[None] for v in private_client_stats(ctx.data.x, self.dp_clip, self.dp_noise, ctx.rng("dp")))
        g = ctx.rng("noise")
        mean = add_gaussian_noise(mean.clone(), self.share_noise, g, scale=self.share_noise_scale)
        std = add_gaussian_noise(std.clone(), self.share_noise, g, scale=self.share_noise_scale)
        return {"mean": mean, "std": std.clamp_min(1e-6) if self.share_noise else std}, {"n": len(ctx.data)}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        device = module_device(model)
        return {"ids": torch.zeros(0, dtype=torch.int64, device=device), "mean": torch.zeros(0, 0, device=device),
                "std": torch.zeros(0, 0, device=device)}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        part = {k: server[k].clone() for k in ("ids", "mean", "std")}
        if self.stats_rule != "mean" and part["mean"].shape[0]:
            part["mean"] = clamp_to_robust_range(part["mean"], self.stats_rule, self.stats_beta)
            part["std"] = clamp_to_robust_range(part["std"].log(), self.stats_rule, self.stats_beta).exp()
        return part

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        return {"ids": TensorSpec((None,), torch.int64), "mean": TensorSpec((None, None), torch.float32),
                "std": TensorSpec((None, None), torch.float32)}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        return {"mean": TensorSpec(("rows", self._in_channels), torch.float32),
                "std": TensorSpec(("rows", self._in_channels), torch.float32, low=0.0)}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        rows = {int(i): (m, s) for i, m, s in zip(server["ids"], server["mean"], server["std"])}
        for u in uplinks:
            if u.part["mean"].shape[0] == 1 and bool((u.part["std"] > 0).all()):
                rows[u.client_id] = (u.part["mean"][0], u.part["std"][0])
        if not rows:
            return server
        ids = sorted(rows)
        return {"ids": torch.tensor(ids, dtype=torch.int64, device=server["ids"].device),
                "mean": torch.stack([rows[i][0] for i in ids]), "std": torch.stack([rows[i][1] for i in ids])}
