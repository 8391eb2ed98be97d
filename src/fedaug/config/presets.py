"""Presets and comparison grids: TOML files shipped with fedaug; the first comment line of each is
its one-line description (``fedaug list presets``, ``fedaug list grids``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fedaug.core.errors import ConfigError, unknown_name

_DIR = Path(str(resources.files("fedaug") / "presets"))


def describe_files(directory: Path) -> dict[str, str]:
    """``stem -> first comment line`` of every ``*.toml`` in ``directory`` (presets, grids)."""
    out = {}
    for path in sorted(directory.glob("*.toml")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        out[path.stem] = first.lstrip("# ").strip()
    return out


#: preset name -> one-line description
PRESETS: dict[str, str] = describe_files(_DIR)
#: where the shipped comparison grids are (:mod:`fedaug.report.grid`)
GRID_DIR = _DIR / "grids"
#: shipped grid name -> one-line description
GRIDS: dict[str, str] = describe_files(GRID_DIR)


def preset_path(name: str) -> Path:
    """The TOML file of preset ``name``."""
    if name not in PRESETS:
        raise ConfigError(unknown_name("preset", name, PRESETS))
    return _DIR / f"{name}.toml"
