"""FedMix and NaiveMix: mixup with the federation's averaged data (Yoon et al., ICLR 2021, arXiv:2107.00233).

Mean augmented federated learning (MAFL): each client splits its training set into batches of
``M_k = mean_batch`` samples and shares every batch's mean image and mean one-hot label, once
(:mod:`~fedaug.methods.aug._sharing`). Local training pairs each sample ``(x_i, y_i)`` with a mean
``(x_bar_j, y_bar_j)`` of another client, drawn uniformly per sample (a one-sample estimate of the
paper's average over the received means J), and minimises

* FedMix (the paper's Taylor-approximated global-mixup loss, Sec. 3.2)::

      (1 - lam) l(f((1 - lam) x_i), y_i) + lam l(f((1 - lam) x_i), y_bar_j)
          + lam * <d[(1 - lam) l(f(x), y_i)] / dx at x = (1 - lam) x_i,  x_bar_j>

  i.e. the first-order expansion of ``l(f((1 - lam) x_i + lam x_bar_j), (1 - lam) y_i + lam y_bar_j)``
  around ``(1 - lam) x_i``; the input gradient is taken with ``create_graph`` (double backward).
* NaiveMix (``mode="naive"``): ``l(f((1 - lam) x_i + lam x_bar_j), (1 - lam) y_i + lam y_bar_j)``.

Until the server holds other clients' means (round 1), training is plain. Classification only.

The Taylor loss is unbounded below (its last term is linear in the input gradient): with many local
steps a model can drive it negative and collapse (docs/input_augmentations.md measures it); NaiveMix's
loss is bounded.
"""

from __future__ import annotations

import warnings
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.core.payload import Part, TensorSpec
from fedaug.layers.mixing import mix, soft_labels
from fedaug.methods.aug._sharing import PoolAug
from fedaug.methods.options import check_choice, check_dp, check_noise, check_range, require_classification
from fedaug.methods.component import Batch, ClientCtx, State
from fedaug.methods.recipe import METHODS
from fedaug.privacy.clip import clip_rows
from fedaug.privacy.mechanism import gaussian_mechanism
from fedaug.privacy.noise import NoiseScale, add_gaussian_noise
from fedaug.privacy.release import GaussianRelease

Mode = Literal["fedmix", "naive"]
MODES: tuple[str, ...] = get_args(Mode)

#: warned (once per process, Python's default filter) when a client's Taylor loss sums below 0 in a round
NEGATIVE_LOSS = ("fedmix: a client's Taylor loss went negative over a round's local steps; the loss is unbounded "
                 "below (its last term is linear in the input gradient), so the model is likely diverging and "
                 "will fall towards chance (docs/input_augmentations.md); NaiveMix (fedmix.mode = \"naive\"), "
                 "fewer local steps or a smaller lam avoid it")


