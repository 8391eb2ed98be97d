"""Options that name a local file or directory, and how a relative one is made absolute.

A dataset, model or method component declares such an option with the annotation :data:`LocalPath`
(``root: LocalPath | None = None``), or with ``Annotated[str, PathOption(within="root")]`` for a
path inside another option's directory; a run-config field declares it with ``opt(..., path=...)``
(:mod:`fedaug.config.schema`). When a config is read, every such value given relative is made
absolute once (:func:`fedaug.config.paths.resolve_paths`: against the folder of the TOML file that
gives it, or the current directory for the command line), so a run directory's ``config.toml``
names the same files from any directory (docs/cli.md, "Paths in a config").
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from fedaug.core.typecheck import is_union


@dataclass(frozen=True)
class PathOption:
    """Marks an option whose value names a local file or directory (see the module docstring).

    Args:
        within: another option of the same table whose directory a relative value is inside
            (``image_folder``'s ``split``, inside ``root``); empty: the config's own rule.
        uri: the value is a URI (an MLflow tracking URI): only the local path it names
            (``sqlite:///FILE``, ``file:DIR``, or a bare path) is made absolute (:func:`absolute_uri`).
    """

    within: str = ""
    uri: bool = False


#: a string option naming a local file or directory (relative: see the module docstring)
LocalPath = Annotated[str, PathOption()]


def path_option(tp: Any) -> PathOption | None:
    """The :class:`PathOption` that the annotation ``tp`` carries, alone or as a member of a union
    (``LocalPath | None``); ``None`` when it carries none.

    >>> path_option(LocalPath | None), path_option(str)
    (PathOption(within='', uri=False), None)
    """
    if typing.get_origin(tp) is Annotated:
        return next((m for m in tp.__metadata__ if isinstance(m, PathOption)), None)
    if is_union(tp):
        return next(filter(None, map(path_option, typing.get_args(tp))), None)
    return None


@functools.cache
def path_options(fn: Callable[..., Any]) -> dict[str, PathOption]:
    """The keyword-only options of ``fn`` (a builder, a component's ``__init__``) that name paths, by
    name; empty where its annotations cannot be resolved at run time. Read once per function (every
    config read asks)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError):
        return {}
    found = {p: path_option(hints.get(p)) for p, v in inspect.signature(fn).parameters.items()
             if v.kind is inspect.Parameter.KEYWORD_ONLY}
    return {p: option for p, option in found.items() if option is not None}


def absolute(path: str, root: Path) -> str:
    """``path`` as an absolute path: ``~`` expanded; a relative one taken from ``root`` and resolved
    (symbolic links and ``..`` followed), an absolute one kept as written.

    >>> absolute("data/../images", Path("/exp")), absolute("/srv/images", Path("/exp"))
    ('/exp/images', '/srv/images')
    """
    given = Path(path).expanduser()
    return str(given if given.is_absolute() else (root / given).resolve())


def absolute_uri(uri: str, root: Path) -> str:
    """``uri`` with the local path it names made absolute (:func:`absolute`): ``sqlite:///FILE``
    (``sqlite:////abs/FILE`` is absolute already), ``file:DIR`` (written back as ``file:///abs/DIR``)
    and a bare path; a server (``http://host``), an in-memory database and a URI naming a host are
    kept as they are.

    >>> absolute_uri("sqlite:///mlflow.db", Path("/exp")), absolute_uri("file:./mlruns", Path("/exp"))
    ('sqlite:////exp/mlflow.db', 'file:///exp/mlruns')
    >>> absolute_uri("http://host:5000", Path("/exp")), absolute_uri("sqlite:///:memory:", Path("/exp"))
    ('http://host:5000', 'sqlite:///:memory:')
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite" and uri.startswith(f"{parts.scheme}:///"):
        db, _, query = uri[len(parts.scheme) + 4:].partition("?")
        if db and db != ":memory:":
            return f"{parts.scheme}:///{absolute(db, root)}" + (f"?{query}" if query else "")
    elif scheme == "file" and not parts.netloc:
        return Path(absolute(unquote(parts.path), root)).as_uri()
    elif not scheme and uri:
        return absolute(uri, root)
    return uri


def make_absolute(value: Any, option: PathOption, root: Path) -> Any:
    """``value`` of an option declared by ``option``, made absolute against ``root``; a value that is
    not a non-empty string (unset, empty: off, or of a wrong type the validator reports) as it is."""
    if not isinstance(value, str) or not value:
        return value
    return absolute_uri(value, root) if option.uri else absolute(value, root)
