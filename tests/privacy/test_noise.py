"""Gaussian noise on shared tensors: identity at 0, reproducible, the requested scale; every sharing
component (FedFA, VFDA, FedRDN, FedMix, FLea) perturbs what it uploads and nothing else."""

from __future__ import annotations

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.methods import METHODS
from fedaug.privacy.noise import add_gaussian_noise
from tests.conftest import tiny_raw


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


@pytest.mark.parametrize("value", [4.0, -4.0])
@pytest.mark.parametrize("shape", [(1,), (1, 1), ()])
def test_relative_noise_on_a_single_value_is_relative_to_its_magnitude(value, shape):
    """A one-element tensor has no spread: relative noise scales with |t| (issue 41), not absolute noise."""
    t = torch.full(shape, value)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    out = add_gaussian_noise(t, 0.5, torch.Generator().manual_seed(5), scale="relative")
    assert torch.allclose(out - t, 0.5 * abs(value) * z)
    assert torch.allclose(add_gaussian_noise(t, 0.5, torch.Generator().manual_seed(5)) - t, 0.5 * z)


def test_bad_arguments_are_value_errors():
    """Components' options are ConfigErrors (below); the helper itself refuses bad arguments."""
    with pytest.raises(ValueError, match=r"std >= 0 and scale in \('absolute', 'relative'\), got -1.0"):
        add_gaussian_noise(torch.zeros(2), -1.0, torch.Generator())
    with pytest.raises(ValueError, match=r"got 1.0, 'rel'"):
        add_gaussian_noise(torch.zeros(2), 1.0, torch.Generator(), scale="rel")


def uploads(component: str, **options):
    """Round 1 of a tiny run with ``component``: its uplinks (client id -> part) and its layers' or
    table's clean state afterwards."""
    raw = tiny_raw()
    raw["data"]["options"].update(num_clients=4, samples_per_client=64, channels=3)
    raw["method"] = {"base": "fedavg", "augs": [component], "options": {component: options}}
    sim = build_simulation(validate(raw))
    comp = next(c for c in sim.recipe.components if c.name == component)
    seen, aggregate = {}, comp.aggregate

    def spy(server, ups, phase="train"):
        seen.update({u.client_id: {k: v.clone() for k, v in u.part.items()} for u in ups})
        return aggregate(server, ups, phase)

    comp.aggregate = spy
    sim.run_round(1)
    running = {n: layer.running_mean.clone() for n, layer in getattr(comp, "layers", {}).items()}
    return seen, running


#: component -> the uplink keys that carry the perturbed values
NOISY = {"fedfa": None, "fedrdn": ("mean", "std"), "fedmix": ("x",)}


@pytest.mark.parametrize("component", sorted(NOISY))
def test_share_noise_perturbs_only_what_is_uploaded(component):
    clean, running_clean = uploads(component)
    zero, _ = uploads(component, share_noise=0.0)
    noisy, running_noisy = uploads(component, share_noise=0.3)
    again, _ = uploads(component, share_noise=0.3)
    keys = NOISY[component] or tuple(next(iter(clean.values())))
    diffs = []
    for cid, part in clean.items():
        for k, v in part.items():
            assert torch.equal(zero[cid][k], v)  # 0 = off, bit for bit
            assert torch.equal(again[cid][k], noisy[cid][k])  # seeded: reproducible
            if k in keys:
                diffs.append((noisy[cid][k] - v).flatten())
            else:
                assert torch.equal(noisy[cid][k], v)  # labels, counters: untouched
    diff = torch.cat(diffs)
    assert diff.numel() >= 20 and float(diff.std()) == pytest.approx(0.3, rel=0.35)
    for name, mean in running_clean.items():  # FedFA's own layers keep the clean statistics
        assert torch.equal(running_noisy[name], mean)


@pytest.mark.parametrize("component", ["fedfa", "fedrdn", "fedmix", "flea", "vfda"])
def test_share_noise_options_are_checked_by_every_component(component):
    with pytest.raises(ConfigError, match=rf"{component}\.share_noise must be a finite number >= 0"):
        METHODS.get(component)(share_noise=-0.1)
    with pytest.raises(ConfigError, match=rf"{component}\.share_noise_scale must be one of absolute, relative"):
        METHODS.get(component)(share_noise=0.1, share_noise_scale="percent")
