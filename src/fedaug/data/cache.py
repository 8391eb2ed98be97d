"""A disk cache for generated data: a key dict names a file; load it, or build and save it.

Files live under ``$FEDAUG_CACHE`` (default ``~/.cache/fedaug``), named by a hash of the key, and
are written atomically with :func:`fedaug.core.serialize.save_tensors`. A file that cannot be read,
whose stored key differs from the requested one, or whose record lacks a tensor the caller needs,
is rebuilt rather than trusted (with a warning naming the file and what was wrong).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from torch import Tensor

from fedaug.core.errors import CheckpointError
from fedaug.core.serialize import load_tensors, save_tensors

Key = Mapping[str, Any]
Record = dict[str, Tensor]


def cache_dir() -> Path:
    """The cache directory: ``$FEDAUG_CACHE`` if set, else ``~/.cache/fedaug``."""
    env = os.environ.get("FEDAUG_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedaug"


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed distribution versions (``None`` when absent), for keys that depend on them."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _canonical(key: Key) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


def cache_path(key: Key, prefix: str = "data") -> Path:
    """The file that holds the record for ``key`` (JSON-serialisable values).

    Args:
        key: everything the record depends on (parameters, seed, format and package versions).
        prefix: readable start of the file name (``"digits4-mnist"``).
    """
    digest = hashlib.sha256(_canonical(key).encode()).hexdigest()[:20]
    return cache_dir() / f"{prefix}-{digest}.pt"


def load_or_build(key: Key, build: Callable[[], Record], prefix: str = "data", fields: Sequence[str] = ()) -> Record:
    """Return the cached record for ``key``, building and saving it on a miss.

    A corrupted or mismatched file, or one whose record lacks a tensor of ``fields``, is rebuilt
    (with a warning); a cache directory that cannot be written only warns, and the built record is
    still returned.

    Args:
        key: what the record depends on; see :func:`cache_path`.
        build: makes the record, a flat ``dict[str, Tensor]``, when it is not cached.
        prefix: readable start of the file name.
        fields: the tensors the caller reads from the record (``("x", "y")``).

    Returns:
        The record; a cache hit equals what ``build`` returned when the file was written.
    """
    path = cache_path(key, prefix)
    canonical = _canonical(key)
    if path.is_file():
        try:
            stored = load_tensors(path)
            record = stored["record"]
            if stored["key"] == canonical and isinstance(record, dict):
                missing = [f for f in fields if not isinstance(record.get(f), Tensor)]
                if not missing:
                    return record
                warnings.warn(f"cache file '{path}' has no tensor {', '.join(map(repr, missing))} (it holds "
                              f"{', '.join(map(repr, record)) or 'none'}); rebuilding it", stacklevel=2)
            else:
                warnings.warn(f"cache file '{path}' holds another key; rebuilding it", stacklevel=2)
        except (CheckpointError, KeyError, TypeError) as exc:
            warnings.warn(f"cache file '{path}' is unreadable ({exc}); rebuilding it", stacklevel=2)
    record = build()
    try:
        save_tensors(path, {"key": canonical, "record": record})
    except OSError as exc:
        warnings.warn(
            f"could not write cache file '{path}' ({exc}); set FEDAUG_CACHE to a writable "
            "directory to avoid regenerating the data next time",
            stacklevel=2,
        )
    return record
