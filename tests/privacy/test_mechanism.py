"""The Gaussian mechanism and per-sample clipping: calibrated noise, bounds, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedaug.privacy.clip import clip_rows
from fedaug.privacy.mechanism import gaussian_mechanism


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("sensitivity, z", [(1.0, 1.0), (0.25, 2.0), (3.0, 0.5)])
def test_noise_std_is_z_times_the_sensitivity(sensitivity, z):
    # 200,000 draws: the sample std's relative standard error is 1/sqrt(2n) = 0.16 %; tolerance 1 %
    t = torch.full((200_000,), 3.0)
    noise = (gaussian_mechanism({"t": t}, sensitivity, z, gen())["t"] - t).double()
    assert float(noise.std()) == pytest.approx(z * sensitivity, rel=0.01)
    assert abs(float(noise.mean())) < 5 * z * sensitivity / math.sqrt(t.numel())  # centred (5 standard errors)


def test_one_release_is_one_vector_drawn_in_order_and_integers_pass_through():
    a, b, n = torch.zeros(3), torch.zeros(2, 2), torch.tensor([4, 5])
    out = gaussian_mechanism({"a": a, "n": n, "b": b}, 0.5, 2.0, gen(3))
    ref = torch.randn(7, generator=gen(3))  # a's 3 draws, then b's 4, std 0.5 * 2 = 1
    torch.testing.assert_close(torch.cat([out["a"], out["b"].flatten()]), ref)
    assert out["n"] is n and bool((a == 0).all()) and bool((b == 0).all())  # inputs not modified


def test_zero_noise_multiplier_returns_the_values_unchanged():
    t = torch.randn(5, generator=gen())
    assert gaussian_mechanism({"t": t}, 1.0, 0.0, gen())["t"] is t


def test_same_seed_same_noise_other_seed_other_noise():
    t = torch.zeros(50)
    first, again, other = (gaussian_mechanism({"t": t}, 1.0, 1.0, gen(s))["t"] for s in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("sensitivity, z", [(0.0, 1.0), (-1.0, 1.0), (math.inf, 1.0), (1.0, -0.1), (1.0, math.nan)])
def test_bad_parameters_are_refused(sensitivity, z):
    with pytest.raises(ValueError, match="finite sensitivity > 0 and a finite noise_multiplier >= 0"):
        gaussian_mechanism({"t": torch.zeros(1)}, sensitivity, z, gen())


def test_clip_rows_bounds_every_row_and_keeps_its_direction():
    x = torch.randn(64, 3, 4, 4, generator=gen()) * torch.logspace(-2, 2, 64).reshape(-1, 1, 1, 1)
    c = 1.5
    out = clip_rows(x, c)
    norms = out.flatten(1).double().norm(dim=1)
    before = x.flatten(1).double().norm(dim=1)
    assert bool((norms <= c * (1 + 1e-6)).all())  # float32 rounding of the factor: within 1e-6
    small = before <= c
    assert small.any() and (~small).any()  # both cases occur
    assert torch.equal(out[small], x[small])  # rows within the bound are left exactly as they are
    torch.testing.assert_close(norms[~small], torch.full_like(norms[~small], c), rtol=1e-6, atol=0)
    cos = torch.nn.functional.cosine_similarity(out.flatten(1).double(), x.flatten(1).double())
    torch.testing.assert_close(cos, torch.ones_like(cos))


def test_clip_rows_golden_values():
    # rows (3, 4) norm 5 -> C=2.5 halves it; (0.6, 0.8) norm 1 stays; 0 stays 0
    x = torch.tensor([[3.0, 4.0], [0.6, 0.8], [0.0, 0.0]])
    expected = np.array([[1.5, 2.0], [0.6, 0.8], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(clip_rows(x, 2.5).numpy(), expected, rtol=1e-7)


def test_clip_rows_refuses_a_bad_bound():
    with pytest.raises(ValueError, match="max_norm must be a finite number > 0"):
        clip_rows(torch.ones(2, 2), 0.0)
