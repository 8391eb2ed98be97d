"""Conventional normalisation with fixed statistics."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.methods.aug.norm import Normalize
from fedaug.methods.component import Batch
from tests.methods.aug.inputs import make_ctx


def test_fixed_statistics_in_training_and_evaluation():
    x = torch.rand(4, 3, 2, 2)
    for phase in ("train", "evaluate"):
        ctx = make_ctx(x, phase=phase)
        out = Normalize(mean=[0.1, 0.2, 0.3], std=0.5).transform_batch(ctx, Batch(x, ctx.data.y)).x
        assert torch.allclose(out, (x - torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1)) / 0.5)


def test_errors_name_the_option():
    with pytest.raises(ConfigError, match=r"norm\.std"):
        Normalize(std=[0.0])
    ctx = make_ctx(torch.rand(2, 3, 2, 2))
    with pytest.raises(ConfigError, match="3 channels"):
        Normalize(mean=[0.1, 0.2]).transform_batch(ctx, Batch(ctx.data.x, ctx.data.y))
