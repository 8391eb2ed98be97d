"""Simulated scanners (fedaug.data.site_shift): each step's statistics on small synthetic volumes, the
profiles' spread, and the brain_mri ``scanners`` option on the nilearn template (no Debian package)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.data import load_dataset
from fedaug.data.site_shift import (
    BIAS_MAX_FREQ,
    RANGES,
    AcquisitionProfile,
    acquire,
    apply_gamma,
    bias_field,
    degrade_resolution,
    draw_profiles,
    rician_noise,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("shape, amplitude, seed", [
    ((24, 20, 16), 0.3, 0),
    ((40, 8, 12), 0.05, 1),
    ((16, 16, 16), 0.4, 2),
])
def test_bias_field_within_its_range_and_smooth(shape, amplitude, seed):
    """exp(-a) <= b <= exp(a); per-voxel change of log b along axis i <= 2 pi a f / N_i (the slope
    bound of a sum of cosines of frequency <= f with weights summing to 1)."""
    b = bias_field(shape, amplitude, gen(seed))
    log_b = b.double().log()
    assert b.shape == shape and float(log_b.abs().max()) <= amplitude + 1e-6
    for axis, n in enumerate(shape):
        step = float(log_b.diff(dim=axis).abs().max())
        assert step <= 2 * math.pi * amplitude * BIAS_MAX_FREQ / n + 1e-6
    assert float(log_b.max() - log_b.min()) >= 0.5 * amplitude  # not flat: the field uses its range
    assert torch.equal(b, bias_field(shape, amplitude, gen(seed)))
    assert not torch.equal(b, bias_field(shape, amplitude, gen(seed + 10)))


@pytest.mark.parametrize("gamma", [0.6, 1.0, 1.6])
def test_gamma_maps_every_quantile_and_the_mean_of_a_uniform_volume(gamma):
    x = torch.rand(32, 32, 32, generator=gen(3), dtype=torch.float64)
    y = apply_gamma(x, gamma)
    q = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64)
    lower = {"interpolation": "lower"}
    assert torch.allclose(torch.quantile(y, q, **lower), torch.quantile(x, q, **lower) ** gamma)
    assert float(y.mean()) == pytest.approx(1 / (1 + gamma), abs=0.01)  # E[U^gamma], U ~ U(0, 1); s.e. ~0.0014


@pytest.mark.parametrize("std", [0.01, 0.05])
def test_rician_noise_std_on_tissue_and_rayleigh_mean_on_background(std):
    tissue = rician_noise(torch.full((32, 32, 32), 0.8, dtype=torch.float64), std, gen(4))
    assert float(tissue.std()) == pytest.approx(std, rel=0.05)
    background = rician_noise(torch.zeros(32, 32, 32, dtype=torch.float64), std, gen(5))
    assert float(background.mean()) == pytest.approx(std * math.sqrt(math.pi / 2), rel=0.03)
    assert float(background.min()) >= 0


def high_frequency_energy(x: torch.Tensor) -> float:
    """Spectral energy at frequencies above half the Nyquist limit on any axis."""
    spec = torch.fft.fftn(x - x.mean()).abs() ** 2
    f = [torch.fft.fftfreq(n).abs() for n in x.shape]  # cycles per voxel, Nyquist 0.5
    high = (f[0][:, None, None] > 0.25) | (f[1][None, :, None] > 0.25) | (f[2][None, None, :] > 0.25)
    return float(spec[high].sum())


def test_resolution_removes_high_frequencies_and_keeps_the_grid():
    x = torch.rand(30, 27, 20, generator=gen(6), dtype=torch.float64)  # sides not divisible by 2, 3 or 4
    assert degrade_resolution(x, 1) is x
    energies = [high_frequency_energy(x)]
    for factor in (2, 3, 4):
        y = degrade_resolution(x, factor)
        assert y.shape == x.shape
        energies.append(high_frequency_energy(y))
    assert energies[1] < 0.05 * energies[0]  # measured: x 0.006, then 0.0014 and 0.0006 for factors 3, 4
    assert energies[1] > energies[2] > energies[3]
    flat = torch.full((9, 9, 9), 0.3, dtype=torch.float64)
    assert torch.allclose(degrade_resolution(flat, 4), flat)


def test_profiles_spread_over_the_ranges_and_differ():
    profiles = draw_profiles(4, seed=0)
    assert profiles == draw_profiles(4, seed=0) and profiles != draw_profiles(4, seed=1)
    for name in ("bias_amplitude", "gamma", "noise_std"):
        lo, hi = RANGES[name]
        values = sorted(getattr(p, name) for p in profiles)
        assert lo <= values[0] and values[-1] <= hi and len(set(values)) == 4
        edges = np.exp(np.linspace(np.log(lo), np.log(hi), 5)) if name == "gamma" else np.linspace(lo, hi, 5)
        assert all(edges[j] - 1e-4 <= v <= edges[j + 1] + 1e-4 for j, v in enumerate(values))  # one per stratum
    assert sorted(p.resolution for p in profiles) == [1, 2, 3, 4]


def phantom() -> torch.Tensor:
    """(24, 24, 24): background 0, a 'grey matter' cube 0.5 and a 'white matter' core 0.9."""
    t1 = torch.zeros(24, 24, 24)
    t1[4:20, 4:20, 4:20] = 0.5
    t1[8:16, 8:16, 8:16] = 0.9
    return t1


def test_sites_differ_and_each_is_deterministic():
    t1 = phantom()
    out = [acquire(t1, p, seed=j) for j, p in enumerate(draw_profiles(4, seed=0))]
    assert all(torch.equal(o, acquire(t1, p, seed=j)) for j, (o, p) in enumerate(zip(out, draw_profiles(4, seed=0))))
    for i in range(4):
        for j in range(i + 1, 4):
            assert float((out[i] - out[j]).abs().mean()) > 0.01
    plain = AcquisitionProfile(bias_amplitude=0.0, gamma=1.0, noise_std=0.0, resolution=1)
    assert torch.allclose(acquire(t1, plain, seed=0), t1)  # the neutral profile leaves the volume as it is


def test_brain_mri_scanners_on_the_nilearn_template(tmp_path, monkeypatch):
    """4 scanners on one volume: 4 clients with their own profiles, disjoint anatomy, recorded info."""
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path))
    fd = load_dataset("brain_mri", seed=0, sites=["mni152"], dims=3, patch=16, spacing=4, scanners=4)
    assert [c.name for c in fd.clients] == [f"scanner{j}-mni152" for j in range(4)]
    assert [s["name"] for s in fd.info["scanners"]] == [c.name for c in fd.clients]
    assert {k: v for k, v in fd.info["scanners"][0].items() if k not in ("name", "volume")} == \
        draw_profiles(4, 0)[0].to_dict()
    seen: set[str] = set()
    for c in fd.clients:
        labels = {hashlib.sha1(y.numpy().tobytes()).hexdigest() for s in (c.train, c.val, c.test) for y in s.y}
        assert not labels & seen  # each patch of the volume belongs to one scanner
        seen |= labels
        assert 0 <= float(c.train.x.min()) and float(c.train.x.max()) <= 1
    means = [float(c.train.x[:, 0][c.train.y > 0].mean()) for c in fd.clients]
    assert max(means) - min(means) > 0.05  # the scanners' contrast differs on the same brain
    with pytest.raises(ConfigError, match=r"scanners must be 0 \(off\) or >= the 2 volumes"):
        load_dataset("brain_mri", seed=0, sites=["mni152", "colin27"], scanners=1)
