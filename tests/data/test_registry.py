"""Dataset options are checked by name and type before any data is read or generated."""

from __future__ import annotations

import pytest

from fedaug.core.errors import ConfigError
from fedaug.data.registry import DATASETS, load_dataset
from tests.conftest import NON_FINITE, numeric_options

FLOATS = [(n, k) for n in DATASETS.names() for k in numeric_options(DATASETS.get(n), fractional=True)]
COUNTS = [(n, k) for n in DATASETS.names() for k in numeric_options(DATASETS.get(n), fractional=False)]


def test_the_enumeration_finds_the_known_options():
    assert {("synthetic", "shift"), ("digits4", "val_fraction"), ("cifar10", "alpha")} <= set(FLOATS)
    assert {("synthetic", "num_clients"), ("fashion_mnist", "num_clients"), ("brain_mri", "size")} <= set(COUNTS)


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name, key", FLOATS, ids=[f"{n}.{k}" for n, k in FLOATS])
def test_every_float_option_refuses_nan_and_inf(name, key, value):
    with pytest.raises(ConfigError, match=rf"^data\.options\.{key} must be a finite number, got -?(nan|inf) "
                                          rf"\(dataset '{name}'\)$"):
        load_dataset(name, 0, **{key: value})


@pytest.mark.parametrize("value", [2.5, True, [2.5]], ids=["fraction", "bool", "list"])
@pytest.mark.parametrize("name, key", COUNTS, ids=[f"{n}.{k}" for n, k in COUNTS])
def test_every_count_option_refuses_fractions_and_booleans(name, key, value):
    with pytest.raises(ConfigError, match=rf"^data\.options\.{key} must be .*integer.*, got "):
        load_dataset(name, 0, **{key: value})


def test_lists_of_counts_refuse_fractions():
    with pytest.raises(ConfigError, match=r"^data\.options\.test_folds must be a list of integers, got \[10, 2\.5\] "
                                          r"\(dataset 'urbansound8k'\)$"):
        load_dataset("urbansound8k", 0, test_folds=[10, 2.5])


def test_unknown_and_mistyped_options_are_reported_together():
    with pytest.raises(ConfigError, match=r"^dataset 'synthetic' has no option 'num_client' \(did you mean "
                                          r"'num_clients'\?\); its options are: .*; data\.options\.noise must be a "
                                          r"finite number, got nan \(dataset 'synthetic'\)$"):
        load_dataset("synthetic", 0, num_client=3, noise=float("nan"))
