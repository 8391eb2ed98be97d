"""The engine's module paths before its parts got rooms of their own (issue 47), kept importable.

``fedaug.engine.local`` became :mod:`fedaug.engine.client.training`, ``fedaug.engine.simulate``
:mod:`fedaug.engine.run` and :mod:`fedaug.engine.fleet.inprocess`, and so on (:data:`MOVED`). An old path
still imports: it is a module whose attributes are looked up in the new modules, in order, and each
lookup warns once per place (:class:`DeprecationWarning`) with the name's new home. Unpickling an
object saved under an old path works the same way. Old paths that are now packages (``fedaug.engine.fleet``,
``fedaug.engine.server``, ``fedaug.engine.records``) keep their names through the packages' own
``__getattr__`` (:func:`forward`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

#: old module -> the modules its public names now live in, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "fedaug.engine.simulate": ("fedaug.engine.run", "fedaug.engine.fleet.inprocess"),
    "fedaug.engine.pool": ("fedaug.engine.fleet.processes",),
    "fedaug.engine.transport": ("fedaug.engine.fleet.transport",),
    "fedaug.engine.exchange": ("fedaug.engine.server.exchange",),
    "fedaug.engine.screen": ("fedaug.engine.server.screening",),
    "fedaug.engine.schedule": ("fedaug.engine.server.schedule", "fedaug.config.schema"),
    "fedaug.engine.evaluate": ("fedaug.engine.client.evaluate", "fedaug.engine.server.evaluation",
                               "fedaug.engine.protocol"),
    "fedaug.engine.finetune": ("fedaug.engine.client.finetune", "fedaug.engine.server.finetune",
                               "fedaug.engine.protocol"),
    "fedaug.engine.attack": ("fedaug.engine.client.attack",),
    "fedaug.engine.local": ("fedaug.engine.client.training",),
    "fedaug.engine.grouped": ("fedaug.engine.client.grouped", "fedaug.engine.client.step"),
    "fedaug.engine.graphed": ("fedaug.engine.client.graphed", "fedaug.engine.client.capture",
                              "fedaug.engine.client.step"),
    "fedaug.engine.worker": ("fedaug.engine.client.worker",),
    "fedaug.engine.query": ("fedaug.engine.client.query",),
    "fedaug.engine.runlock": ("fedaug.engine.records.runlock",),
    "fedaug.engine.tracking": ("fedaug.engine.records.tracking",),
    "fedaug.engine.progress": ("fedaug.engine.records.progress",),
}

#: (old module, old name) -> (new module, new name), for the names that changed with the move
RENAMED: dict[tuple[str, str], tuple[str, str]] = {
    ("fedaug.engine.evaluate", "SPLITS"): ("fedaug.engine.protocol", "EVAL_SPLITS"),
    ("fedaug.engine.finetune", "PREFIX"): ("fedaug.engine.protocol", "FINETUNE_PREFIX"),
    ("fedaug.engine.pool", "SPLITS"): ("fedaug.engine.fleet.processes", "PACKED_SPLITS"),
    # one client step for every execution (issue 45): the grouped path's rules are the step's
    ("fedaug.engine.grouped", "GROUPED_FORMS"): ("fedaug.engine.client.step", "STEP_FORMS"),
    ("fedaug.engine.grouped", "component_blocker"): ("fedaug.engine.client.step", "step_blocker"),
    ("fedaug.engine.grouped", "group_blockers"): ("fedaug.engine.client.step", "step_blockers"),
    ("fedaug.engine.graphed", "graph_blocker"): ("fedaug.engine.client.step", "step_blocker"),
    ("fedaug.engine.graphed", "graph_blockers"): ("fedaug.engine.client.step", "step_blockers"),
}


def lookup(old: str, name: str, homes: Sequence[str]) -> Any:
    """``name`` from the first of ``homes`` that has it, with a :class:`DeprecationWarning` naming it.

    Raises:
        AttributeError: none has it (as a module without the attribute would).
    """
    if (old, name) in RENAMED:
        home, new = RENAMED[old, name]
        warnings.warn(f"{old}.{name} moved: import {new} from {home}", DeprecationWarning, stacklevel=3)
        return getattr(importlib.import_module(home), new)
    for home in homes:
        module = importlib.import_module(home)
        if hasattr(module, name):
            warnings.warn(f"{old}.{name} moved: import it from {home}", DeprecationWarning, stacklevel=3)
            return getattr(module, name)
    raise AttributeError(f"module {old!r} has no attribute {name!r}")


def forward(package: str, names: dict[str, str]) -> Any:
    """A package ``__getattr__`` for the names an old module of the package's path had:
    ``names`` maps each to the module it now lives in."""
    def __getattr__(name: str) -> Any:
        if name in names:
            return lookup(package, name, (names[name],))
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class _OldModule(types.ModuleType):
    """An old engine module path: its attributes come from :data:`MOVED`'s modules."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lookup(self.__name__, name, MOVED[self.__name__])

    def __dir__(self) -> list[str]:
        return sorted({n for home in MOVED[self.__name__] for n in dir(importlib.import_module(home))})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the paths of :data:`MOVED` as :class:`_OldModule`\\ s."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _OldModule(spec.name, f"Moved: see {', '.join(MOVED[spec.name])}.")

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the attributes are looked up when asked for."""


def install() -> None:
    """Make the old paths importable (once per process)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
