"""ResNet-18, CIFAR variant."""

import torch

from fedaug.layers.attach import stage_channels
from fedaug.models.resnet_cifar import BasicBlock, ResNet18CIFAR


def test_parameter_count():
    assert sum(p.numel() for p in ResNet18CIFAR(3, 10).parameters()) == 11_173_962  # the usual 11.17M


def test_stage_widths_and_resolutions_at_32x32():
    model = ResNet18CIFAR(3, 10)
    widths = {"layer1": 64, "layer2": 128, "layer3": 256, "layer4": 512}
    assert stage_channels(model, torch.zeros(2, 3, 32, 32)) == widths
    assert model.eval().layer1(model.stem(torch.zeros(1, 3, 32, 32))).shape == (1, 64, 32, 32)  # no stem pooling


def test_basic_block_projects_the_shortcut_only_when_needed():
    assert len(BasicBlock(64, 64, 1).shortcut) == 0
    assert BasicBlock(64, 128, 2)(torch.zeros(2, 64, 8, 8)).shape == (2, 128, 4, 4)
