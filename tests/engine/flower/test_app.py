"""The written Flower app: Flower accepts its pyproject.toml, and its run config gives back the config."""

from __future__ import annotations

import tomllib

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from flwr.common.config import flatten_dict, validate_config  # noqa: E402

from fedaug.core.errors import ConfigError  # noqa: E402
from fedaug.engine.flower.app import write_app  # noqa: E402
from fedaug.engine.flower.settings import FlowerSettings, run_config_for  # noqa: E402


def test_flower_accepts_the_app_and_its_run_config_carries_the_config(tmp_cfg, tmp_path):
    cfg = tmp_cfg("flea")
    app = write_app(cfg, tmp_path / "app", round_timeout=30)
    pyproject = tomllib.loads((app / "pyproject.toml").read_text())
    ok, errors, _ = validate_config(pyproject, check_module=True, project_dir=app)
    assert ok, errors
    run_config = flatten_dict(pyproject["tool"]["flwr"]["app"]["config"])
    settings = FlowerSettings.from_run_config(run_config)
    assert settings.cfg.to_dict() == cfg.to_dict()
    assert (settings.round_timeout, settings.connect_timeout, settings.out_dir) == (30.0, 120.0, "")


def test_overrides_apply_on_top_of_the_embedded_config(tmp_cfg):
    run_config = run_config_for(tmp_cfg("fedfa"), fedaug_overrides="train.rounds=5 seed=3")
    cfg = FlowerSettings.from_run_config(run_config).cfg
    assert (cfg.train.rounds, cfg.seed, cfg.method.augs) == (5, 3, ["fedfa"])


def test_round_timeout_zero_means_wait_for_every_reply(tmp_cfg):
    assert FlowerSettings.from_run_config(run_config_for(tmp_cfg(), round_timeout=0)).round_timeout is None


@pytest.mark.parametrize("change, message", [
    ({"fedaug-config": ""}, r"has no 'fedaug-config'; write the app with 'fedaug flower app"),
    ({"fedaug-config": "seed = ["}, r"'fedaug-config' is not valid TOML"),
    ({"round-timeout": -1.0}, r"'round-timeout' must be a number of seconds >= 0, got -1.0"),
    ({"fedaug-overrides": "train.lr=-1"}, r"'train.lr' must be > 0.0, got -1"),
])
def test_bad_run_configs_are_named(tmp_cfg, change, message):
    with pytest.raises(ConfigError, match=message):
        FlowerSettings.from_run_config({**run_config_for(tmp_cfg()), **change})


def test_unknown_setting_and_existing_app_are_refused(tmp_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown Flower setting 'round_timout'; choose from fedaug_overrides, round_timeout"):
        run_config_for(tmp_cfg(), round_timout=3)
    write_app(tmp_cfg(), tmp_path / "app")
    with pytest.raises(ConfigError, match=r"already holds a pyproject.toml; choose another --out or pass --force"):
        write_app(tmp_cfg(), tmp_path / "app")
    write_app(tmp_cfg(), tmp_path / "app", force=True)
