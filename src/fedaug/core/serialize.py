"""Atomic writes and checked reads of run records (DESIGN.md, invariant 6: nothing is lost).

Every file is written to a temporary sibling (``.<name>.<8 hex>.tmp``, created with mode 0666 so
the process umask applies, as for any file the user creates; a private key's with 0600, so it is never
readable by other users, not even for a moment), flushed, fsynced and renamed over the target, so a reader (or a resumed run after SIGKILL) sees either the old file or the new one, never
a half. A kill between creating and renaming leaves the temporary behind:
:func:`remove_temporaries` deletes those (a run directory's writer does, when it takes its lock).
JSON is strict: non-finite floats are written as ``null``, never as the bare ``NaN`` or
``Infinity`` that most JSON readers refuse.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fedaug.core.errors import CheckpointError

_TEMPORARY = re.compile(r"^\..+\.[0-9a-z_]{8}\.tmp$")  # ours, and the tempfile.mkstemp names of before
#: what a checkpoint may hold (dict and tuple subclasses included: ``OrderedDict``, ``torch.Size``)
_PLAIN = (dict, list, tuple, torch.Tensor, str, int, float, bool, type(None))


def _create_temporary(path: Path, mode: int) -> tuple[int, Path]:
    """A new, empty, exclusively created temporary sibling of ``path`` with ``mode`` less the umask:
    ``(fd, its path)``."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + rename); the file's mode
    is ``mode`` less the process umask (0600 for a secret: only its owner may read it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that writes into ``directory`` left when killed before their
    rename; call it only while no other process writes there (a run directory's lock holder).

    Returns:
        The deleted files.
    """
    directory = Path(directory)
    found = [p for p in directory.iterdir() if _TEMPORARY.match(p.name) and p.is_file()] if directory.is_dir() else []
    for p in found:
        p.unlink(missing_ok=True)
    return found


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode())


def finite_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-inf) replaced by ``None``, in nested dicts,
    lists and tuples (tuples become lists)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def to_json(obj: Any, indent: int | None = None) -> str:
    """Strict JSON text of ``obj`` with sorted keys; non-finite floats become ``null``
    (:func:`finite_json`), so every JSON reader can parse it."""
    return json.dumps(finite_json(obj), indent=indent, sort_keys=True, allow_nan=False)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented, strict JSON (:func:`to_json`) to ``path`` atomically."""
    atomic_write_text(path, to_json(obj, indent=2) + "\n")


def save_tensors(path: str | os.PathLike[str], obj: Any) -> None:
    """Save a nest of dicts/lists of tensors and scalars with :func:`torch.save`, atomically."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def _foreign(obj: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """``(location, object)`` of everything in ``obj`` that is not a dict, list, tuple, tensor,
    string, number, bool or None (dict keys included)."""
    if not isinstance(obj, _PLAIN):
        yield where or "the top level", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                yield f"a key of {where or 'the top level'}", k
            yield from _foreign(v, f"{where}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _foreign(v, f"{where}[{i}]")


def _why_unreadable(exc: Exception) -> str:
    """Why torch could not load a file, in our words (torch's own text advises ``weights_only=False``,
    i.e. running the file's pickled code: never the fix for a fedaug checkpoint)."""
    text = str(exc)
    if found := re.search(r"Unsupported global: GLOBAL ([\w.]+)", text):
        return f"it holds a {found.group(1)} object, which fedaug never writes"
    if "weights_only" in text or isinstance(exc, EOFError):
        return "its pickled contents cannot be read"
    return f"{type(exc).__name__}: {text.split('. ')[0]}"


def load_tensors(path: str | os.PathLike[str], fix: str = "delete it") -> Any:
    """Load what :func:`save_tensors` wrote, refusing pickled code (``weights_only=True``) and
    anything but dicts, lists, tuples, tensors, strings, numbers, bools and None.

    Args:
        path: the file.
        fix: what the error message tells the user to do about a corrupt file.

    Raises:
        CheckpointError: the file is missing, truncated, corrupt or not a fedaug tensor file; the
            message names the file and ends with ``fix``.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupted archives
        raise CheckpointError(f"checkpoint '{path}' is corrupt or not a fedaug checkpoint "
                              f"({_why_unreadable(exc)}); {fix}") from None
    foreign = next(_foreign(obj), None)
    if foreign is not None:
        where, what = foreign
        raise CheckpointError(
            f"checkpoint '{path}' is not a fedaug checkpoint: {where} holds a {type(what).__module__}."
            f"{type(what).__qualname__} ({what!r:.60}), and fedaug checkpoints hold only dicts, lists, tensors, "
            f"numbers and strings; {fix}")
    return obj
