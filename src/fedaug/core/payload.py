"""Message parts: named tensors exchanged between a component and its counterpart.

A *part* is a flat ``dict[str, Tensor]`` owned by one component; a *message* maps component
names to parts. Parts are validated on receipt against a *spec* (expected names, shapes, dtypes,
value ranges) and must hold finite values no larger than a magnitude bound (DESIGN.md, invariant 3;
docs/engine.md, "The trust boundary"). Their sizes are what communication accounting counts
(invariant 5).
"""

from __future__ import annotations

import math
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedaug.core import server_ops
from fedaug.core.errors import PayloadError

Part = dict[str, Tensor]
Message = dict[str, Part]

#: what a floating tensor of a training uplink is, as its spec declares it (:attr:`TensorSpec.kind`): the
#: update screening measures each kind of a part on its own and against the same kind of the round's
#: other uploads (engine/screen.py). ``"parameters"``: the model's trained parameters;
#: ``"statistics"``: its normalisation statistics (BatchNorm running means and variances, which the
#: forward pass accumulates); ``"control"``: a quantity the client computes for the server's step
#: (SCAFFOLD's control-variate change, FedNova's a_i); ``"shared"``: statistics an augmentation
#: shares (FedFA's channel statistics, FedRDN's input statistics, CCVR's class statistics);
#: ``"data"``: rows of data or features and sample counts, whose size grows with the client's data,
#: so that their norm says nothing of an attack (not screened; bounded by ``trust.max_abs``).
KINDS = ("parameters", "statistics", "control", "shared", "data")


@dataclass(frozen=True)
class TensorSpec:
    """What one tensor of a part must look like.

    Args:
        shape: exact shape; ``None`` in a position accepts any size there, a string names a size
            that must be the same wherever the name appears in one part (e.g. ``"rows"`` for
            features and their labels).
        dtype: exact dtype.
        finite: require every value to be finite (floating dtypes only).
        low, high: the allowed values, inclusive (``None``: unbounded on that side), e.g. labels
            in ``[0, num_classes - 1]`` or standard deviations ``>= 0``.
        kind: what the tensor is, one of :data:`KINDS` (read for training uplinks by the update
            screening; default ``"shared"``).

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """

    shape: tuple[int | str | None, ...]
    dtype: torch.dtype
    finite: bool = True
    low: float | None = None
    high: float | None = None
    kind: str = "shared"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TensorSpec kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def like(cls, t: Tensor, finite: bool = True, kind: str = "shared") -> "TensorSpec":
        """The spec of a tensor with ``t``'s exact shape and dtype."""
        return cls(tuple(t.shape), t.dtype, finite, kind=kind)

    def problems(self, name: str, t: object, max_abs: float | None = None,
                 sizes: dict[str, int] | None = None, extremes: tuple[float, float] | None = None,
                 values: bool = True) -> list[str]:
        """Every way ``t`` fails this spec, one sentence each (empty when it passes): its
        :meth:`layout_problems`, then its :meth:`value_problems`.

        Args:
            max_abs: the largest ``|value|`` allowed (``None``: no bound).
            sizes: named sizes already seen in this part (updated with the ones ``t`` fixes).
            extremes: ``t``'s ``(min, max)`` as :func:`value_extremes` reads them (``None``: read here).
            values: check the values (``False`` where they are known to pass: :func:`norm_bounded`).
        """
        if not isinstance(t, Tensor):
            return [f"'{name}' must be a tensor, got {type(t).__name__}"]
        layout = self.layout_problems(name, t, sizes)
        return layout + self.value_problems(name, t, max_abs, extremes) if values else layout

    def layout_problems(self, name: str, t: Tensor, sizes: dict[str, int] | None = None) -> list[str]:
        """``t``'s dtype and shape against the spec's (``sizes``: as in :meth:`problems`)."""
        if t.dtype == self.dtype and t.shape == self.shape:  # the common case, for a shape of sizes only
            return []
        out = []
        if t.dtype != self.dtype:
            out.append(f"'{name}' has dtype {t.dtype}, expected {self.dtype}")
        sizes = {} if sizes is None else sizes
        ok_shape = len(t.shape) == len(self.shape) and all(
            e is None or (sizes.setdefault(e, s) == s if isinstance(e, str) else e == s)
            for e, s in zip(self.shape, t.shape)
        )
        if not ok_shape:
            want = tuple("*" if e is None else e if isinstance(e, int) else f"{e}={sizes.get(e, '*')}"
                         for e in self.shape)
            out.append(f"'{name}' has shape {tuple(t.shape)}, expected {want}")
        return out

    def value_problems(self, name: str, t: Tensor, max_abs: float | None = None,
                       extremes: tuple[float, float] | None = None) -> list[str]:
        """``t``'s values against the spec's: finite, within ``max_abs``, within ``[low, high]``
        (``extremes``: as in :meth:`problems`)."""
        if t.is_complex() or t.numel() == 0:
            return []
        out = []
        lo, hi = value_extremes({name: t})[name] if extremes is None else extremes
        if t.is_floating_point() and (self.finite or max_abs is not None) and math.isnan(lo):
            bad = int((~torch.isfinite(t)).sum())
            return [f"'{name}' holds {bad} non-finite value(s) (NaN or inf)"]
        if max_abs is not None and max(abs(lo), abs(hi)) > max_abs:
            out.append(f"'{name}' holds |value| up to {max(abs(lo), abs(hi)):.3g}, over the bound {max_abs:g} "
                       "(trust.max_abs)")
        if self.low is not None and lo < self.low:
            out.append(f"'{name}' holds {lo:g}, below its smallest allowed value {self.low:g}")
        if self.high is not None and hi > self.high:
            out.append(f"'{name}' holds {hi:g}, above its largest allowed value {self.high:g}")
        return out


