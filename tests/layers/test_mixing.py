"""Properties and golden values of the normalisation and mixing functions and layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedaug.layers.functional import channel_stats, normalize_channels
from fedaug.layers.mixing import (
    MixStyleLayer,
    MoExLayer,
    dataset_channel_stats,
    exchange_moments,
    mix,
    mix_channel_stats,
    sample_beta,
    soft_labels,
)


def test_normalize_channels_golden_per_batch_and_per_sample():
    x = torch.tensor([[[[1.0, 3.0]], [[2.0, 6.0]]]])  # (1, 2, 1, 2)
    out = normalize_channels(x, torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0]))
    assert torch.equal(out, torch.tensor([[[[0.0, 1.0]], [[0.0, 1.0]]]]))
    per_sample = normalize_channels(x.repeat(2, 1, 1, 1), torch.tensor([[1.0, 2.0], [0.0, 0.0]]),
                                    torch.tensor([[2.0, 4.0], [1.0, 2.0]]))
    assert torch.equal(per_sample[1], torch.tensor([[[1.0, 3.0]], [[1.0, 3.0]]]))


@pytest.mark.parametrize("shape", [(7, 3, 5, 4), (5, 2, 9), (3, 1, 2, 3, 4)])  # 2D, 1D, 3D inputs
def test_dataset_stats_match_numpy(shape):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(1)) * 3 + 1
    a = x.numpy().astype(np.float64).reshape(shape[0], shape[1], -1)
    mean, std = dataset_channel_stats(x, chunk=2)
    np.testing.assert_allclose(mean.numpy(), a.mean(axis=2).mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(std.numpy(), a.std(axis=2, ddof=0).mean(axis=0), rtol=1e-6)


def test_sample_beta_is_reproducible_and_has_the_right_mean():
    a = sample_beta(0.4, 4000, torch.Generator().manual_seed(0))
    b = sample_beta(0.4, 4000, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.dtype == torch.float32
    assert bool(((a >= 0) & (a <= 1)).all()) and abs(float(a.mean()) - 0.5) < 0.03


def test_soft_labels_and_mix_rows_sum_to_one():
    soft = soft_labels(torch.tensor([0, 2, 1]), 3)
    mixed = mix(soft, soft[torch.tensor([2, 0, 1])], torch.tensor([0.3, 0.5, 1.0]))
    assert torch.allclose(mixed.sum(1), torch.ones(3))
    assert torch.allclose(mixed[0], torch.tensor([0.3, 0.7, 0.0]))


def test_mix_channel_stats_imposes_the_mixed_statistics():
    x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(0)) * 2 + 1
    perm, lam = torch.tensor([1, 0, 3, 2]), torch.tensor([0.2, 0.9, 0.5, 1.0])
    out = mix_channel_stats(x, perm, lam, eps=0.0)
    mu, sigma = channel_stats(x, eps=0.0)
    mu_out, sigma_out = channel_stats(out, eps=0.0)
    assert torch.allclose(mu_out, mix(mu, mu[perm], lam), atol=1e-5)
    assert torch.allclose(sigma_out, mix(sigma, sigma[perm], lam), atol=1e-5)
    assert torch.allclose(out[3], x[3], atol=1e-5)  # lam = 1 keeps the sample


@pytest.mark.parametrize("moments", ["pono", "instance"])
def test_exchange_moments_takes_the_partners_moments(moments):
    x = torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(exchange_moments(x, torch.arange(3), moments=moments, eps=0.0), x, atol=1e-5)
    perm = torch.tensor([2, 0, 1])
    out = exchange_moments(x, perm, moments=moments, eps=0.0)
    dim = 1 if moments == "pono" else (2, 3)
    assert torch.allclose(out.mean(dim), x.mean(dim)[perm], atol=1e-5)
    assert torch.allclose(out.std(dim, correction=0), x.std(dim, correction=0)[perm], atol=1e-4)


def test_mixstyle_layer_properties():
    x = torch.randn(6, 3, 4, 4, requires_grad=True)
    layer = MixStyleLayer(p=1.0, generator=torch.Generator().manual_seed(0))
    y = layer(x)
    assert y.shape == x.shape and y.dtype == x.dtype and not torch.equal(y, x)
    y.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert layer.eval()(x) is x
    assert MixStyleLayer(p=0.0)(x) is x
    again = MixStyleLayer(p=1.0, generator=torch.Generator().manual_seed(0))(x)
    other = MixStyleLayer(p=1.0, generator=torch.Generator().manual_seed(1))(x)
    assert torch.equal(again, y) and not torch.equal(other, y)


def test_moex_layer_is_identity_unless_armed_in_training():
    x = torch.randn(4, 3, 5, 5)
    layer = MoExLayer()
    assert layer(x) is x
    layer.arm(torch.tensor([1, 0, 3, 2]))
    assert layer.eval()(x) is x  # eval disarms without exchanging
    layer.train().arm(torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="armed for a batch of 2"):
        layer(x)
    with pytest.raises(ValueError, match="moments"):
        MoExLayer(moments="batch")
