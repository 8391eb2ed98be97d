"""The 2NN of FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629, Sec. 3): a multilayer
perceptron with two hidden layers of 200 ReLU units (199,210 parameters on MNIST)."""

from __future__ import annotations

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


class MLP(StagedModel):
    """Flatten, then ``len(hidden)`` Linear-ReLU layers and a Linear classifier.

    Args:
        in_features: values of one flattened input, ``C * H * W`` (784 for 1x28x28).
        num_classes: size of the output ``(B, num_classes)`` logits.
        hidden: the hidden layers' widths (``(200, 200)``: the paper's 2NN).

    >>> import torch
    >>> MLP(784, 10)(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...] = (200, 200)) -> None:
        super().__init__()
        if not hidden or any(not isinstance(h, int) or h < 1 for h in hidden):
            raise ConfigError(f"mlp.hidden must be a non-empty list of positive widths, got {list(hidden)}")
        self.flatten = nn.Flatten()
        widths = (in_features, *hidden)
        for i, (a, b) in enumerate(zip(widths, widths[1:]), 1):
            self.add_module(f"fc{i}", nn.Sequential(nn.Linear(a, b), nn.ReLU()))
        self.add_module("head", nn.Linear(widths[-1], num_classes))
        self.feature_stages = tuple(f"fc{i}" for i in range(1, len(hidden) + 1))  # after each hidden layer


@MODELS.register("mlp", "FedAvg's 2NN: flatten, 2 hidden layers of 200 ReLU units (199,210 params on 1x28x28)")
def mlp(*, in_channels: int, num_classes: int, input_size: int = 28, hidden: list[int] | None = None) -> MLP:
    """The 2NN for ``(B, in_channels, input_size, input_size)`` inputs.

    Args:
        input_size: height = width of the input.
        hidden: the hidden layers' widths (default ``[200, 200]``: the paper's 2NN).
    """
    if input_size < 1:
        raise ConfigError(f"mlp.input_size must be >= 1, got {input_size}")
    return MLP(in_channels * input_size * input_size, num_classes, tuple(hidden) if hidden else (200, 200))
