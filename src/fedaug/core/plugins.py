"""Your own datasets, models and methods: modules fedaug imports so that they register themselves.

Three ways, as pytest and Flower load theirs:

- a config's ``imports`` list (``imports = ["my_components"]``), imported whenever the config is
  validated, so every process that reads it (``fedaug resume``, a worker process, a grid cell, a
  Flower app) imports them again: a run directory's ``config.toml`` records them;
- ``--import MODULE`` on the command line, which adds the module to the run's ``imports``;
- an installed package's entry point in the group ``fedaug.plugins`` (``[project.entry-points."fedaug.plugins"]
  my_plugin = "my_package.fedaug_plugin"``), imported the first time a registry is asked for a
  name it does not hold (:meth:`fedaug.core.registry.Registry.get`) and by ``fedaug list``.

An entry of ``imports`` is a module name found on ``sys.path`` (``my_package.components``), or a
path to a ``.py`` file or a package directory. :func:`resolve_import` writes each in the form any
process finds again: a relative path, or a module name found only next to the config file (or in
the current directory), becomes an absolute path.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType

from fedaug.core.errors import ConfigError
from fedaug.core.paths import absolute

#: the entry-point group of installed plugins
GROUP = "fedaug.plugins"
_STATE = {"group_loaded": False}


def is_path(entry: str) -> bool:
    """Whether an ``imports`` entry names a file or directory (``x.py``, ``dir/x``), not a module name."""
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def _findable(name: str) -> bool:
    """Whether the module ``name`` can be imported from ``sys.path`` (already imported counts)."""
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing
        return False


def resolve_import(entry: str, root: Path) -> str:
    """``entry`` as a run records it: a relative path made absolute against ``root``; a module
    name that ``sys.path`` does not find but ``root`` holds (``<root>/<name>.py`` or a package
    ``<root>/<name>/``) as that file's or directory's absolute path; anything else as it is
    (:func:`import_plugin` reports what it cannot import).

    >>> resolve_import("json", Path("/nowhere")), resolve_import("plugins/gnoise.py", Path("/exp"))
    ('json', '/exp/plugins/gnoise.py')
    """
    if is_path(entry):
        return absolute(entry, root)
    if not _findable(entry) and "." not in entry:
        for candidate in (root / f"{entry}.py", root / entry):
            if candidate.is_file() or (candidate / "__init__.py").is_file():
                return str(candidate.resolve())
    return entry


def _load_path(path: Path) -> ModuleType:
    """Import the ``.py`` file or package directory ``path`` as the module named after it."""
    package = path.is_dir()
    name = path.name if package else path.stem
    file = path / "__init__.py" if package else path
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == file.resolve():
            return loaded
        raise ConfigError(f"imports: '{path}' would be the module '{name}', but a module of that name is already "
                          f"imported from '{getattr(loaded, '__file__', None) or 'a built-in'}'; rename the file")
    if not file.is_file():
        raise ConfigError(f"imports: '{path}' is neither a .py file nor a package directory (with __init__.py); "
                          "give the path of your module, or a module name on sys.path")
    spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=[str(path)] if package
                                                  else None)
    if spec is None or spec.loader is None:
        raise ConfigError(f"imports: '{path}' cannot be imported (no loader for '{file.name}'); give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_plugin(entry: str) -> ModuleType:
    """Import one ``imports`` entry (a module name, or a path: :func:`is_path`); importing it again
    returns the same module.

    Raises:
        ConfigError: it cannot be found, or importing it raised; the message names it, the cause
            and the fix.
    """
    try:
        if is_path(entry):
            return _load_path(Path(entry))
        return importlib.import_module(entry)
    except ConfigError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == entry or entry.startswith(exc.name + ".")):
            raise ConfigError(f"imports: cannot find the module '{entry}'; give a module name on sys.path "
                              "(PYTHONPATH), or the path of its .py file or package directory (relative paths "
                              "are relative to the config file, or with --import to the current directory)") from None
        raise ConfigError(f"imports: importing '{entry}' failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # the plugin's own error, with its traceback chained
        raise ConfigError(f"imports: importing '{entry}' failed: {type(exc).__name__}: {exc}") from exc


def import_problems(entries: Sequence[str]) -> list[str]:
    """Import every entry; the problems, one per entry that failed (:func:`import_plugin`)."""
    problems = []
    for entry in entries:
        try:
            import_plugin(entry)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def installed() -> list[EntryPoint]:
    """The entry points of the group ``fedaug.plugins`` (installed plugins), sorted by name; none is imported."""
    return sorted(entry_points(group=GROUP), key=lambda e: e.name)


def load_installed() -> list[str]:
    """Import every installed plugin (:func:`installed`) the first time it is called; the names of
    the entry points it imported (empty on later calls).

    Raises:
        ConfigError: a plugin fails to import; the message names it, its package and the cause.
    """
    if _STATE["group_loaded"]:
        return []
    _STATE["group_loaded"] = True
    names = []
    for ep in installed():
        try:
            ep.load()
        except Exception as exc:
            dist = f" of the package '{ep.dist.name}'" if ep.dist is not None else ""
            raise ConfigError(f"the installed fedaug plugin '{ep.name}' ({ep.value}{dist}, entry-point group "
                              f"{GROUP}) failed to import: {type(exc).__name__}: {exc}; fix or uninstall it") from exc
        names.append(ep.name)
    return names


def resolve_imports(entries: Iterable[str], root: Path) -> list[str]:
    """Each entry resolved (:func:`resolve_import`), duplicates dropped, order kept."""
    return list(dict.fromkeys(resolve_import(e, root) for e in entries))
