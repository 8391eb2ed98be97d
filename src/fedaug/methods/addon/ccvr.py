"""CCVR: calibrate the global classifier head on virtual features drawn from the federation's
per-class Gaussians."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaug.core.local_sgd import LocalSGD
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.core.rng import generator
from fedaug.methods._common import classifier_head, feature_tap, label_counts
from fedaug.methods.options import check_range
from fedaug.methods.component import Batch, ClientCtx, Component, Phase, State, Uplink
from fedaug.methods.recipe import METHODS

#: each entry's kind (:data:`~fedaug.core.payload.KINDS`): the class counts grow with a client's data
KINDS = {"mean": "shared", "cov": "shared", "count": "data"}


def class_statistics(z: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-class mean ``(K, D)``, unbiased covariance ``(K, D, D)`` (0 for classes with < 2
    samples) and count ``(K,)`` of features ``z (N, D)`` with classes ``y (N,)``."""
    d = z.shape[1]
    mean, cov = torch.zeros(num_classes, d, device=z.device), torch.zeros(num_classes, d, d, device=z.device)
    count = torch.bincount(y, minlength=num_classes).float()
    for c in range(num_classes):
        zc = z[y == c]
        if len(zc):
            mean[c] = zc.mean(0)
        if len(zc) > 1:
            cov[c] = torch.cov(zc.T, correction=1).reshape(d, d)
    return mean, cov, count


