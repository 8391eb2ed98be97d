"""A ready Flower app directory for a fedaug config (what ``flwr new`` would write, offline).

The app is a ``pyproject.toml`` that names fedaug's ServerApp and ClientApp and embeds the
resolved fedaug config in Flower's run config (``fedaug-config``), plus a two-line package that
re-exports the apps. ``flwr run <dir> <federation>`` ships it to the SuperLink; every SuperNode
needs fedaug installed (``pip install 'fedaug[flower]'``), as the SuperLink installs nothing at
run time when started as docs/flower.md says.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fedaug.core.version import __version__
from fedaug.config.schema import RunConfig
from fedaug.core.errors import ConfigError
from fedaug.core.serialize import atomic_write_text
from fedaug.engine.flower.settings import CONFIG, KEYS, run_config_for

PACKAGE = "fedaug_app"

_MODULE = '''"""fedaug's {kind} for this app (written by `fedaug flower app`)."""

from fedaug.engine.flower.{kind} import app

__all__ = ["app"]
'''


def toml_string(text: str) -> str:
    """``text`` as a TOML string: a multi-line literal for several lines (when it can be), else a basic string."""
    if "\n" in text and "'''" not in text and "\r" not in text:
        return "'''\n" + text + "'''"
    return json.dumps(text)  # JSON string escapes are valid TOML basic-string escapes


def project_name(cfg: RunConfig) -> str:
    """A Flower app (Python project) name for ``cfg``: lowercase letters, digits and hyphens."""
    name = re.sub(r"[^a-z0-9]+", "-", (cfg.name or f"{cfg.data.name}-{cfg.method.base}").lower()).strip("-")
    return f"fedaug-{name}" if name else "fedaug-run"


def pyproject(cfg: RunConfig, **settings: Any) -> str:
    """The app's ``pyproject.toml`` (``settings``: the other run config keys, see :data:`KEYS`)."""
    config = run_config_for(cfg, **settings)
    lines = [f"# {key}: {KEYS[key][1]}\n{key} = " + (toml_string(v) if isinstance(v, str) else repr(float(v)))
             for key, v in config.items() if key != CONFIG]
    return f"""# Flower app for the fedaug config '{cfg.name}', written by `fedaug flower app` (fedaug {__version__}).
# Run it: flwr run <this directory> <federation>  (docs/flower.md)
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{project_name(cfg)}"
version = "1.0.0"
description = "fedaug experiment '{cfg.name}' on Flower"
license = "Apache-2.0"
dependencies = ["fedaug[flower]=={__version__}"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedaug"

[tool.flwr.app.components]
serverapp = "{PACKAGE}.server_app:app"
clientapp = "{PACKAGE}.client_app:app"

[tool.flwr.app.config]
# {CONFIG}: {KEYS[CONFIG][1]}; override single keys with fedaug-overrides
{CONFIG} = {toml_string(config[CONFIG])}
""" + "\n".join(lines) + "\n"


def write_app(cfg: RunConfig, out: str | Path, *, force: bool = False, **settings: Any) -> Path:
    """Write the Flower app for ``cfg`` into directory ``out``; return it.

    Args:
        cfg: the fedaug config (embedded as it is, resolved).
        out: the app directory (created).
        force: overwrite an existing app there.
        settings: Flower run config settings (``round_timeout``, ``connect_timeout``, ``out_dir``).

    Raises:
        ConfigError: ``out`` holds a ``pyproject.toml`` already (and not ``force``).
    """
    out = Path(out)
    if (out / "pyproject.toml").exists() and not force:
        raise ConfigError(f"'{out}' already holds a pyproject.toml; choose another --out or pass --force")
    atomic_write_text(out / "pyproject.toml", pyproject(cfg, **settings))
    atomic_write_text(out / PACKAGE / "__init__.py", f'"""Flower app for the fedaug config \'{cfg.name}\'."""\n')
    for kind in ("server_app", "client_app"):
        atomic_write_text(out / PACKAGE / f"{kind}.py", _MODULE.format(kind=kind))
    return out
