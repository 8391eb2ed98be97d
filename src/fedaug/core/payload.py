"""Message parts: named tensors exchanged between a component and its counterpart.

A *part* is a flat ``dict[str, Tensor]`` owned by one component; a *message* maps component
names to parts. Parts are validated on receipt against a *spec* (expected names, shapes, dtypes,
value ranges) and must hold finite values no larger than a magnitude bound (DESIGN.md, invariant 3;
docs/engine.md, "The trust boundary"). Their sizes are what communication accounting counts
(invariant 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from fedaug.core.errors import PayloadError

Part = dict[str, Tensor]
Message = dict[str, Part]


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
    """

    shape: tuple[int | str | None, ...]
    dtype: torch.dtype
    finite: bool = True
    low: float | None = None
    high: float | None = None

    @classmethod
    def like(cls, t: Tensor, finite: bool = True) -> "TensorSpec":
        """The spec of a tensor with ``t``'s exact shape and dtype."""
        return cls(tuple(t.shape), t.dtype, finite)

    def problems(self, name: str, t: object, max_abs: float | None = None,
                 sizes: dict[str, int] | None = None) -> list[str]:
        """Every way ``t`` fails this spec, one sentence each (empty when it passes).

        Args:
            max_abs: the largest ``|value|`` allowed (``None``: no bound).
            sizes: named sizes already seen in this part (updated with the ones ``t`` fixes).
        """
        if not isinstance(t, Tensor):
            return [f"'{name}' must be a tensor, got {type(t).__name__}"]
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
        if t.is_complex() or t.numel() == 0:
            return out
        if t.is_floating_point() and (self.finite or max_abs is not None) and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            return [*out, f"'{name}' holds {bad} non-finite value(s) (NaN or inf)"]
        lo, hi = t.min().item(), t.max().item()
        if max_abs is not None and max(abs(lo), abs(hi)) > max_abs:
            out.append(f"'{name}' holds |value| up to {max(abs(lo), abs(hi)):.3g}, over the bound {max_abs:g} "
                       "(trust.max_abs)")
        if self.low is not None and lo < self.low:
            out.append(f"'{name}' holds {lo:g}, below its smallest allowed value {self.low:g}")
        if self.high is not None and hi > self.high:
            out.append(f"'{name}' holds {hi:g}, above its largest allowed value {self.high:g}")
        return out


Spec = Mapping[str, TensorSpec]


def validate_part(part: object, spec: Spec, where: str, max_abs: float | None = None) -> Part:
    """Check ``part`` against ``spec``; return it unchanged, or raise one error listing all problems.

    Args:
        part: the received part (should be a ``dict[str, Tensor]``).
        spec: expected names and their :class:`TensorSpec`.
        where: who sent what, for the message (``"uplink of client 3, part 'fedavg'"``).
        max_abs: the largest ``|value|`` any tensor may hold (``None``: no bound).

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
    for name in sorted(set(spec) & set(part)):
        problems.extend(spec[name].problems(name, part[name], max_abs, sizes))
    if problems:
        raise PayloadError(f"{where}: " + "; ".join(problems))
    return dict(part)


def part_nbytes(part: Mapping[str, Tensor]) -> int:
    """Bytes of the tensors' data in ``part`` (numel x element size; names, framing and any value that
    is not a tensor excluded: a reply is counted before it is validated)."""
    return sum(t.numel() * t.element_size() for t in part.values() if isinstance(t, Tensor))


def message_nbytes(message: Mapping[str, Mapping[str, Tensor]]) -> dict[str, int]:
    """Bytes per component of a message."""
    return {name: part_nbytes(part) for name, part in message.items()}


def state_nbytes(state: object) -> int:
    """Bytes of every tensor in a nest of dicts, lists and tuples (e.g. a client's per-client state)."""
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, Mapping):
        return sum(state_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_nbytes(v) for v in state)
    return 0
