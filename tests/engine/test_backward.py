"""A step's backward (fedaug.engine.client.training.backward): Tensor.backward's gradients and errors."""

from __future__ import annotations

import pytest
import torch

from fedaug.engine.client.training import backward
from fedaug.models.registry import build_model


def _grads(model, loss_of, run) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    run(loss_of(model))
    run(loss_of(model))  # accumulated into the first call's gradients, as Tensor.backward accumulates
    return [p.grad.clone() for p in model.parameters()]


def test_backward_gives_tensor_backwards_gradients_bit_for_bit():
    torch.manual_seed(0)
    model = build_model("small_cnn", 3, 10)
    x, y = torch.randn(4, 3, 28, 28), torch.randint(0, 10, (4,))

    def loss_of(m):
        return torch.nn.functional.cross_entropy(m(x), y)

    ours = _grads(model, loss_of, backward)
    theirs = _grads(model, loss_of, lambda t: t.backward())
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ours, theirs))


def test_backward_raises_torchs_errors():
    p = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        backward(p * 2)  # not a scalar: Tensor.backward's own message
    with pytest.raises(RuntimeError, match="does not require grad"):
        backward(torch.tensor(1.0))
