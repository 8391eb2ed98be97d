"""Import a script of experiments/ as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def load_script(name: str) -> ModuleType:
    """``experiments/<name>.py``, executed as a fresh module named ``name`` (registered in
    ``sys.modules``, as an import would, so that its dataclasses resolve their module)."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