Spec = Mapping[str, TensorSpec]


#: the dtypes whose values :func:`norm_bounded` bounds (float16 and bfloat16 squares underflow too soon)
_NORMED = (torch.float32, torch.float64)


def norm_bounded(tensors: Mapping[str, Tensor], max_abs: float | None) -> set[str]:
    """The names of the tensors whose L2 norm alone proves every value finite and within ``max_abs``:
    contiguous float32/float64 CPU tensors whose norm is finite and at most ``max_abs / 2``. For the
    others nothing follows (read their extremes, :func:`value_extremes`).

    Sound for any summation order: the squares are non-negative and rounding to nearest is
    monotone, so a computed norm is at least ``max|t| (1 - 2**-24)**2`` whatever the order of the
    additions (and an infinite or NaN value makes it non-finite). All norms come from one call
    (``torch._foreach_norm``, what ``torch.nn.utils.clip_grad_norm_`` uses), and a norm reads a tensor
    about 3x faster than ``aminmax`` on the CPU, where validating every upload of many small
    clients would otherwise cost a good part of their local steps.
    """
    groups: dict[torch.dtype, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        if t.dtype in _NORMED and t.is_cpu and t.is_contiguous() and t.numel():
            groups.setdefault(t.dtype, {})[name] = t.detach()
    half = math.inf if max_abs is None else max_abs / 2
    out = set()
    for group in groups.values():
        norms = torch.stack(torch._foreach_norm(list(group.values()))).tolist()
        out.update(name for name, norm in zip(group, norms) if math.isfinite(norm) and norm <= half)
    return out


class Against:
    """What :func:`validate_part` measures of a reply's part against the part the server sent (the
    ``reference``): each float32/float64 entry's distance (:func:`distance`, into :attr:`distances`) to
    its counterpart there (:func:`counterpart`; measured where it has the entry's dtype and device), or,
    for an entry without one (a tensor the client computed, e.g. SCAFFOLD's control-variate change), its
    own norm, its distance to zero; and what that pass tells of the entry's values, so that one pass
    over an upload gives the server's value check and its update norms (engine/screen.py).

    Where the compiled server library is built (:mod:`fedaug.core.server_ops`), a contiguous float32
    CPU entry's pass reads ``t`` and ``r`` once and also gives ``t``'s extremes. Elsewhere the part's
    differences and their norms are two multi-tensor operations per device (``torch._foreach_sub``,
    ``torch._foreach_norm``: on a GPU a few launches per upload, not two per entry; the part's distances are
    read with one synchronisation), and where ``max|r| + ||t - r||`` is finite and at most half the bound every value
    of ``t`` is finite and within it (``|t_i| <= |r_i| + |t_i - r_i|``; ``r = 0`` for an entry without
    a counterpart), so ``t`` needs no read of its own. Both paths give the same verdicts and messages,
    and the same distances unless a float64 sum falls within its own rounding error of a float32
    rounding boundary (entries without a counterpart take the same path on both).

    Args:
        reference: the part sent, ``{name: tensor}``.
        cache: kept by the caller across a phase: each reference tensor's largest ``|value|`` (read once
            per object and version).
    """

    def __init__(self, reference: Mapping[str, object], cache: dict[object, Any]) -> None:
        self.reference, self.cache = reference, cache
        self.distances: dict[str, float] = {}

    def measure(self, tensors: Mapping[str, Tensor], max_abs: float | None,
                boundable: set[str]) -> tuple[set[str], dict[str, tuple[float, float]]]:
        """Fill :attr:`distances` for the non-empty float32/float64 ``tensors``. Return the names in
        ``boundable`` (those whose spec sets no range) proven within bounds, and the extremes
        ``(min, max)`` read on the way (both NaN where a value is not finite; :func:`value_extremes`)."""
        pairs: dict[str, tuple[Tensor, Tensor]] = {}
        alone: dict[str, Tensor] = {}
        single: dict[str, tuple[Tensor, Tensor]] = {}  # the pairs the compiled library takes
        ops = server_ops.loaded()
        for name, t in tensors.items():
            if t.dtype not in _NORMED or not t.numel():
                continue
            r = self.reference.get(name)
            if not counterpart(t, r):
                alone[name] = t
            elif r.dtype == t.dtype and ((t.is_cpu and r.is_cpu) or t.device == r.device):  # type: ignore[union-attr]
                pairs[name] = (t, r)  # type: ignore[assignment]
                if ops is not None and t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() and r.is_contiguous():  # type: ignore[union-attr]
                    single[name] = (t, r)  # type: ignore[assignment]
        extremes: dict[str, tuple[float, float]] = {}
        if single:
            with torch.no_grad():
                rows = ops.upload_stats([t for t, _ in single.values()], [r for _, r in single.values()]).tolist()
            distances = self.distances
            for name, (squares, lo, hi) in zip(single, rows):
                distances[name] = _float32(math.sqrt(squares))
                extremes[name] = (lo, hi)
        norms: dict[torch.device, dict[str, Tensor]] = {}
        differences = {n: p for n, p in pairs.items() if n not in single}
        if differences or alone:
            with torch.no_grad():
                for device, group in _by_device(differences).items():
                    diffs = torch._foreach_sub([t for t, _ in group.values()], [r for _, r in group.values()])
                    norms.setdefault(device, {}).update(zip(group, torch._foreach_norm(diffs, 2, dtype=torch.float64)))
                for device, group in _by_device(alone).items():
                    norms.setdefault(device, {}).update(
                        zip(group, torch._foreach_norm(list(group.values()), 2, dtype=torch.float64)))
        half = math.inf if max_abs is None else max_abs / 2
        stale = {name: r for name, (_, r) in differences.items() if self._largest(r) is None}
        queued = queue_extremes(stale) if stale else {}
        out = set()
        for device, group in norms.items():
            parts = queued.get(device, [])  # the references' extremes, read with the norms
            norms_and_rows = [torch.stack(list(group.values())), *(rows.reshape(-1) for _, rows in parts)]
            values = torch.cat(norms_and_rows).tolist()  # one synchronisation per device and part
            for name, (lo, hi) in read_extremes(_names(parts), values[len(group):]).items():
                r = pairs[name][1]
                self.cache[id(r)] = (weakref.ref(r), r._version, max(-lo, hi))  # NaN where r is not finite
            for name, norm in zip(group, values):
                t = alone[name] if name in alone else pairs[name][0]
                self.distances[name] = _recorded(norm, t.dtype)
                largest = 0.0 if name in alone else self._largest(pairs[name][1])
                if name in boundable and math.isfinite(norm) and largest + self.distances[name] <= half:
                    out.add(name)  # (a NaN largest compares False)
        return out, extremes

    def _largest(self, r: Tensor) -> float | None:
        """``max |r|`` as read before (NaN where ``r`` holds a non-finite value), or ``None`` when ``r`` (this
        object, this version) has not been read."""
        seen = self.cache.get(id(r))
        return seen[2] if seen is not None and seen[0]() is r and seen[1] == r._version else None


def _by_device(tensors: Mapping[str, Any]) -> dict[torch.device, dict[str, Any]]:
    """``tensors`` (tensors, or pairs of tensors on one device) grouped by their device, in order."""
    out: dict[torch.device, dict[str, Any]] = {}
    for name, t in tensors.items():
        out.setdefault((t[0] if isinstance(t, tuple) else t).device, {})[name] = t
    return out


def counterpart(t: Tensor, r: object) -> bool:
    """Whether ``r`` is the tensor that the floating tensor ``t`` updates: a floating tensor of ``t``'s
    shape (in a reply, the entry of the same name that the server sent). An update ``t - r`` is measured
    against it; a tensor without one (a control variate the client computed) is measured on its own."""
    return isinstance(r, Tensor) and r.is_floating_point() and r.shape == t.shape


def distance(t: Tensor, r: Tensor | None = None) -> float:
    """``||t - r||_2`` as the server records it (:class:`Against` measures the same): the difference in
    ``t``'s dtype, its squares summed in float64, the norm rounded to float32 for float32 tensors;
    ``r = None``: ``||t||_2``, the distance to zero."""
    diff = t.detach() if r is None else torch.sub(t.detach(), r)
    return _recorded(float(torch.linalg.vector_norm(diff, dtype=torch.float64)), t.dtype)


def _recorded(norm: float, dtype: torch.dtype) -> float:
    """A float64 ``norm`` as a distance of a ``dtype`` entry is recorded: float32 entries' rounded to float32."""
    return _float32(norm) if dtype == torch.float32 else norm


def _float32(x: float) -> float:
    """``x >= 0`` (or NaN) rounded to float32, to nearest (inf beyond float32's range)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.inf


#: tensors with at least this many values are read one by one even when fused (see :func:`value_extremes`)
FUSED_MAX = 1 << 16


def value_extremes(tensors: Mapping[str, object], fused: bool | None = None) -> dict[str, tuple[float, float]]:
    """``(min, max)`` of each real, non-empty tensor in ``tensors``, as floats (both NaN where it holds a
    NaN or an inf), read with one synchronisation per accelerator instead of two or three per tensor.

    Args:
        fused: how. ``False``: one ``aminmax`` per tensor (one pass over the data, no copy: the CPU's
            way, where a call costs microseconds), their values read once per dtype. ``True``: each device's tensors of one dtype with
            fewer than :data:`FUSED_MAX` values concatenated and reduced per tensor by
            :func:`torch.segment_reduce` (a handful of kernel launches instead of three per tensor:
            on a GPU, a message of a few hundred small tensors otherwise spends its time launching);
            larger tensors still one ``aminmax`` each (CUDA's segmented reduction gives each segment
            one thread block: fused, AlexNet-BN's 9.4M-value FC weight would be read by one of the
            GPU's 132 multiprocessors, three times per message). ``None`` (default): where :func:`fuses` says
            (on CUDA).
    """
    out: dict[str, tuple[float, float]] = {}
    with torch.no_grad():
        cpu: dict[torch.dtype, list[tuple[str, tuple[Tensor, Tensor]]]] = {}
        queued = {}
        for name, t in tensors.items():
            if not isinstance(t, Tensor) or t.is_complex() or not t.numel():
                continue
            if not (fused if fused is not None else fuses(t.device)):
                cpu.setdefault(t.dtype, []).append((name, _min_max(t)))
            else:
                queued[name] = t
        for pairs in cpu.values():  # one host read per dtype, not two per tensor (issue 46)
            out |= read_extremes([n for n, _ in pairs], torch.stack([v for _, lo_hi in pairs for v in lo_hi]).tolist())
        rows = queue_extremes(queued, fused) if queued else {}
    for parts in rows.values():
        out |= read_extremes(_names(parts), torch.cat([v.reshape(-1) for _, v in parts]).tolist())  # one synchronisation
    return out


def fuses(device: torch.device) -> bool:
    """Whether :func:`value_extremes` fuses ``device``'s small tensors by default: on CUDA (not on MPS, where
    ``segment_reduce`` is untested; on the CPU one ``aminmax`` per tensor is cheaper)."""
    return device.type == "cuda"


def queue_extremes(tensors: Mapping[str, Tensor], fused: bool | None = None) -> dict[torch.device, list[tuple[list[str], Tensor]]]:
    """The device half of :func:`value_extremes`: per device, ``(names, rows)`` with ``rows`` ``(len(names), 2)``
    float64 ``(min, max)`` on that device, nothing read yet (a caller reads them with other values in one
    synchronisation, :func:`read_extremes`). ``tensors``: real, non-empty; ``fused`` as in :func:`value_extremes`."""
    groups: dict[tuple[torch.device, torch.dtype], dict[str, Tensor]] = {}
    for name, t in tensors.items():
        groups.setdefault((t.device, t.dtype if t.is_floating_point() else torch.float64), {})[name] = t
    rows: dict[torch.device, list[tuple[list[str], Tensor]]] = {}
    with torch.no_grad():
        for (device, dtype), group in groups.items():
            small = {}
            if fused if fused is not None else fuses(device):
                small = {n: t for n, t in group.items() if t.numel() < FUSED_MAX}
            if small:
                rows.setdefault(device, []).append((list(small), _fused_extremes(list(small.values()), dtype)))
            large = {n: t for n, t in group.items() if n not in small}
            if large:
                extremes = torch.stack([torch.stack(_min_max(t)).double() for t in large.values()])
                rows.setdefault(device, []).append((list(large), extremes))
    return rows


def read_extremes(names: Iterable[str], values: list[float]) -> dict[str, tuple[float, float]]:
    """``{name: (min, max)}`` from ``values`` read on the host, ``min, max`` per name in turn, as floats; both NaN
    where one is not finite."""
    out = {}
    for name, lo, hi in zip(names, values[0::2], values[1::2], strict=True):
        lo, hi = float(lo), float(hi)
        out[name] = (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else (math.nan, math.nan)
    return out


def _names(parts: list[tuple[list[str], Tensor]]) -> list[str]:
    """The names of :func:`queue_extremes`' ``parts`` of one device, in their rows' order."""
    return [n for names, _ in parts for n in names]


def _min_max(t: Tensor) -> tuple[Tensor, Tensor]:
    return (t.min(), t.max()) if t.dtype == torch.bool else torch.aminmax(t)


def _fused_extremes(group: list[Tensor], dtype: torch.dtype) -> Tensor:
    """``(len(group), 2)`` float64 ``(min, max)`` rows of ``group``'s tensors; NaN rows for those holding a
    NaN or an inf, found by counting (not left to how a reduction kernel treats NaN)."""
    flat = torch.cat([t.reshape(-1) for t in group]).to(dtype)  # (integers widen exactly either way)
    lengths = torch.tensor([t.numel() for t in group], device=flat.device)
    lo, hi = (torch.segment_reduce(flat, how, lengths=lengths).double() for how in ("min", "max"))
    nonfinite = torch.segment_reduce((~torch.isfinite(flat)).float(), "sum", lengths=lengths) > 0
    extremes = torch.stack((lo, hi), 1)
    return extremes.masked_fill_(nonfinite.unsqueeze(1), math.nan)


def validate_part(part: object, spec: Spec, where: str, max_abs: float | None = None,
                  against: Against | None = None) -> Part:
    """Check ``part`` against ``spec``; return it unchanged, or raise one error listing all problems.

    Args:
        part: the received part (should be a ``dict[str, Tensor]``).
        spec: expected names and their :class:`TensorSpec`.
        where: who sent what, for the message (``"uplink of client 3, part 'fedavg'"``).
        max_abs: the largest ``|value|`` any tensor may hold (``None``: no bound).
        against: the part this one answers (:class:`Against`): entries within bounds by their distance
            to it are not read again, and the distances are kept there.

    Raises:
        PayloadError: not a dict, missing or unexpected names, wrong shapes or dtypes, sizes that
            disagree, non-finite values, values out of range or over ``max_abs``.
    """
    if not isinstance(part, Mapping):
        raise PayloadError(f"{where}: expected a dict of tensors, got {type(part).__name__}")
    if not all(isinstance(k, str) for k in part):
        raise PayloadError(f"{where}: tensor names must be strings, got {sorted(map(repr, part))}")
    problems = []
    missing = sorted(set(spec) - set(part))
    extra = sorted(set(part) - set(spec))
    if missing:
        problems.append(f"missing {', '.join(repr(m) for m in missing)}")
    if extra:
        problems.append(f"unexpected {', '.join(repr(e) for e in extra)}")
    sizes: dict[str, int] = {}
    names = sorted(set(spec) & set(part))
    tensors = {n: part[n] for n in names if isinstance(part[n], Tensor)}
    free = {n: t for n, t in tensors.items() if spec[n].low is None and spec[n].high is None}
    bounded, known = against.measure(tensors, max_abs, set(free)) if against is not None else (set(), {})
    unproven = {n: t for n, t in free.items() if n not in bounded and n not in known}
    if unproven:
        bounded |= norm_bounded(unproven, max_abs)
    unread = {n: t for n, t in tensors.items() if n not in bounded and n not in known}
    extremes = value_extremes(unread) | known if unread else known
    for name in names:
        problems.extend(spec[name].problems(name, part[name], max_abs, sizes, extremes.get(name), values=name not in bounded))
    if problems:
        raise PayloadError(f"{where}: " + "; ".join(problems))
    return dict(part)


class PassedParts:
    """:func:`validate_part` that does not read again the tensors that already passed the same check.

    The in-process engine sends every client of a phase the same server tensors (the global
    weights); one worker validates what it receives for each client (DESIGN.md invariant 3), and
    reading a 200k-value model's extremes again for each of a hundred small clients costs as much as
    a local step. A part passes here without a read when each of its tensors is the very object
    that passed before under the same key and entry name, unchanged since: its version counter
    (bumped by every in-place write torch sees) is the one recorded. Tensors are held weakly (an
    entry leaves when its tensor is freed).
    """

    def __init__(self) -> None:
        self._passed: dict[int, tuple[weakref.ref[Tensor], object, str, int]] = {}

    def validate(self, part: object, spec: Spec, where: str | Callable[[], str], key: object) -> None:
        """:func:`validate_part` of ``part`` against ``spec`` (no magnitude bound), skipped when every
        tensor of ``part`` passed under ``key`` (e.g. the phase and the part's name) unchanged.

        Args:
            where: as in :func:`validate_part`, or a function that says it (called only for a check).

        Raises:
            PayloadError: as :func:`validate_part`.
        """
        if isinstance(part, Mapping) and part.keys() == spec.keys() and all(self._known(t, key, n) for n, t in part.items()):
            return
        validate_part(part, spec, where if isinstance(where, str) else where())
        passed = self._passed
        for n, t in part.items():  # validate_part passed: a dict of tensors
            passed[id(t)] = (weakref.ref(t, lambda _, i=id(t): passed.pop(i, None)), key, n, t._version)

    def _known(self, t: object, key: object, name: str) -> bool:
        entry = self._passed.get(id(t))
        return entry is not None and entry[0]() is t and entry[1:] == (key, name, t._version)  # type: ignore[union-attr]


def host_values(tensors: Mapping[str, Tensor]) -> dict[str, Any]:
    """The exact values of real tensors on the host, read with one synchronisation per device (not one per
    value): a 0-d tensor's as a number, another's as a flat list (row-major); floating values as Python
    floats, integers and booleans as ints. A device's tensors of one kind are concatenated (floating types
    widen exactly to the widest, integers to int64); floating and integer tensors together travel as 64-bit
    patterns (the floats' float64 bits beside the integers), so that int64 values beyond 2**53 stay exact."""
    out: dict[str, Any] = {}
    for group in _by_device(tensors).values():
        ts = list(group.values())
        if len(ts) == 1 and ts[0].dim() == 0:  # one number: read as it is (one operation, not three)
            out.update(zip(group, (ts[0].item(),)))
            continue
        if len({t.is_floating_point() for t in ts}) == 1:
            flat = torch.stack(ts) if all(t.dim() == 0 for t in ts) else torch.cat([t.reshape(-1) for t in ts])
            values, mixed = flat.tolist(), False
        else:
            values, mixed = torch.cat([(t.to(torch.float64).view(torch.int64) if t.is_floating_point()
                                        else t.to(torch.int64)).reshape(-1) for t in ts]).tolist(), True
        at = 0
        for name, t in group.items():
            n = t.numel()
            chunk, at = values[at : at + n], at + n
            if mixed and t.is_floating_point():
                chunk = list(struct.unpack(f"<{n}d", struct.pack(f"<{n}q", *chunk)))
            out[name] = chunk[0] if t.dim() == 0 else chunk
    return out


def part_nbytes(part: Mapping[str, Tensor]) -> int:
    """Bytes of the tensors' data in ``part`` (numel x element size; names, framing and any value that
    is not a tensor excluded: a reply is counted before it is validated)."""
    return sum(t.numel() * t.element_size() for t in part.values() if isinstance(t, Tensor))


def message_nbytes(message: Mapping[str, Mapping[str, Tensor]]) -> dict[str, int]:
    """Bytes per component of a message."""
    return {name: part_nbytes(part) for name, part in message.items()}


def state_nbytes(state: object) -> int:
    """Bytes of every tensor in a nest of dicts, lists and tuples (e.g. a client's per-client state).
    Summed without :func:`tensor_leaves`' paths: it runs every round over every client's state."""
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, Mapping):
        return sum(state_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_nbytes(v) for v in state)
    return 0


def tensor_leaves(tree: object, where: str = "") -> Iterator[tuple[str, Tensor]]:
    """``(path, tensor)`` of every tensor in a nest of dicts, lists and tuples, in order; paths extend
    ``where`` with ``.key`` and ``[index]``."""
    if isinstance(tree, Tensor):
        yield where, tree
    elif isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from tensor_leaves(v, f"{where}.{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from tensor_leaves(v, f"{where}[{i}]")
