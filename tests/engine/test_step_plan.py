"""The eager step's shortcuts (fedaug.engine.client.step): a plan with nothing but the model and the task loss
(``StepPlan.plain``) and a total that is its task term alone (``StepPlan.task_only``) train a client exactly as
the general step does, and exactly the recipes they name take them."""

from __future__ import annotations

import pytest
import torch

from fedaug.config.schema import TrainConfig
from fedaug.data.base import Split
from fedaug.engine.client.step import mini_batch, plan_for
from fedaug.engine.client.training import train_client
from fedaug.methods.component import ClientCtx
from fedaug.methods.recipe import build_recipe
from fedaug.metrics.tasks import make_task
from fedaug.models.registry import build_model

TASK = make_task("classification", 10)


@pytest.mark.parametrize(("base", "augs", "plain", "task_only"), [
    ("fedavg", (), True, True),
    ("fedprox", (), False, False),  # a loss term
    ("fedavg", ("fedfa",), False, True),  # a forward context (the FFA layers), the task term alone
    ("fedsam", (), True, False),  # a replaced step: the loss may be evaluated twice
])
def test_exactly_the_recipes_without_step_hooks_take_the_shortcuts(base, augs, plain, task_only):
    model = build_model("small_cnn", 3, 10)
    plan = plan_for(build_recipe(base, augs), model, TASK.loss)
    assert (plan.plain, plan.task_only) == (plain, task_only)


def _client(general: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One client's round of FedAvg (momentum, weight decay, three mini-batches of 8 out of 20 samples, so
    that an epoch is reshuffled), on the plan's shortcuts or with them turned off (the general step)."""
    torch.manual_seed(0)
    model = build_model("small_cnn", 3, 10)
    recipe = build_recipe("fedavg")
    plan = plan_for(recipe, model, TASK.loss)
    if general:
        plan.plain = plan.task_only = False
    g = torch.Generator().manual_seed(1)
    data = Split(torch.randn(20, 3, 28, 28, generator=g), torch.randint(0, 10, (20,), generator=g))
    downlink = {"fedavg": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    ctx = ClientCtx(model, 3, 2, 0, data, lr=0.05, task=TASK)
    cfg = TrainConfig(local_steps=3, batch_size=8, momentum=0.9, weight_decay=5e-4, lr=0.05)
    reply = train_client(recipe, ctx, downlink, {}, cfg)
    return reply.message["fedavg"], reply.metrics


def test_the_shortcuts_train_a_client_as_the_general_step_does_bit_for_bit():
    fast, fast_metrics = _client(general=False)
    slow, slow_metrics = _client(general=True)
    assert list(fast) == list(slow)
    assert all(torch.equal(fast[k].view(torch.int32), slow[k].view(torch.int32)) for k in fast if fast[k].is_floating_point())
    assert fast_metrics == slow_metrics  # the loss and its task term: the same sums, the same floats
    assert fast_metrics["task"] == fast_metrics["loss"] and fast_metrics["steps"] == 3


@pytest.mark.parametrize("y", [torch.arange(6) * 3, torch.arange(6 * 4 * 4).reshape(6, 4, 4)])
def test_mini_batch_takes_advanced_indexings_samples(y):
    x = torch.arange(6 * 2 * 4 * 4, dtype=torch.uint8).reshape(6, 2, 4, 4)
    idx = torch.tensor([4, 0, 4, 2])
    batch = mini_batch(x, y, idx)
    assert torch.equal(batch.x, x[idx]) and batch.x.dtype == torch.uint8
    assert torch.equal(batch.y, y[idx]) and batch.y.shape == (4, *y.shape[1:])
