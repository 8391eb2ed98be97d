"""Gaussian noise on shared tensors: identity at 0, reproducible, the requested scale."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.privacy.noise import add_gaussian_noise


def test_zero_std_returns_the_input():
    t = torch.randn(5)
    assert add_gaussian_noise(t, 0.0, torch.Generator().manual_seed(0)) is t


def test_same_seed_same_noise_other_seed_other_noise():
    t = torch.zeros(100)
    a = add_gaussian_noise(t, 1.0, torch.Generator().manual_seed(0))
    b = add_gaussian_noise(t, 1.0, torch.Generator().manual_seed(0))
    c = add_gaussian_noise(t, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("scale, expected", [("absolute", 0.5), ("relative", 0.5 * 3.0)])
def test_noise_standard_deviation(scale, expected):
    g = torch.Generator().manual_seed(2)
    t = 3.0 * torch.randn(200_000, generator=g)
    noise = add_gaussian_noise(t, 0.5, g, scale=scale) - t
    assert float(noise.std()) == pytest.approx(expected, rel=0.02)
    assert t.shape == noise.shape


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match=r"noise_std must be a number >= 0"):
        add_gaussian_noise(torch.zeros(2), -1.0, torch.Generator())
    with pytest.raises(ConfigError, match=r"noise_scale must be one of absolute, relative"):
        add_gaussian_noise(torch.zeros(2), 1.0, torch.Generator(), scale="rel")
