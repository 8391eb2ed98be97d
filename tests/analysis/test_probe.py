"""Probing a federation: pooled samples and feature dCor refuse sizes they cannot use."""

from __future__ import annotations

import pytest

from fedaug.analysis.probe import feature_dcor, pooled
from fedaug.core.errors import ConfigError
from fedaug.data.registry import load_dataset
from fedaug.models.registry import build_model


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", 0, num_clients=2, samples_per_client=20, num_classes=2, size=8)


def test_pooled_draws_without_replacement_and_refuses_impossible_counts(data):
    x, y = pooled(data, "train", 5, seed=0)
    assert x.shape[0] == y.shape[0] == 5
    total = sum(len(c.train) for c in data.clients)
    with pytest.raises(ConfigError, match=r"the number of pooled samples must be >= 1, got 0"):
        pooled(data, "train", 0, seed=0)
    with pytest.raises(ConfigError, match=rf"asked for {total + 1} train samples, the federation holds {total}"):
        pooled(data, "train", total + 1, seed=0)


def test_feature_dcor_needs_two_samples(data):
    model = build_model("small_cnn", in_channels=1, num_classes=2, width=8)
    x, _ = pooled(data, "train", 3, seed=0)
    assert 0 <= feature_dcor(model, x, model.feature_stages[0]) <= 1
    with pytest.raises(ConfigError, match=r"dCor needs at least 2 samples and batches of at least 2, got 1 samples"):
        feature_dcor(model, x[:1], model.feature_stages[0])
    with pytest.raises(ConfigError, match=r"got 3 samples in batches of 1"):
        feature_dcor(model, x, model.feature_stages[0], batch=1)
