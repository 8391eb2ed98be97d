"""experiments/few_steps_bn.py (docs/data.md, "Few steps per round: BatchNorm's running statistics"): the
texture folders it writes, its three evaluations, and its "running" column equal to what a run records."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedaug.config.load import load_config
from fedaug.data.base import Split
from fedaug.data.registry import load_dataset
from fedaug.engine.records.rundir import RunDir
from fedaug.engine.run import run_experiment
from tests.experiments.scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("few_steps_bn")


@pytest.fixture
def textures(tmp_path, monkeypatch, script):
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path / "cache"))
    return script.write_textures(tmp_path / "textures", per_class=6)


def test_the_textures_are_three_sites_of_three_classes_read_by_image_folder(script, textures, tmp_path):
    from PIL import Image

    files = sorted(textures.rglob("*.png"))
    assert len(files) == 3 * 3 * 6
    assert {(f.parent.parent.name, f.parent.name) for f in files} == {(s, c) for s in script.SITES
                                                                     for c in script.CLASSES}
    assert {Image.open(f).size + (Image.open(f).mode,) for f in files} == {(32, 32, "RGB")}
    again = script.write_textures(tmp_path / "again", per_class=6)
    assert all((again / f.relative_to(textures)).read_bytes() == f.read_bytes() for f in files)  # seeded
    data = load_dataset("image_folder", 0, root=str(textures))
    assert [c.name for c in data.clients] == list(script.SITES) and data.info["classes"] == sorted(script.CLASSES)
    # each site its own tint: the sites' mean colours differ
    means = [c.train.x.mean((0, 2, 3)) for c in data.clients]
    assert min(float((a - b).abs().max()) for i, a in enumerate(means) for b in means[i + 1:]) > 0.05


def test_an_unknown_texture_class_is_refused(script):
    with pytest.raises(ValueError, match=r"label must be 0, 1 or 2 \(stripes, checks, blobs\), got 3"):
        script.texture(3, np.random.default_rng(0))


def test_batch_statistics_normalise_by_the_batch_and_leave_the_running_ones(script):
    """One BatchNorm over two features: the running statistics (0, 1) leave feature 0 always larger; the
    batch's own (means 11 and 2, std 0.82 and 2.16) make sample 0 and 2 feature 1's (worked out by hand)."""
    model = nn.Sequential(nn.BatchNorm1d(2, affine=False))
    split = Split(torch.tensor([[10.0, 0.0], [12.0, 1.0], [11.0, 5.0]]), torch.tensor([1, 0, 1]))
    assert script.batch_stats_accuracy(model, split) == 1.0
    assert script.accuracy(model, split) == pytest.approx(1 / 3)  # eval(): the raw argmax, 0 everywhere
    assert torch.equal(model[0].running_mean, torch.zeros(2)) and torch.equal(model[0].running_var, torch.ones(2))


def test_standardise_gives_the_pooled_training_inputs_mean_0_std_1_and_applies_the_same_to_every_split(script,
                                                                                                     textures):
    data = load_dataset("image_folder", 0, root=str(textures))
    out = script.standardise(data)
    x = torch.cat([c.train.x for c in out.clients])
    torch.testing.assert_close(x.mean((0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(x.std((0, 2, 3)), torch.ones(3), atol=1e-5, rtol=0)
    raw = torch.cat([c.train.x for c in data.clients])
    mean, std = raw.mean((0, 2, 3)), raw.std((0, 2, 3))
    for before, after in zip(data.clients, out.clients, strict=True):
        torch.testing.assert_close(after.test.x, (before.test.x - mean[:, None, None]) / std[:, None, None])
        assert torch.equal(after.test.y, before.test.y)


def test_the_running_column_is_what_a_run_records_and_lags_the_weights(script, textures, tmp_path):
    rows = script.trace(textures, 3, ["train.local_steps=1", "threads=1"])
    cfg, _ = load_config(None, ["data.name=image_folder", f"data.options.root={textures}", "train.rounds=3",
                                "train.local_steps=1", "threads=1", f"out_dir={tmp_path / 'runs'}"])
    _, run_dir = run_experiment(cfg, quiet=True)
    recorded = [r["eval"]["mean"]["test_acc"] for r in RunDir(run_dir.path).rounds()]
    assert [row["running"] for row in rows] == pytest.approx(recorded, abs=1e-12)
    assert [row["loss"] for row in rows] == [r["train"]["loss"] for r in RunDir(run_dir.path).rounds()]
    assert [row["steps"] for row in rows] == [1, 1, 1]
    # three steps from variance 1: the first BatchNorm's running variance is still far above the weights' own
    assert all(row["var1"] > 2 for row in rows)
