"""Config validation messages, overrides and the resolved-TOML round trip."""

from __future__ import annotations

import dataclasses
import tomllib
import typing

import pytest

from fedaug.config.load import apply_overrides, dump_toml, load_config, parse_value
from fedaug.config.schema import RunConfig, describe, validate
from fedaug.core.errors import ConfigError


def test_defaults_validate():
    cfg = validate({})
    assert isinstance(cfg, RunConfig) and cfg.train.local_epochs == 1 and cfg.train.local_steps is None


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"trian": {}}, r"unknown key 'trian' \(did you mean 'train'\?\); valid keys here: seed, name"),
        ({"train": {"lr_rate": 0.1}}, r"unknown key 'train.lr_rate'.*valid keys here: rounds, participation"),
        ({"train": {"lr": 0.0}}, r"'train.lr' must be > 0.0, got 0.0"),
        ({"train": {"lr": -1}}, r"'train.lr' must be > 0.0, got -1"),
        ({"train": {"participation": 1.5}}, r"'train.participation' must be > 0.0 and <= 1.0, got 1.5"),
        ({"train": {"rounds": 0}}, r"'train.rounds' must be >= 1, got 0"),
        ({"train": {"rounds": 2.5}}, r"'train.rounds' must be an integer, got 2.5"),
        ({"train": {"rounds": True}}, r"'train.rounds' must be an integer, got True"),
        ({"train": {"optimizer": "sdg"}}, r"'train.optimizer' must be one of sgd, adam, got 'sdg' \(did you mean 'sgd'\?\)"),
        ({"train": {"local_epochs": 1, "local_steps": 5}}, r"either 'train.local_epochs' or 'train.local_steps'"),
        ({"train": 3}, r"'train' must be a table, got 3"),
        ({"method": {"augs": "fedfa"}}, r"'method.augs' must be a list of strings, got 'fedfa'"),
    ],
)
def test_bad_config_messages_name_key_value_and_allowed(raw, match):
    with pytest.raises(ConfigError, match=match):
        validate(raw)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        validate({"train": {"lr": -1, "rounds": 0}, "bogus": 1})
    msg = str(info.value)
    assert "train.lr" in msg and "train.rounds" in msg and "bogus" in msg


@pytest.mark.parametrize(
    "text, value",
    [("0.5", 0.5), ("3", 3), ("true", True), ("sgd", "sgd"), ('"a b"', "a b"),
     ("[fedrdn, fedfa]", ["fedrdn", "fedfa"]), ("[1, 2]", [1, 2]), ("[]", [])],
)
def test_override_values_parse_as_toml_or_bare_words(text, value):
    assert parse_value(text) == value


def test_overrides_create_nested_tables_and_do_not_touch_the_input():
    raw = {"train": {"lr": 0.1}}
    out = apply_overrides(raw, ["train.lr=0.5", "method.options.fedavg.bn=local", "seed=3"])
    assert out == {"train": {"lr": 0.5}, "method": {"options": {"fedavg": {"bn": "local"}}}, "seed": 3}
    assert raw == {"train": {"lr": 0.1}}
    with pytest.raises(ConfigError, match=r"override 'train.lr' is not of the form key=value"):
        apply_overrides(raw, ["train.lr"])
    with pytest.raises(ConfigError, match=r"'lr' is a value, not a table"):
        apply_overrides(raw, ["train.lr.x=1"])


def test_resolved_config_round_trips_through_toml():
    cfg = validate({"seed": 3, "method": {"augs": ["a", "b"], "options": {"fedavg": {"bn": "local"}}},
                    "data": {"options": {"alpha": 0.1, "domains": ["mnist"]}}, "train": {"local_steps": 7}})
    text = dump_toml(cfg.to_dict())
    assert validate(tomllib.loads(text)).to_dict() == cfg.to_dict()


