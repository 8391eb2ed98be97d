"""Model zoo: plain-PyTorch models that declare their feature stages, their registry, and the split API."""

from fedaug.models import (  # noqa: F401  (registers)
    alexnet_bn,
    audionet,
    cnn1d,
    digit_model,
    harnet,
    lenet5,
    mlp,
    mobilenetv2_cifar,
    resnet_cifar,
    small_cnn,
    unet,
)
from fedaug.models.registry import MODELS, build_model
from fedaug.models.split import StagedModel, forward_back, forward_front, split_model, split_stages

__all__ = ["MODELS", "StagedModel", "build_model", "forward_back", "forward_front", "split_model", "split_stages"]
