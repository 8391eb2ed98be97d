"""Data bundles: federations built once, saved as tensors, and read back in place of building them, on a
machine without the sources (a GPU machine with none of fedaug's optional data packages; docs/data.md, "Data
bundles").

``fedaug data export GRID... --out DIR`` builds every distinct ``(dataset, seed, options)`` the grids' cells load
(:func:`export_bundle`) and writes ``DIR/bundle.pt`` (:func:`~fedaug.core.serialize.save_tensors`) and
``DIR/bundle.json`` (what it holds). With ``FEDAUG_DATA_BUNDLE=DIR`` set,
:func:`~fedaug.data.registry.load_dataset` reads a federation the bundle holds instead of building it
(:func:`bundled_federation`); one it does not hold is built, with a warning. A federation read back equals the
one built bit for bit (every split's tensors, dtypes, names, groups and ``info``): the export checks each one.

The samples are stored once: every input row (one sample's ``x``) and every target row is kept in a pool of
distinct rows per kind, dtype and shape, and each split as indices into the pools, so a federation that another
one holds in part (a held-out domain's variant, a smaller train fraction, the same source images under another
seed) costs only its indices. A float tensor whose values are all ``k / 255`` (images from 8-bit sources) is
pooled as ``uint8`` and read back as ``uint8.to(dtype) / 255``, the same operation the builders use, and a tensor
of integers in 0..255 (class labels, masks) as ``uint8``; any other tensor as it is. Each pool, and the indices
of every split (one ``int32`` tensor), is compressed with LZMA.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedaug.core.errors import CheckpointError, DataError
from fedaug.core.serialize import atomic_write_json, load_tensors, save_tensors
from fedaug.data.base import ClientData, FederatedData, Split

#: the environment variable that names a bundle directory for :func:`bundled_federation`
ENV = "FEDAUG_DATA_BUNDLE"
#: the files of a bundle directory: the tensors, and what they hold (readable without torch)
TENSORS, INDEX = "bundle.pt", "bundle.json"
#: the layout version of ``bundle.pt``
FORMAT = 1
SPLITS = ("train", "val", "test")
#: the stored tensor that holds every reference's row indices, one after another (int32)
INDICES = "indices"
#: how a pool stores its rows: ``uint8`` read back as ``uint8.to(dtype) / 255``, ``uint8`` read back as
#: ``uint8.to(dtype)``, or the tensor as it is
ENCODINGS = ("u8/255", "u8", "raw")

Request = tuple[str, int, Mapping[str, Any]]


def federation_key(name: str, seed: int, options: Mapping[str, Any]) -> str:
    """The key of a federation in a bundle: its dataset, seed and options (``held_out`` included) as canonical
    JSON (sorted keys; a tuple reads as a list).

    >>> federation_key("digits4", 3, {"usps_style": "v2"})
    '{"dataset":"digits4","options":{"usps_style":"v2"},"seed":3}'
    """
    return json.dumps({"dataset": name, "seed": seed, "options": dict(options)}, sort_keys=True,
                      separators=(",", ":"))


def encode(t: Tensor) -> tuple[str, Tensor]:
    """``(encoding, rows)``: ``t`` as a pool stores it (:data:`ENCODINGS`): ``"u8/255"`` where ``t`` is a float
    tensor equal to its ``uint8`` rounding ``.to(t.dtype) / 255``, ``"u8"`` for integers in 0..255, else ``"raw"``.

    >>> encode(torch.tensor([0.0, 1.0, 128 / 255]))
    ('u8/255', tensor([  0, 255, 128], dtype=torch.uint8))
    >>> encode(torch.tensor([0.5]))[0], encode(torch.tensor([3, 9]))[0], encode(torch.tensor([300]))[0]
    ('raw', 'u8', 'raw')
    """
    if t.is_floating_point():
        u8 = (t * 255).round().clamp(0, 255).to(torch.uint8)
        if torch.equal(decode("u8/255", u8, t.dtype), t):
            return "u8/255", u8
    elif t.dtype != torch.bool and not t.is_complex() and (t.numel() == 0 or 0 <= int(t.min()) <= int(t.max()) <= 255):
        return "u8", t.to(torch.uint8)
    return "raw", t


def decode(encoding: str, rows: Tensor, dtype: torch.dtype) -> Tensor:
    """The tensor that :func:`encode` stored as ``rows`` with ``encoding``, in ``dtype``."""
    if encoding == "u8/255":
        return rows.to(dtype) / 255
    if encoding == "u8":
        return rows.to(dtype)
    if encoding == "raw":
        return rows
    raise DataError(f"a data bundle's pool has the encoding {encoding!r}; this fedaug reads {', '.join(ENCODINGS)}")


@dataclass
class _Pool:
    """Distinct rows of one encoding, dtype and row shape, in order of first appearance (an export's, in memory)."""

    rows: list[Tensor] = field(default_factory=list)
    where: dict[bytes, int] = field(default_factory=dict)

    def add(self, rows: Tensor) -> Tensor:
        """The indices of ``rows`` ``(N, *shape)`` in the pool, adding those it lacks; ``(N,)`` int32."""
        out = []
        for row in rows:
            digest = hashlib.blake2b(row.numpy().tobytes(), digest_size=20).digest()
            if digest not in self.where:
                self.where[digest] = len(self.rows)
                self.rows.append(row.clone())
            out.append(self.where[digest])
        return torch.tensor(out, dtype=torch.int32)

    def tensor(self, row_shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """Every row, stacked: ``(P, *row_shape)``."""
        return torch.stack(self.rows) if self.rows else torch.empty((0, *row_shape), dtype=dtype)


def _pool_key(encoding: str, t: Tensor) -> str:
    return f"{encoding}:{str(t.dtype).removeprefix('torch.')}:{'x'.join(map(str, t.shape[1:]))}"


def _row_shape(key: str) -> tuple[int, ...]:
    """The shape of one row of the pool ``key`` (:func:`_pool_key`)."""
    return tuple(int(n) for n in key.split(":")[2].split("x") if n)


def _stored_dtype(key: str) -> torch.dtype:
    """The dtype the pool ``key`` stores its rows in."""
    encoding, dtype, _ = key.split(":")
    return _dtype(dtype) if encoding == "raw" else torch.uint8


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DataError(f"a data bundle names the dtype {name!r}, which this torch does not have")
    return dtype


class _Packer:
    """An export's pools, federations and indices, in memory: each split's tensor is a reference ``[pool key,
    start, stop]`` to the rows ``indices[start:stop]`` of the pool (all references' indices are stored as one
    tensor, :data:`INDICES`)."""

    def __init__(self) -> None:
        self.pools: dict[str, _Pool] = {}
        self.federations: dict[str, dict[str, Any]] = {}
        self.indices: dict[int, Tensor] = {}  # by start
        self.size = 0

    def _ref(self, t: Tensor) -> list[Any]:
        encoding, rows = encode(t)
        key = _pool_key(encoding, t)
        idx = self.pools.setdefault(key, _Pool()).add(rows.reshape(len(t), *t.shape[1:]))
        start, self.size = self.size, self.size + len(idx)
        self.indices[start] = idx
        return [key, start, self.size]

    def add(self, key: str, data: FederatedData) -> None:
        """Pool ``data``'s tensors and keep it under ``key``."""
        clients = [{"name": c.name, "group": c.group,
                    **{s: {"x": self._ref(getattr(c, s).x), "y": self._ref(getattr(c, s).y)} for s in SPLITS}}
                   for c in data.clients]
        self.federations[key] = {"name": data.name, "task": data.task, "num_classes": data.num_classes,
                                 "input_shape": list(data.input_shape), "info": data.info, "clients": clients}

    def take(self, key: str, start: int, stop: int) -> Tensor:
        """The rows ``indices[start:stop]`` of pool ``key``, stacked (as the bundle read back gives them)."""
        rows = [self.pools[key].rows[i] for i in self.indices[start].tolist()] if stop > start else []
        return torch.stack(rows) if rows else torch.empty((0, *_row_shape(key)), dtype=_stored_dtype(key))

    def stacked(self) -> dict[str, Tensor]:
        """Each pool's rows, stacked: ``(P, *row shape)``; and under :data:`INDICES` every reference's indices."""
        pools = {key: pool.tensor(_row_shape(key), _stored_dtype(key)) for key, pool in self.pools.items()}
        return {**pools, INDICES: torch.cat([*self.indices.values(), torch.empty(0, dtype=torch.int32)])}


def _unpack(entry: Mapping[str, Any], take: Callable[[str, int, int], Tensor]) -> FederatedData:
    """The federation of a bundle's ``entry``, the rows of each tensor given by ``take(pool key, start, stop)``."""
    def tensor(ref: list[Any]) -> Tensor:
        key, start, stop = ref
        encoding, dtype, _ = key.split(":")
        return decode(encoding, take(key, start, stop), _dtype(dtype))

    clients = [ClientData(c["name"], c["group"], *(Split(tensor(c[s]["x"]), tensor(c[s]["y"])) for s in SPLITS))
               for c in entry["clients"]]
    return FederatedData(entry["name"], entry["task"], entry["num_classes"], tuple(entry["input_shape"]), clients,
                         entry["info"])


def _bits_differ(a: Tensor, b: Tensor) -> int:
    """How many elements of two tensors of one dtype and shape differ in their bits (NaNs and signed zeros too)."""
    size = a.element_size()
    return int((a.contiguous().view(torch.uint8).reshape(-1, size) != b.contiguous().view(torch.uint8)
                .reshape(-1, size)).any(dim=1).sum()) if a.numel() else 0


def federation_differences(a: FederatedData, b: FederatedData) -> list[str]:
    """Where two federations differ (empty: equal bit for bit): their name, task, classes, input shape,
    ``info``, clients' names and groups, and each split's tensors (dtype, shape and every value's bits)."""
    out = [f"{k}: {getattr(a, k)!r} != {getattr(b, k)!r}" for k in ("name", "task", "num_classes", "input_shape",
                                                                      "info") if getattr(a, k) != getattr(b, k)]
    if a.num_clients != b.num_clients:
        return [*out, f"clients: {a.num_clients} != {b.num_clients}"]
    for ca, cb in zip(a.clients, b.clients):
        out += [f"client {ca.name!r} {k}: {getattr(ca, k)!r} != {getattr(cb, k)!r}" for k in ("name", "group")
                if getattr(ca, k) != getattr(cb, k)]
        for s in SPLITS:
            for part in ("x", "y"):
                ta, tb = getattr(getattr(ca, s), part), getattr(getattr(cb, s), part)
                where = f"client {ca.name!r} {s}.{part}"
                if ta.dtype != tb.dtype or ta.shape != tb.shape:
                    out.append(f"{where}: {ta.dtype} {tuple(ta.shape)} against {tb.dtype} {tuple(tb.shape)}")
                elif (moved := _bits_differ(ta, tb)):
                    out.append(f"{where}: {moved} value(s) differ")
    return out


@dataclass(frozen=True)
class Exported:
    """What :func:`export_bundle` wrote: the ``federations`` it holds, the ``bytes`` of ``bundle.pt``, and per
    pool its distinct ``rows`` and stored (compressed) ``pool_bytes``."""

    federations: int
    bytes: int
    rows: dict[str, int]
    pool_bytes: dict[str, int]


def _compress(t: Tensor) -> Tensor:
    """``t``'s bytes, LZMA-compressed, as a ``uint8`` tensor."""
    return torch.frombuffer(bytearray(lzma.compress(t.contiguous().numpy().tobytes())), dtype=torch.uint8)


def _decompress(data: Tensor, dtype: torch.dtype, shape: list[int]) -> Tensor:
    """The tensor :func:`_compress` stored, in ``dtype`` and ``shape``."""
    raw = bytearray(lzma.decompress(data.numpy().tobytes()))
    return torch.from_numpy(np.frombuffer(raw, dtype=torch.empty(0, dtype=dtype).numpy().dtype)).reshape(shape)


def export_bundle(wanted: Iterable[Request], out: Path, build: Callable[..., FederatedData]) -> Exported:
    """Build each distinct federation of ``wanted`` (``(dataset, seed, options)``) once with ``build(dataset,
    seed, **options)`` and write them as a bundle into ``out`` (module docstring; an earlier bundle there is
    replaced).

    Raises:
        DataError: a federation read back from its pools differs from the one built (named, with where; never
            expected: nothing is written then), or what ``build`` raises.
    """
    packer = _Packer()
    for name, seed, options in wanted:
        key = federation_key(name, seed, options)
        if key in packer.federations:
            continue
        built = build(name, seed, **dict(options))
        packer.add(key, built)
        moved = federation_differences(_unpack(packer.federations[key], packer.take), built)
        if moved:
            raise DataError(f"the data bundle would not give back {key} as built: {'; '.join(moved[:5])}")
    pools = packer.stacked()
    stored = {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": _compress(t)}
              for k, t in pools.items()}
    out = Path(out)
    save_tensors(out / TENSORS, {"format": FORMAT, "pools": stored, "federations": packer.federations})
    atomic_write_json(out / INDEX, {"format": FORMAT, "federations": [json.loads(k) for k in packer.federations],
                                    "pools": {k: {"rows": len(t), "bytes": int(stored[k]["data"].numel())}
                                              for k, t in pools.items()}})
    return Exported(len(packer.federations), (out / TENSORS).stat().st_size, {k: len(t) for k, t in pools.items()},
                    {k: int(v["data"].numel()) for k, v in stored.items()})


def bundle_keys(directory: Path) -> set[str]:
    """The keys (:func:`federation_key`) of the federations a bundle directory holds.

    Raises:
        DataError: ``directory`` holds no bundle (no ``bundle.json``) or one of another format.
    """
    index = Path(directory) / INDEX
    if not index.is_file():
        raise DataError(f"'{directory}' is not a data bundle (no {INDEX}); write one with fedaug data export "
                        f"GRID... --out {directory}" + (f", or unset {ENV}" if os.environ.get(ENV) else ""))
    meta = json.loads(index.read_text())
    if meta.get("format") != FORMAT:
        raise DataError(f"data bundle '{directory}' has format {meta.get('format')!r}, this fedaug reads {FORMAT}; "
                        "export it again with this fedaug")
    return {federation_key(f["dataset"], f["seed"], f["options"]) for f in meta["federations"]}


@lru_cache(maxsize=2)
def _read(path: str, mtime_ns: int) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A bundle's pools (decompressed) and federations, read once per file version."""
    try:
        stored = load_tensors(path, fix="export the bundle again (fedaug data export)")
    except CheckpointError as exc:
        raise DataError(str(exc).replace("checkpoint", "data bundle", 1)) from None
    pools = {k: _decompress(v["data"], _dtype(v["dtype"]), v["shape"]) for k, v in stored["pools"].items()}
    return pools, stored["federations"]


def read_bundled(directory: Path, name: str, seed: int, options: Mapping[str, Any]) -> FederatedData | None:
    """The federation ``(name, seed, options)`` from the bundle in ``directory``; ``None`` where it does not hold it.

    Raises:
        DataError: ``directory`` holds no bundle of this format, or its tensors are unreadable.
    """
    key = federation_key(name, seed, options)
    if key not in bundle_keys(directory):
        return None
    path = Path(directory) / TENSORS
    pools, federations = _read(str(path), path.stat().st_mtime_ns)
    return _unpack(federations[key], lambda pool, a, b: pools[pool].index_select(0, pools[INDICES][a:b].long()))


def bundled_federation(name: str, seed: int, options: Mapping[str, Any]) -> FederatedData | None:
    """The federation from the bundle that ``$FEDAUG_DATA_BUNDLE`` names, if it is set and holds it; where it is
    set but does not, ``None`` with a warning naming the federation (the caller builds it)."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    found = read_bundled(Path(directory), name, seed, options)
    if found is None:
        warnings.warn(f"{ENV}='{directory}' holds no federation {federation_key(name, seed, options)}; building it "
                      "(fedaug data export GRID... --out DIR bundles what a grid loads)", stacklevel=3)
    return found
