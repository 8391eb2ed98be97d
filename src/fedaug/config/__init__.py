"""Configuration: the run schema, TOML files, ``key=value`` overrides and presets.

The names below are imported on first use (PEP 562): reading the presets and grids
(:mod:`fedaug.config.presets`, ``fedaug list``) imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: exported name -> the module it is imported from, on first use
_EXPORTS = {
    **dict.fromkeys(("apply_overrides", "dump_toml", "load_config", "parse_config"), "fedaug.config.load"),
    **dict.fromkeys(("PRESETS", "preset_path"), "fedaug.config.presets"),
    "RunConfig": "fedaug.config.schema",
}

__all__ = ["PRESETS", "RunConfig", "apply_overrides", "dump_toml", "load_config", "parse_config", "preset_path"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedaug.config' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