def batch_means(x: Tensor, y: Tensor, size: int, perm: Tensor) -> tuple[Tensor, Tensor]:
    """Means of consecutive batches of ``size`` samples in the order ``perm`` (MAFL's shared data).

    Args:
        x: ``(N, *sample)``. y: ``(N, K)`` soft labels.
        size: M_k; the incomplete last batch is dropped unless it is the only one.
        perm: ``(N,)`` int64 order of the samples.

    Returns:
        ``(max(N // size, 1), *sample)`` mean inputs and ``(., K)`` mean labels.
    """
    n = max(x.shape[0] // size, 1)
    m = min(size, x.shape[0])
    idx = perm[: n * m].reshape(n, m)
    return x[idx].mean(1), y[idx].mean(1)


def fedmix_loss(logits: Tensor, x: Tensor, y: Tensor, x_bar: Tensor, y_bar: Tensor, lam: float) -> Tensor:
    """The FedMix loss (Sec. 3.2), averaged over the batch.

    Args:
        logits: ``(B, K)`` computed from ``x`` (in the autograd graph).
        x: ``(B, *sample)``, the scaled inputs ``(1 - lam) x_i``, with ``requires_grad``.
        y: ``(B,)`` int64 or ``(B, K)`` soft labels of the local samples.
        x_bar: ``(B, *sample)``, the mean input paired with each sample.
        y_bar: ``(B, K)``, its mean label.
        lam: the mixing ratio.

    Returns:
        A scalar, differentiable w.r.t. the model (through the input gradient too).
    """
    own = F.cross_entropy(logits, y, reduction="none")
    grad = torch.autograd.grad((1 - lam) * own.sum(), x, create_graph=True)[0]
    taylor = (grad.flatten(1) * x_bar.flatten(1)).sum(1)
    return ((1 - lam) * own + lam * F.cross_entropy(logits, y_bar, reduction="none") + lam * taylor).mean()


@METHODS.register("fedmix", "FedMix (ICLR 2021): mixup with other clients' shared mean images (Taylor loss)")
class FedMix(PoolAug):
    """Mixup with other clients' averaged data, FedMix's approximated loss or NaiveMix.

    Replaces ``forward`` and ``task_loss`` (so it combines with any base algorithm that keeps the
    default task loss, and not with another component replacing either hook).

    Args:
        lam: the mixing ratio lambda (0.05-0.2 in the paper).
        mean_batch: M_k, samples per shared mean (10 as in FLea's comparison; the client's whole
            training set with a value >= its size, the reading of the Flower baseline).
        mode: ``"fedmix"`` (Taylor loss) or ``"naive"`` (NaiveMix: raw mixing with the means).
        share_noise: std of Gaussian noise added to the mean images a client uploads (0: none; a
            privacy perturbation, :mod:`fedaug.privacy.noise`); mean labels are sent as they are.
        share_noise_scale: ``"absolute"`` or ``"relative"`` (to the std of the uploaded means).
        dp_clip: C > 0: the sample-level Gaussian mechanism on the shared means: each image is
            clipped to L2 norm C before the mean over its batch of M; ``None`` (default): off.
        dp_noise: z >= 0: each mean image gets ``N(0, (z C / M)^2)`` per value and each mean label
            ``N(0, (z / M)^2)`` (a one-hot label has norm 1), clamped to [0, 1] (needs ``dp_clip``;
            ``M = min(mean_batch, n)``). Declares the releases ``"fedmix mean images"`` and
            ``"fedmix mean labels"`` (once per client, sample-level; their sensitivities C and 1 are
            those of the sums). ``share_noise`` then adds its noise to the images.

    >>> fedmix = FedMix(lam=0.1, mean_batch=10)
    """

    name = "fedmix"

    def __init__(self, *, lam: float = 0.1, mean_batch: int = 10, mode: Mode = "fedmix", share_noise: float = 0.0,
                 share_noise_scale: NoiseScale = "absolute", dp_clip: float | None = None,
                 dp_noise: float | None = None) -> None:
        check_noise(self.name, share_noise, share_noise_scale)
        self.share_noise, self.share_noise_scale = float(share_noise), share_noise_scale
        self.dp_clip, self.dp_noise = check_dp(self.name, dp_clip, dp_noise)
        if self.dp_clip is not None and self.dp_noise > 0:
            self.releases = (GaussianRelease("fedmix mean images", self.dp_noise, self.dp_clip, "once", "sample"),
                             GaussianRelease("fedmix mean labels", self.dp_noise, 1.0, "once", "sample"))
        if not 0.0 < lam < 1.0:
            raise ConfigError(f"fedmix.lam must be in (0, 1), got {lam}")
        check_range("fedmix.mean_batch", mean_batch, lo=1, integer=True)
        self.lam, self.mean_batch = float(lam), mean_batch
        self.mode = check_choice(self.name, "mode", mode, MODES)
        self.needs_double_backward = self.mode == "fedmix"  # the input-gradient term is differentiated

    def label_spec(self, output: tuple[int, ...]) -> TensorSpec:
        """Mean soft labels ``(n, K)``, each value in ``[0, 1]``."""
        return TensorSpec(("rows", output[0]), torch.float32, low=0.0, high=1.0, kind="data")

    def contribution(self, ctx: ClientCtx) -> tuple[Tensor, Tensor]:
        require_classification(ctx, self.name)
        perm = torch.randperm(len(ctx.data), generator=ctx.rng("means"), device=ctx.device)
        x, y = ctx.data.x, soft_labels(ctx.data.y, ctx.task.num_classes)
        if self.dp_clip is None:
            x, y = batch_means(x, y, self.mean_batch, perm)
        else:
            x, y = self.private_means(x, y, perm, ctx.rng("dp"))
        return add_gaussian_noise(x, self.share_noise, ctx.rng("noise"), scale=self.share_noise_scale), y

    def private_means(self, x: Tensor, y: Tensor, perm: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """:func:`batch_means` of per-sample clipped images ``(N, *sample)`` (to ``dp_clip``) and labels
        ``(N, K)`` (to 1: one-hot and probability vectors already are), with ``M = min(mean_batch, N)``
        and Gaussian noise of std ``dp_noise * dp_clip / M`` and ``dp_noise / M``; labels clamped to [0, 1]."""
        m = min(self.mean_batch, x.shape[0])
        x_bar, y_bar = batch_means(clip_rows(x, self.dp_clip), clip_rows(y, 1.0), self.mean_batch, perm)
        x_bar = gaussian_mechanism({"x": x_bar}, self.dp_clip / m, self.dp_noise, generator)["x"]
        y_bar = gaussian_mechanism({"y": y_bar}, 1.0 / m, self.dp_noise, generator)["y"]
        return x_bar, y_bar.clamp(0.0, 1.0)

    def label_shape(self, ctx: ClientCtx, target: torch.Size) -> tuple[int, ...]:
        return (ctx.task.num_classes,)

    def forward(self, ctx: ClientCtx, batch: Batch) -> tuple[Tensor, Batch]:
        require_classification(ctx, self.name)
        self._pair = None
        if self.shared_x.shape[0] == 0:
            return ctx.model(batch.x), batch
        j = torch.randint(self.shared_x.shape[0], (batch.x.shape[0],), generator=ctx.rng("pair"), device=ctx.device)
        x_bar, y_bar = self.shared_x[j].to(batch.x), self.shared_y[j].to(batch.x)
        if self.mode == "naive":
            y = mix(soft_labels(batch.y, ctx.task.num_classes), y_bar, 1 - self.lam)
            return ctx.model(mix(batch.x, x_bar, 1 - self.lam)), Batch(batch.x, y)
        x = ((1 - self.lam) * batch.x).detach().requires_grad_()
        self._pair = (x, x_bar, y_bar)
        return ctx.model(x), batch

    def task_loss(self, ctx: ClientCtx, out: Tensor, batch: Batch) -> Tensor:
        if self._pair is None:
            return ctx.task.loss(out, batch.y)
        x, x_bar, y_bar = self._pair
        self._pair = None
        loss = fedmix_loss(out, x, batch.y, x_bar, y_bar, self.lam)
        self._taylor = loss.detach() if self._taylor is None else self._taylor + loss.detach()
        return loss

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        super().receive(ctx, part, state)
        self._taylor: Tensor | None = None  # this client's Taylor-loss sum this round, on its device (no sync per step)

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        """The pool's reply; first a warning (:data:`NEGATIVE_LOSS`) if this round's Taylor loss summed below 0."""
        if self._taylor is not None and float(self._taylor) < 0:
            warnings.warn(NEGATIVE_LOSS, stacklevel=2)
        return super().reply(ctx)
