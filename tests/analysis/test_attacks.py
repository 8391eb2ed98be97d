"""The attacks on shared representations: the planted marker, seeded decoder training, the context
probe on representations that keep or lose the marker, and the messages of impossible sizes."""

from __future__ import annotations

import pytest
import torch

from fedaug.analysis.attacks import context_attack, plant_marker, reconstruction_attack
from fedaug.core.errors import ConfigError


def test_plant_marker_sets_a_corner_square_on_a_copy():
    x = torch.zeros(2, 3, 6, 6)
    out = plant_marker(x, size=2)
    assert torch.equal(out[:, :, :2, :2], torch.tensor([1.0, 0.0, 0.0]).reshape(1, 3, 1, 1).expand(2, 3, 2, 2))
    assert out[:, :, 2:].abs().sum() == 0 and out[:, :, :, 2:].abs().sum() == 0 and x.abs().sum() == 0
    signal = torch.arange(10.0).reshape(1, 1, 10)  # 1 channel, 1 spatial dim: the maximum, a flat segment
    assert plant_marker(signal, size=3)[0, 0, :3].tolist() == [9.0, 9.0, 9.0]
    with pytest.raises(ConfigError, match="marker value has 2 entries, the inputs have 3 channels"):
        plant_marker(x, value=(1.0, 0.0))


def test_reconstruction_attack_is_seeded_and_needs_matching_spatial_dims():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(12, 1, 8, 8, generator=g)
    f = torch.nn.functional.avg_pool2d(x, 2).repeat(1, 4, 1, 1)  # (12, 4, 4, 4)
    runs = [reconstruction_attack(f[:8], x[:8], f[8:], x[8:], epochs=2, batch_size=4, seed=s) for s in (1, 1, 2)]
    assert runs[0].mse == runs[1].mse != runs[2].mse and len(runs[0].train_mse) == 2
    assert runs[0].reconstructions.shape == (4, 1, 8, 8)
    with pytest.raises(ConfigError, match="same number of spatial dims"):
        reconstruction_attack(f.flatten(1), x, f.flatten(1), x, epochs=1)


def test_context_attack_finds_a_marker_the_representation_keeps_and_not_one_it_drops():
    x = torch.rand(80, 3, 6, 6, generator=torch.Generator().manual_seed(0)) * 0.5  # the red marker stands out
    corner = context_attack(lambda g: g[:, 0, :, :2, :2].mean((2, 3)), x, train_sizes=[10, 40], test_size=40,
                            marker_size=2)  # groups (G, 1, C, H, W) -> the marked square's mean per channel
    elsewhere = context_attack(lambda g: g[:, 0, :, 3:, 3:].mean((2, 3)), x, train_sizes=[40], test_size=40,
                               marker_size=2)
    assert corner == [{"train_size": 10, "accuracy": 1.0}, {"train_size": 40, "accuracy": 1.0}]
    assert elsewhere[0]["accuracy"] < 0.75
    with pytest.raises(ConfigError, match=r"needs 100 inputs \(group_size=2 x \(max train size 40 \+ test_size 10\)\)"):
        context_attack(lambda g: g.mean(1), x, train_sizes=[40], test_size=10, group_size=2)


@pytest.mark.parametrize("kw, got", [
    ({"epochs": 0}, "epochs = 0"), ({"batch_size": 0}, "batch_size = 0"), ({"aux": 0}, "attacker samples = 0"),
    ({"test": 0}, "test samples = 0"),
])
def test_reconstruction_attack_refuses_empty_training_and_data(kw, got):
    x = torch.rand(6, 1, 4, 4)
    aux, test = kw.pop("aux", 3), kw.pop("test", 3)
    with pytest.raises(ConfigError, match=rf"reconstruction attack needs at least 1 of each of epochs, batch_size, "
                                          rf"attacker samples, test samples, got {got}"):
        reconstruction_attack(x[:aux], x[:aux], x[6 - test:], x[6 - test:], **kw)


@pytest.mark.parametrize("kw", [{"train_sizes": []}, {"train_sizes": [0, 5]}, {"test_size": 0}, {"group_size": 0}])
def test_context_attack_refuses_sizes_below_one(kw):
    args = {"train_sizes": [5], "test_size": 5, **kw}
    with pytest.raises(ConfigError, match=r"context attack needs train_sizes >= 1 \(at least one\), test_size >= 1 "
                                          r"and group_size >= 1"):
        context_attack(lambda g: g.flatten(1), torch.rand(20, 1, 4, 4), **args)
