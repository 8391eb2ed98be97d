"""fedaug's data in Flower's records: message parts, nested states and meters.

A message part (a flat ``dict[str, Tensor]``) becomes one ``ArrayRecord`` named ``part.<component>``,
so Flower mods and tools see the tensors as they are. A nested state (per-client state, server
state, meters: dicts, lists, tensors and scalars, DESIGN.md invariant 2) becomes an ``ArrayRecord``
of its tensors keyed by their path plus a ``ConfigRecord`` holding the nest's shape as JSON, in
which dict keys keep their type (a client id stays an ``int``). Tensors travel as NumPy ``.npy``
bytes, so values arrive bit for bit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import Tensor

from fedaug.core.errors import PayloadError
from fedaug.core.payload import Message

PART = "part."


def put_parts(content: RecordDict, message: Mapping[str, object]) -> None:
    """Add each component's part of ``message`` to ``content`` as ``ArrayRecord`` ``part.<name>``.

    A part that is not a dict of tensors is left out; the receiver then finds it missing and
    rejects it with that reason.
    """
    for name, part in message.items():
        if isinstance(part, Mapping) and all(isinstance(t, Tensor) for t in part.values()):
            content[PART + name] = ArrayRecord({k: t.detach().cpu() for k, t in part.items()})


def get_parts(content: RecordDict) -> Message:
    """The parts :func:`put_parts` added, as ``{component name: {tensor name: tensor}}``."""
    return {name[len(PART):]: dict(record.to_torch_state_dict()) for name, record in content.array_records.items()
            if name.startswith(PART)}


def travelled_nbytes(content: RecordDict) -> dict[str, int]:
    """Bytes of each part :func:`put_parts` added, counted as decoded parts are (elements x item
    size, from each array's shape and dtype) but without decoding them: the uplink of a reply that
    is rejected as malformed (an array whose dtype NumPy does not know counts its raw bytes)."""
    def nbytes(array: Any) -> int:
        try:
            return math.prod(array.shape) * np.dtype(array.dtype).itemsize
        except TypeError:
            return len(array.data)

    return {name[len(PART):]: sum(nbytes(a) for a in record.values())
            for name, record in content.array_records.items() if name.startswith(PART)}


def put_tree(content: RecordDict, name: str, tree: object) -> None:
    """Add a nest of dicts (str or int keys), lists, tuples, tensors and scalars under ``name``.

    Raises:
        PayloadError: the nest holds something else (a live object), naming where.
    """
    tensors: dict[str, Tensor] = {}
    shape = _encode(tree, tensors, name)
    content[f"{name}.arrays"] = ArrayRecord(tensors)
    content[f"{name}.tree"] = ConfigRecord({"json": json.dumps(shape)})


def get_tree(content: RecordDict, name: str) -> Any:
    """What :func:`put_tree` added under ``name``.

    Raises:
        PayloadError: nothing was added under ``name``.
    """
    if f"{name}.tree" not in content.config_records:
        raise PayloadError(f"the message holds no '{name}'; sender and receiver run different fedaug versions?")
    tensors = content.array_records[f"{name}.arrays"].to_torch_state_dict()
    return _decode(json.loads(str(content.config_records[f"{name}.tree"]["json"])), tensors)


def has_tree(content: RecordDict, name: str) -> bool:
    """Whether :func:`put_tree` added something under ``name``."""
    return f"{name}.tree" in content.config_records


def drop_tree(content: RecordDict, name: str) -> None:
    """Remove what :func:`put_tree` added under ``name`` (nothing if absent)."""
    for suffix in (".arrays", ".tree"):
        if f"{name}{suffix}" in content:
            del content[f"{name}{suffix}"]


def _encode(obj: object, tensors: dict[str, Tensor], path: str) -> Any:
    if isinstance(obj, Tensor):
        tensors[path] = obj.detach().cpu()
        return {"t": path}
    if isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise PayloadError(f"cannot send '{path}': key {k!r} is a {type(k).__name__}; keys are str or int")
            items.append([k, _encode(v, tensors, f"{path}/{k}")])
        return {"d": items}
    if isinstance(obj, (list, tuple)):
        return {"l" if isinstance(obj, list) else "u": [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"v": obj}
    raise PayloadError(f"cannot send '{path}': a {type(obj).__name__}; state holds dicts, lists, tensors and scalars")


def _decode(shape: dict[str, Any], tensors: Mapping[str, Tensor]) -> Any:
    (kind, value), = shape.items()
    if kind == "t":
        return tensors[value]
    if kind == "d":
        return {k: _decode(v, tensors) for k, v in value}
    if kind in ("l", "u"):
        items = [_decode(v, tensors) for v in value]
        return items if kind == "l" else tuple(items)
    return value
