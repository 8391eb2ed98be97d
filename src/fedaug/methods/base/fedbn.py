"""FedBN: BatchNorm layers (affine parameters and running statistics) never leave the client."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from fedaug.core.payload import Part
from fedaug.methods._common import detached, load_entries
from fedaug.methods.component import State
from fedaug.methods.base.fedavg import FedAvg, Weighting
from fedaug.methods.recipe import METHODS


def norm_layer_keys(model: nn.Module) -> list[str]:
    """Every ``state_dict`` key of every BatchNorm-like layer: weight, bias, running statistics."""
    keys = []
    for prefix, module in model.named_modules():
        if isinstance(module, _NormBase):
            dot = f"{prefix}." if prefix else ""
            keys += [f"{dot}{k}" for k in module.state_dict()]
    return keys


@METHODS.register("fedbn", "FedBN (Li et al. 2021): BatchNorm weights and statistics stay local")
class FedBN(FedAvg):
    """FedBN (Li et al., ICLR 2021, arXiv:2102.07623, Algorithm 1).

    Everything but the BatchNorm layers is averaged as in FedAvg; each client keeps its BatchNorm
    affine parameters (gamma, beta) and running statistics in its per-client state (``"bn"``),
    trains with them and is evaluated with them. A client's first round starts from the initial
    model's BatchNorm layers. Per-client state: the bytes of those tensors (small_cnn width 32:
    4 layers x (4 x 32 float32 + 1 int64) = 2,080 bytes); the engine records it per round under
    ``client_state``.

    Args:
        weighting: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    >>> fedbn = FedBN()
    """

    name = "fedbn"

    def __init__(self, *, weighting: Weighting = "samples") -> None:
        super().__init__(weighting=weighting, bn="local")

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        keys = set(norm_layer_keys(model))
        self._initial = detached({k: v for k, v in model.state_dict().items() if k in keys})

    def _local_keys(self, model: nn.Module) -> list[str]:
        return norm_layer_keys(model)

    def _load(self, model: nn.Module, shared: Part, state: State) -> None:
        load_entries(model, shared)
        load_entries(model, state.get("bn", self._initial))
