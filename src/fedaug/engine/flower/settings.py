"""A Flower run's settings: the fedaug config travels in Flower's run config.

Flower's run config holds flat scalars only, so the resolved fedaug config rides in it as TOML
text (``fedaug-config``), with ``key=value`` overrides on top (``fedaug-overrides``, e.g.
``flwr run APP FED --run-config 'fedaug-overrides="train.rounds=5 seed=1"'``), next to the
settings of the Flower transport itself.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedaug.config.load import apply_overrides, dump_toml, parse_config
from fedaug.config.schema import RunConfig
from fedaug.core.errors import ConfigError

CONFIG, OVERRIDES, ROUND_TIMEOUT, CONNECT_TIMEOUT, OUT_DIR, RESUME_DIR = (
    "fedaug-config", "fedaug-overrides", "round-timeout", "connect-timeout", "out-dir", "resume-dir")

#: the Flower run config keys fedaug reads, their defaults and meaning
KEYS: dict[str, tuple[Any, str]] = {
    CONFIG: ("", "the resolved fedaug config, as TOML text"),
    OVERRIDES: ("", "space-separated fedaug key=value overrides applied on top, e.g. 'train.rounds=5'"),
    ROUND_TIMEOUT: (600.0, "seconds the server waits for the replies of one phase; 0 waits for all"),
    CONNECT_TIMEOUT: (120.0, "seconds the server waits for every client's SuperNode at the start"),
    OUT_DIR: ("", "where the server writes the run directory (default: the config's out_dir)"),
    RESUME_DIR: ("", "a run directory of this config to finish from its newest checkpoint (a method whose "
                     "clients keep no per-client state); default: a new run"),
}


@dataclass(frozen=True)
class FlowerSettings:
    """A Flower run's fedaug config and transport settings.

    Args:
        cfg: the validated fedaug config (overrides applied).
        round_timeout: seconds to wait for one phase's replies (``None``: no limit).
        connect_timeout: seconds to wait for every client's SuperNode to connect.
        out_dir: where the server writes the run directory.
        resume_dir: a run directory to finish (``""``: start a new one).

    >>> from fedaug.config.schema import validate
    >>> run_config = run_config_for(validate({}), round_timeout=0, fedaug_overrides="train.rounds=3")
    >>> settings = FlowerSettings.from_run_config(run_config)
    >>> settings.cfg.train.rounds, settings.round_timeout
    (3, None)
    """

    cfg: RunConfig
    round_timeout: float | None
    connect_timeout: float
    out_dir: str
    resume_dir: str = ""

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "FlowerSettings":
        """Read the settings from a Flower run config (``context.run_config``).

        Raises:
            ConfigError: no fedaug config, invalid TOML, a bad override or a negative time.
        """
        text = run_config.get(CONFIG, "")
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"the Flower run config has no '{CONFIG}'; write the app with "
                              "'fedaug flower app CONFIG --out DIR' (it embeds the config)")
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"run config '{CONFIG}' is not valid TOML: {exc}") from None
        overrides = shlex.split(str(run_config.get(OVERRIDES, "")))
        cfg = parse_config(apply_overrides(raw, overrides))
        times = {}
        for key in (ROUND_TIMEOUT, CONNECT_TIMEOUT):
            value = run_config.get(key, KEYS[key][0])
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"run config '{key}' must be a number of seconds >= 0, got {value!r}")
            times[key] = float(value)
        return cls(cfg, times[ROUND_TIMEOUT] or None, times[CONNECT_TIMEOUT], str(run_config.get(OUT_DIR, "")),
                   str(run_config.get(RESUME_DIR, "")))


def run_config_for(cfg: RunConfig, **settings: Any) -> dict[str, Any]:
    """The Flower run config that carries ``cfg`` (every key of :data:`KEYS`, defaults filled in).

    Args:
        cfg: the fedaug config.
        settings: values for the other keys, by their Python names (``round_timeout=30``).
    """
    out = {key: default for key, (default, _) in KEYS.items()}
    out[CONFIG] = dump_toml(cfg.to_dict())
    for name, value in settings.items():
        key = name.replace("_", "-")
        if key not in KEYS or key == CONFIG:
            raise ConfigError(f"unknown Flower setting '{name}'; choose from "
                              f"{', '.join(k.replace('-', '_') for k in KEYS if k != CONFIG)}")
        out[key] = value
    return out
