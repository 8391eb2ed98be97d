"""Configuration: the run schema, TOML files, ``key=value`` overrides and presets."""

from fedaug.config.load import apply_overrides, dump_toml, load_config, parse_config
from fedaug.config.presets import PRESETS, preset_path
from fedaug.config.schema import RunConfig

__all__ = ["PRESETS", "RunConfig", "apply_overrides", "dump_toml", "load_config", "parse_config", "preset_path"]