def merge_statistics(means: Tensor, covs: Tensor, counts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The pooled per-class mean and unbiased covariance from clients' (Luo et al., NeurIPS 2021,
    arXiv:2106.05001, Sec. 4).

    ``mu_c = sum_k N_ck mu_ck / N_c``;
    ``Sigma_c = sum_k (N_ck - 1)/(N_c - 1) Sigma_ck + sum_k N_ck/(N_c - 1) mu_ck mu_ck^T
    - N_c/(N_c - 1) mu_c mu_c^T``.

    Args:
        means: ``(S, K, D)``; covs: ``(S, K, D, D)``; counts: ``(S, K)`` (S clients).

    Returns:
        mean ``(K, D)``, covariance ``(K, D, D)`` (0 where N_c < 2), count N_c ``(K,)``.
    """
    n = counts.sum(0)
    mean = (counts[..., None] * means).sum(0) / n.clamp_min(1)[:, None]
    denom = (n - 1).clamp_min(1)[:, None, None]
    second = (counts[..., None, None] * means[..., :, None] * means[..., None, :]).sum(0)
    cov = ((counts - 1).clamp_min(0)[..., None, None] * covs).sum(0) + second - n[:, None, None] * mean[:, :, None] * mean[:, None, :]
    cov = torch.where((n > 1)[:, None, None], cov / denom, torch.zeros_like(cov))
    return mean, cov, n


def sample_gaussian(mean: Tensor, cov: Tensor, num: int, g: torch.Generator) -> Tensor:
    """``num`` draws ``(num, D)`` from N(mean, cov); cov is factored by its eigendecomposition
    (negative eigenvalues from round-off are clipped to 0)."""
    evals, evecs = torch.linalg.eigh(cov.double())
    factor = (evecs * evals.clamp_min(0).sqrt()).float()  # (D, D): factor @ factor.T == cov
    return mean + torch.randn(num, mean.shape[0], generator=g, device=g.device) @ factor.T


@METHODS.register("ccvr", "CCVR (Luo et al. 2021): calibrate the head on virtual features from class Gaussians")
class CCVR(Component):
    """CCVR (Luo et al., NeurIPS 2021, arXiv:2106.05001, Sec. 4), as an add-on to any base.

    Each round, a client computes per-class mean, covariance and count of its training features
    (z = the input of the classifier head) with the model it received (before local training; eval
    mode), and uploads them (``(K, D)``, ``(K, D, D)``, ``(K,)``). The server merges them
    (:func:`merge_statistics`). To evaluate, ``num_virtual`` virtual features per class (classes with
    N_c >= 2) are drawn from N(mu_c, Sigma_c) with a server random stream (seed, round, ``ccvr``), and
    a copy of the model's head is retrained on them with SGD (``epochs``, ``lr``, ``batch_size``,
    momentum 0.9), starting from the current head; the calibrated head replaces the head for
    evaluation only (training continues from the uncalibrated model, the next downlink restores it).
    Every client is evaluated with the same calibrated head (identical draws); it is computed once
    per round and reused for every client that receives the same statistics and head (a memo of
    the last calibration, compared by value: a client with a head of its own recalibrates).
    Departure: the paper calibrates once, after the last round, with statistics of the final global model; here the
    statistics are those of the model each client received in the latest round, so every
    evaluation is calibrated. The statistics are of the training inputs as evaluation transforms
    them (``ctx.eval_inputs``: e.g. FedRDN's normalisation with the client's own statistics), so put
    CCVR after input augmentations (``augs_after``). Classification only.

    Args:
        num_virtual: virtual features per class (>= 1, default 100).
        epochs: passes over the virtual features (>= 1, default 10).
        lr: SGD learning rate of the calibration (> 0, default 0.01).
        batch_size: calibration batch size (>= 1, default 64).

    >>> ccvr = CCVR(num_virtual=100)
    """

    name = "ccvr"
    phases = ("train", "evaluate")
    needs_global_model = True

    def __init__(self, *, num_virtual: int = 100, epochs: int = 10, lr: float = 0.01, batch_size: int = 64) -> None:
        check_range("ccvr.num_virtual", num_virtual, lo=1, integer=True)
        check_range("ccvr.epochs", epochs, lo=1, integer=True)
        check_range("ccvr.lr", lr, lo=0.0, lo_open=True)
        check_range("ccvr.batch_size", batch_size, lo=1, integer=True)
        self.num_virtual, self.epochs, self.lr, self.batch_size = num_virtual, epochs, lr, batch_size
        self._memo: tuple[tuple[int, int], list[Tensor], list[Tensor]] | None = None

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        feature_tap(model)

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        if ctx.training:
            self._statistics(ctx)
        else:
            self._calibrate(ctx, part)

    @torch.no_grad()
    def _statistics(self, ctx: ClientCtx) -> None:
        """This client's class statistics of the features of the model it received (before training)."""
        counts = label_counts(ctx, self.name)
        tap, model = feature_tap(ctx.model), ctx.model
        was_training = model.training
        model.eval()
        x, y = ctx.data.x, ctx.data.y
        inputs = ctx.eval_inputs or (lambda batch: batch)
        try:
            z = torch.cat([tap.features_of(lambda: model(inputs(Batch(x[i : i + 256], y[i : i + 256])).x))[0]
                           for i in range(0, len(ctx.data), 256)])
        finally:
            model.train(was_training)
        self._stats = class_statistics(z.float(), ctx.data.y, counts.shape[0])

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        mean, cov, count = self._stats
        return {"mean": mean, "cov": cov, "count": count}, {}

    def _calibrate(self, ctx: ClientCtx, server: Part) -> None:
        """Replace the head of ``ctx.model`` by its calibration on the federation's statistics
        (:meth:`_fit_head`), reusing the last one when its inputs are equal."""
        classes = (server["count"] >= 2).nonzero().flatten()
        if not len(classes):
            return
        head = feature_tap(ctx.model).head
        current = [p for p in (head.weight, head.bias) if p is not None]
        inputs = [server["mean"], server["cov"], server["count"], *current]
        key = (ctx.seed, ctx.round)
        if self._memo is not None and self._memo[0] == key and _equal(self._memo[1], inputs):
            new = self._memo[2]
        else:
            new = self._fit_head(ctx, server, classes, current)
            self._memo = (key, [t.detach().clone() for t in inputs], new)
        with torch.no_grad():
            for p, value in zip(current, new):
                p.copy_(value)

    def _fit_head(self, ctx: ClientCtx, server: Part, classes: Tensor, current: list[Tensor]) -> list[Tensor]:
        """The head's weight ``(K, D)`` (and bias ``(K,)``) retrained with SGD from ``current`` on
        ``num_virtual`` virtual features per class in ``classes`` (those with N_c >= 2) drawn from
        ``server``'s Gaussians."""
        g = generator(ctx.seed, "server", ctx.round, self.name, "virtual", device=ctx.device)
        z = torch.cat([sample_gaussian(server["mean"][c], server["cov"][c], self.num_virtual, g) for c in classes])
        y = classes.repeat_interleave(self.num_virtual)
        params = [p.detach().clone().requires_grad_(True) for p in current]
        with torch.enable_grad():
            opt = LocalSGD(params, lr=self.lr, momentum=0.9)  # torch's SGD, without its torch._dynamo import
            for _ in range(self.epochs):
                for idx in torch.randperm(len(y), generator=g, device=g.device).split(self.batch_size):
                    opt.zero_grad()
                    F.cross_entropy(F.linear(z[idx], *params), y[idx]).backward()
                    opt.step()
        return [p.detach() for p in params]

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        _, head = classifier_head(model)
        k, d, device = head.out_features, head.in_features, head.weight.device
        return {"mean": torch.zeros(k, d, device=device), "cov": torch.zeros(k, d, d, device=device),
                "count": torch.zeros(k, device=device)}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        return {k: v.clone() for k, v in server.items()} if phase == "evaluate" else {}

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        if phase != "evaluate":
            return {}
        _, head = classifier_head(model)
        k, d = head.out_features, head.in_features
        return {"mean": TensorSpec((k, d), torch.float32), "cov": TensorSpec((k, d, d), torch.float32),
                "count": TensorSpec((k,), torch.float32, low=0.0)}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        return {k: TensorSpec.like(v, kind=KINDS[k]) for k, v in server.items()} if phase == "train" else {}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        mean, cov, count = merge_statistics(torch.stack([u.part["mean"] for u in uplinks]),
                                            torch.stack([u.part["cov"] for u in uplinks]),
                                            torch.stack([u.part["count"] for u in uplinks]))
        return {"mean": mean, "cov": cov, "count": count}


def _equal(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    """Whether two lists of tensors are equal in length, shape, device and every value."""
    return len(a) == len(b) and all(x.shape == y.shape and x.device == y.device and torch.equal(x, y)
                                    for x, y in zip(a, b))
