"""Atomic writes and checked reads of run records (DESIGN.md, invariant 6: nothing is lost).

Every file is written to a temporary sibling, flushed, fsynced and renamed over the target, so a
reader (or a resumed run after SIGKILL) sees either the old file or the new one, never a half.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedaug.core.errors import CheckpointError


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_tensors(path: str | os.PathLike[str], obj: Any) -> None:
    """Save a nest of dicts/lists of tensors and scalars with :func:`torch.save`, atomically."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_tensors(path: str | os.PathLike[str]) -> Any:
    """Load what :func:`save_tensors` wrote, refusing pickled code (``weights_only=True``).

    Raises:
        CheckpointError: the file is missing, truncated or not a fedaug tensor file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupted archives
        raise CheckpointError(
            f"checkpoint '{path}' is corrupted or truncated ({type(exc).__name__}: {exc}); "
            "delete it to resume from the previous checkpoint, or start the run again"
        ) from None
