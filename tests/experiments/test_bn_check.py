"""experiments/bn_check.py: the global model's accuracy with BatchNorm statistics re-estimated on a
client's own inputs, from its training split (the default) or its test split (``--stats-from test``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fedaug.config.load import parse_config, read_toml
from fedaug.data.base import Split
from fedaug.data.registry import load_dataset
from fedaug.engine.records.rundir import CONFIG, RunDir
from fedaug.models import build_model
from tests.experiments.scripts import load_script


def batchnorms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def test_reestimated_statistics_are_the_splits_own():
    """Within one batch, re-estimation gives each BatchNorm the batch's mean and unbiased variance of
    its input (an independent pass at momentum 1 sets exactly these)."""
    script = load_script("bn_check")
    torch.manual_seed(0)
    model = build_model("small_cnn", 3, 10, width=8)
    x = 3.0 + 2.0 * torch.randn(40, 3, 16, 16)
    ref = copy.deepcopy(model)
    for mod in batchnorms(ref):
        mod.momentum = 1.0
    ref.train()
    with torch.no_grad():
        ref(x)
    script.reestimate_bn(model, Split(x, torch.zeros(len(x), dtype=torch.long)))
    for mine, theirs in zip(batchnorms(model), batchnorms(ref), strict=True):
        torch.testing.assert_close(mine.running_mean, theirs.running_mean)
        torch.testing.assert_close(mine.running_var, theirs.running_var)
    assert float(batchnorms(model)[0].running_var.mean()) > 1.0  # the input's scale, not the init's 1


@pytest.mark.parametrize("stats_from", ["train", "test"])
def test_statistics_come_from_the_chosen_split(tiny_grid, monkeypatch, stats_from):
    script = load_script("bn_check")
    run = next(p.parent for p in sorted(tiny_grid.rglob(CONFIG)) if (p.parent / "checkpoints").is_dir())
    cfg = parse_config(read_toml(run / CONFIG))
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    used = []
    reestimate = script.reestimate_bn
    monkeypatch.setattr(script, "reestimate_bn", lambda model, split: (used.append(split.x), reestimate(model, split)))

    found = script.check(run, stats_from)

    assert list(found) == [c.name for c in data.clients]
    assert len(used) == len(data.clients)
    for x, client in zip(used, data.clients, strict=True):
        assert torch.equal(x, getattr(client, stats_from).x)
    model = build_model(cfg.model.name, data.input_shape[0], data.num_classes, **cfg.model.options)
    model.load_state_dict(RunDir.open(str(run)).load_latest()["server"][cfg.method.base]["weights"])
    for client in data.clients:
        assert found[client.name][0] == script.accuracy(model, client.test)  # the recorded global statistics
