"""FedData: clients share a fraction of their raw training samples (Zhao et al. 2018, arXiv:1806.00582;
"FedData" in FLea, KDD 2024, Sec. 4 and App. C).

A reference upper bound, not a private method: raw samples and labels leave the clients. Each client
uploads a random ``fraction`` of its training set once (:mod:`~fedaug.methods.aug._sharing`); every
training batch is then extended with ``ceil(per_batch * B)`` samples drawn uniformly from the other
clients' shared samples. Evaluation is unchanged. Works for classification and segmentation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.core.payload import TensorSpec
from fedaug.layers.mixing import soft_labels
from fedaug.methods.aug._sharing import PoolAug
from fedaug.methods.component import Batch, ClientCtx
from fedaug.methods.options import check_range
from fedaug.methods.recipe import METHODS


@METHODS.register("feddata", "FedData: share a fraction of raw samples once (breaks privacy; upper bound)")
class FedData(PoolAug):
    """Share raw samples once; append shared samples of other clients to every training batch.

    Args:
        fraction: share of each client's training samples uploaded (0.1 in FLea's setup).
        per_batch: shared samples appended to a batch, as a fraction of its size.

    >>> feddata = FedData(fraction=0.1, per_batch=0.5)
    """

    name = "feddata"
    y_dtype = torch.int64

    def __init__(self, *, fraction: float = 0.1, per_batch: float = 0.5) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"feddata.fraction must be in (0, 1], got {fraction}")
        check_range("feddata.per_batch", per_batch, lo=0.0, lo_open=True)
        self.fraction, self.per_batch = float(fraction), float(per_batch)

    def label_spec(self, output: tuple[int, ...]) -> TensorSpec:
        """Integer labels in ``[0, K)``: one per sample (``output = (K,)``) or one per pixel/voxel
        (``output = (K, *spatial)``)."""
        return TensorSpec(("rows", math.prod(output[1:])), torch.int64, low=0, high=output[0] - 1, kind="data")

    def contribution(self, ctx: ClientCtx) -> tuple[Tensor, Tensor]:
        n = len(ctx.data)
        pick = torch.randperm(n, generator=ctx.rng("share"), device=ctx.device)[: max(1, round(self.fraction * n))]
        return ctx.data.x[pick], ctx.data.y[pick]

    def transform_batch(self, ctx: ClientCtx, batch: Batch) -> Batch:
        if not ctx.training or self.shared_x.shape[0] == 0:
            return batch
        k = math.ceil(self.per_batch * batch.x.shape[0])
        j = torch.randint(self.shared_x.shape[0], (k,), generator=ctx.rng("pick"), device=ctx.device)
        y = self.shared_y[j]
        if batch.y.is_floating_point():  # an earlier component made soft labels
            y = soft_labels(y, batch.y.shape[1])
        return Batch(torch.cat([batch.x, self.shared_x[j].to(batch.x)]), torch.cat([batch.y, y.to(batch.y.device)]))
