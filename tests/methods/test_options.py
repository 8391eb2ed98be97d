"""Component option checks: every number of every registered component refuses NaN and inf, and
every count refuses fractions and booleans, by name, before a run directory is written."""

from __future__ import annotations

import math
import warnings

import pytest

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.engine.run import run_experiment
from fedaug.methods.options import check_noise, check_probability, check_range, range_problem
from fedaug.methods.recipe import METHODS, build_recipe
from tests.conftest import NON_FINITE, numeric_options, tiny_raw


FLOATS = [(n, k) for n in METHODS.names() for k in numeric_options(METHODS.get(n).__init__, fractional=True)]
COUNTS = [(n, k) for n in METHODS.names() for k in numeric_options(METHODS.get(n).__init__, fractional=False)]


def test_the_enumeration_finds_the_known_options():
    assert {("fedprox", "mu"), ("fedfa", "eps"), ("flea", "dcor_final_weight"), ("norm", "mean"),
            ("fedadam", "beta2"), ("mixstyle", "alpha")} <= set(FLOATS)
    assert set(COUNTS) == {("ccvr", "num_virtual"), ("ccvr", "epochs"), ("ccvr", "batch_size"),
                           ("fedmix", "mean_batch"), ("flea", "dcor_decay_rounds"), ("flea", "max_buffer"),
                           ("krum", "f"), ("krum", "m")}


def _recipe(name: str) -> dict[str, object]:
    if METHODS.get(name).role == "server":
        return {"base": name, "augs": []}
    return {"base": "fedavg", "augs": [name]}


def _refused_everywhere(name: str, key: str, value: object, tmp_path) -> None:
    """The component, ``build_recipe`` and ``run_experiment`` each refuse ``value`` by its key;
    the run writes nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # options that warn about a default combination
        with pytest.raises(ConfigError, match=rf"\b{name}\.{key}\b"):
            METHODS.get(name)(**{key: value})
    recipe = _recipe(name)
    with pytest.raises(ConfigError, match=rf"method\.options\.{name}\.{key} must be"):
        build_recipe(recipe["base"], recipe["augs"], {name: {key: value}})
    raw = tiny_raw()
    raw["out_dir"] = str(tmp_path / "runs")
    raw["method"] = {**recipe, "options": {name: {key: value}}}
    with pytest.raises(ConfigError, match=rf"method\.options\.{name}\.{key}"):
        run_experiment(validate(raw), quiet=True)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name, key", FLOATS, ids=[f"{n}.{k}" for n, k in FLOATS])
def test_every_float_option_refuses_nan_and_inf(name, key, value, tmp_path):
    _refused_everywhere(name, key, value, tmp_path)


@pytest.mark.parametrize("value", [2.5, True], ids=["fraction", "bool"])
@pytest.mark.parametrize("name, key", COUNTS, ids=[f"{n}.{k}" for n, k in COUNTS])
def test_every_count_option_refuses_fractions_and_booleans(name, key, value, tmp_path):
    _refused_everywhere(name, key, value, tmp_path)


@pytest.mark.parametrize("value, kw, message", [
    (-1, {"lo": 0.0}, "fedprox.mu must be >= 0, got -1"),
    (math.nan, {"lo": 0.0}, "fedprox.mu must be a finite number >= 0, got nan"),
    (math.inf, {"lo": 0.0, "hi": 1.0, "hi_open": True}, "fedprox.mu must be a finite number >= 0 and < 1, got inf"),
    (-math.inf, {}, "fedprox.mu must be a finite number, got -inf"),
    ("0.1", {"lo": 0.0}, "fedprox.mu must be a finite number >= 0, got '0.1'"),
    (True, {"lo": 0.0}, "fedprox.mu must be a finite number >= 0, got True"),
    (2.5, {"lo": 1, "integer": True}, "fedprox.mu must be an integer >= 1, got 2.5"),
    (0, {"lo": 1, "integer": True}, "fedprox.mu must be an integer >= 1, got 0"),
])
def test_range_problem_names_the_option_the_limits_and_the_value(value, kw, message):
    assert range_problem("fedprox.mu", value, **kw) == message
    with pytest.raises(ConfigError, match=rf"^{message}$".replace(".", r"\.").replace("(", r"\(")):
        check_range("fedprox.mu", value, **kw)


@pytest.mark.parametrize("value, kw", [(0.0, {"lo": 0.0}), (1, {"lo": 1, "integer": True}), (0.5, {"hi": 1.0})])
def test_range_problem_accepts_values_in_range(value, kw):
    assert range_problem("x.y", value, **kw) is None
    check_range("x.y", value, **kw)


@pytest.mark.parametrize("value", [*NON_FINITE, -0.1, 1.5, True])
def test_check_probability_refuses_nan_inf_and_out_of_range(value):
    with pytest.raises(ConfigError, match=rf"fedfa\.p must be in \[0, 1\], got {value}"):
        check_probability("fedfa", "p", value)
    assert check_probability("fedfa", "p", 1) == 1.0


@pytest.mark.parametrize("value", NON_FINITE)
def test_check_noise_refuses_nan_and_inf(value):
    with pytest.raises(ConfigError, match=rf"fedrdn\.share_noise must be a finite number >= 0 \(0 = no noise\), "
                                          rf"got {value}"):
        check_noise("fedrdn", value, "absolute")
