"""Mixup and Manifold Mixup: soft labels summing to 1, identity at evaluation, seeded draws, stages."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.methods.aug.mixup import ManifoldMixup, Mixup
from fedaug.methods.component import Batch
from fedaug.models.registry import build_model
from tests.methods.aug.inputs import make_ctx


def batch(n: int = 8) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def test_mixup_labels_sum_to_one_and_match_the_inputs_mixing():
    b = batch()
    ctx = make_ctx(b.x, b.y)
    out = Mixup(alpha=1.0).transform_batch(ctx, b)
    assert out.y.shape == (8, 4) and torch.allclose(out.y.sum(1), torch.ones(8))
    lam = out.y.gather(1, b.y[:, None]).squeeze(1)  # >= lam (the partner may share the class)
    assert bool((lam > 0).all())
    same = make_ctx(b.x, b.y)
    assert torch.equal(Mixup(alpha=1.0).transform_batch(same, b).x, out.x)  # same seed, same draws
    ctx.phase = "evaluate"
    assert Mixup().transform_batch(ctx, b) is b


@pytest.mark.parametrize("stage", ["input", "block1", "block3"])
def test_manifold_mixup_mixes_at_the_stage_and_gives_soft_labels(stage):
    model = build_model("small_cnn", in_channels=1, num_classes=4, width=8)
    b = batch()
    ctx = make_ctx(b.x, b.y, model=model)
    out, target = ManifoldMixup(stages=[stage]).forward(ctx, b)
    assert out.shape == (8, 4) and torch.allclose(target.y.sum(1), torch.ones(8))


def test_manifold_mixup_rejects_unknown_stages():
    model = build_model("small_cnn", in_channels=1, num_classes=4, width=8)
    with pytest.raises(ConfigError, match="manifold_mixup.stages"):
        ManifoldMixup(stages=["conv9"]).setup(model, (1, 8, 8))
    with pytest.raises(ConfigError, match=r"mixup\.alpha"):
        Mixup(alpha=0)
