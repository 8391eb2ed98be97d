"""The local training loop's pieces (engine/local.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedaug.config.schema import validate
from fedaug.engine.client.training import LocalOptimizer, num_local_steps


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 3, generator=g)).square().sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_reset_optimizer_trains_as_a_new_one(optimizer):
    cfg = validate({"train": {"optimizer": optimizer, "momentum": 0.9, "weight_decay": 1e-3}}).train
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opts = LocalOptimizer(cfg)
    first = opts.fresh(model, 0.1)
    train(model, first)
    first.param_groups[0]["momentum" if optimizer == "sgd" else "eps"] = 0.5  # a component's change: undone
    model.load_state_dict(start)
    again = opts.fresh(model, 0.05)
    assert again is first and not again.state and again.param_groups[0]["lr"] == 0.05
    reused = train(model, again)
    model.load_state_dict(start)
    new = train(model, type(first)(model.parameters(), **{**again.defaults, "lr": 0.05}))
    assert all(torch.equal(a, b) for a, b in zip(reused, new))


def test_a_change_of_trainable_parameters_builds_a_new_optimizer():
    cfg = validate({}).train
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    opts = LocalOptimizer(cfg)
    first = opts.fresh(model, 0.1)
    model[0].weight.requires_grad_(False)
    second = opts.fresh(model, 0.1)
    assert second is not first and len(second.param_groups[0]["params"]) == 3


@pytest.mark.parametrize(("n", "train", "steps"), [
    (20, {"local_steps": 7}, 7), (20, {"batch_size": 10}, 2), (25, {"batch_size": 10, "drop_last": False}, 3),
    (21, {"batch_size": 10, "drop_last": False}, 2), (5, {"batch_size": 10, "local_epochs": 3}, 3),
])
def test_num_local_steps_counts_the_batches_batch_indices_makes(n, train, steps):
    from fedaug.engine.client.training import batch_indices

    cfg = validate({"train": train}).train
    assert num_local_steps(n, cfg) == steps == len(batch_indices(n, cfg, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(("n", "train", "sizes"), [
    (20, {"local_steps": 5, "batch_size": 8}, (8, 8, 8, 8, 8)), (20, {"batch_size": 8, "drop_last": False}, (8, 8, 4)),
    (21, {"batch_size": 10, "drop_last": False}, (10, 10)), (5, {"batch_size": 10, "local_epochs": 2}, (5, 5)),
    (25, {"batch_size": 10, "drop_last": False, "local_epochs": 2}, (10, 10, 5, 10, 10, 5)),
    (25, {"batch_size": 10, "drop_last": False, "local_steps": 4}, (10, 10, 5, 10)),
])
def test_batch_sizes_are_those_of_the_batches_batch_indices_draws(n, train, sizes):
    from fedaug.engine.client.training import batch_indices, batch_sizes

    cfg = validate({"train": train}).train
    assert batch_sizes(n, cfg) == sizes == tuple(len(i) for i in batch_indices(n, cfg, torch.Generator().manual_seed(3)))
