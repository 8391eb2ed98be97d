"""Name registries for methods, datasets, models and presets (Dassl / timm style)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedaug.core.errors import ConfigError, unknown_name
from fedaug.core.plugins import load_installed

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from lowercase names to objects, with one-line descriptions.

    Args:
        kind: what the registry holds, used in error messages (``"method"``, ``"dataset"``).

    >>> models = Registry("model")
    >>> @models.register("tiny", "a tiny model")
    ... def tiny(): return 1
    >>> models.get("tiny")()
    1
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, help: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` with the one-line description ``help``."""
        if name != name.lower():
            raise ValueError(f"{self.kind} names are lowercase, got '{name}'")

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = obj
            self._help[name] = help
            return obj

        return add

    def get(self, name: str) -> T:
        """Return the object registered as ``name``; a name not registered yet is looked up again after
        the installed plugins are imported (the entry points of ``fedaug.plugins``, once per process:
        :func:`fedaug.core.plugins.load_installed`).

        Raises:
            ConfigError: ``name`` is unknown; the message lists the names and the closest one.
        """
        if name not in self._items:
            load_installed()
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(unknown_name(self.kind, name, self._items)) from None

    def help(self, name: str) -> str:
        """The one-line description of ``name``."""
        self.get(name)
        return self._help[name]

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