def test_load_config_from_preset_with_overrides_and_errors(tmp_path):
    cfg, label = load_config(None, ["train.rounds=2"])
    assert label == "digits4" and cfg.train.rounds == 2 and cfg.name == "digits4-fedavg"
    # named after what it runs, not after the preset it started from; a name given is kept
    assert load_config("digits4", ["data.name=synthetic", "method.augs=[fedrdn, fedfa]"])[0].name == \
        "synthetic-fedavg+fedrdn+fedfa"
    assert load_config("digits4", ["name=mine"])[0].name == "mine"
    with pytest.raises(ConfigError, match=r"'digit4' is neither a preset nor a TOML file.*did you mean 'digits4'"):
        load_config("digit4")
    with pytest.raises(ConfigError, match=r"config file '.*missing.toml' does not exist"):
        load_config(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = = 1")
    with pytest.raises(ConfigError, match=r"is not valid TOML"):
        load_config(str(bad))


def test_describe_lists_every_key_with_help():
    keys = {o.name: o for o in describe()}
    assert {"seed", "train.lr", "train.participation", "eval.best_by", "method.augs", "imports"} <= set(keys)
    assert all(o.help for o in keys.values())
    lr, participation, best_by = keys["train.lr"], keys["train.participation"], keys["eval.best_by"]
    assert (lr.type, lr.default, lr.bounds) == ("float", 0.01, "> 0")
    assert (participation.bounds, best_by.choices) == ("> 0 and <= 1", ("val", "test"))


def _leaf_fields(want: type) -> list[str]:
    """Every schema key whose field is annotated ``want`` (walked from the schema itself)."""
    def walk(cls: type, prefix: str) -> list[str]:
        out = []
        for name, tp in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(tp):
                out += walk(tp, f"{prefix}{name}.")
            elif tp is want:
                out.append(f"{prefix}{name}")
        return out

    return walk(RunConfig, "")


FLOAT_KEYS = _leaf_fields(float)
INT_KEYS = _leaf_fields(int)


def _nested(key: str, value: object) -> dict[str, object]:
    *tables, leaf = key.split(".")
    raw: dict[str, object] = {leaf: value}
    for t in reversed(tables):
        raw = {t: raw}
    return raw


def test_the_schema_enumeration_finds_the_numeric_keys():
    assert {"train.lr", "train.participation", "train.momentum", "train.weight_decay", "train.lr_decay",
            "train.lr_min"} <= set(FLOAT_KEYS)
    assert {"seed", "train.rounds", "train.min_clients", "train.local_epochs", "train.local_steps",
            "eval.batch_size"} <= set(INT_KEYS)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_refuses_nan_and_inf(key, value):
    with pytest.raises(ConfigError, match=rf"'{key}' must be a finite number, got -?(nan|inf)"):
        validate(_nested(key, value))


@pytest.mark.parametrize("value", [1.5, True], ids=["fraction", "bool"])
@pytest.mark.parametrize("key", INT_KEYS)
def test_every_integer_key_refuses_fractions_and_booleans(key, value):
    with pytest.raises(ConfigError, match=rf"'{key}' must be an integer, got {value}"):
        validate(_nested(key, value))


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"data": {"options": {"domains": ["mnist", None]}}},
         r"'data.options.domains\[1\]' is None, which a TOML list cannot hold; remove it"),
        ({"model": {"options": {1: 2}}}, r"'model.options' has the key 1 \(int\); keys must be strings"),
        ({"data": {"options": {"root": object()}}},
         r"'data.options.root' is <object object .*> \(object\), which a TOML config cannot hold"),
        ({"name": "run\ud800"}, r"'name' holds '\\ud800', a lone surrogate that cannot be written as UTF-8"),
        ({"method": {"options": {"fedprox": 3}}}, r"'method.options' must be a table of tables, got \{'fedprox': 3\}"),
        ({"method": {"augs": ["fedfa", 1]}}, r"'method.augs' must be a list of strings"),
        ({"name": "x" * 201}, r"'name' is 201 characters long; a run name may have at most 200"),
    ],
)
def test_values_a_config_file_cannot_hold_are_refused(raw, match):
    with pytest.raises(ConfigError, match=match):
        validate(raw)


def test_none_options_stay_defaults_and_are_not_written():
    cfg = validate({"method": {"augs": ["fedfa"], "options": {"fedfa": {"lam": None}}}})
    assert "lam" not in tomllib.loads(dump_toml(cfg.to_dict()))["method"]["options"]["fedfa"]


@pytest.mark.parametrize("key", ["in_channels", "num_classes"])
def test_model_options_the_dataset_sets_are_refused_with_the_fix(key):
    with pytest.raises(ConfigError, match=rf"'model.options.{key}' is set by the dataset.*remove it from \[model.options\]"):
        validate({"model": {"name": "small_cnn", "options": {key: 3}}})
