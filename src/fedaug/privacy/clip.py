"""L2 clipping of a set of tensors taken as one vector: the bounded contribution that robust
aggregation (update-norm clipping) and every Gaussian mechanism (its sensitivity) rest on.

The norm is computed in float64 over all floating tensors of the set together (Abadi et al. 2016,
Eq. 1 per sample; McMahan et al. 2018, DP-FedAvg, ``clip(Delta, S)`` per client update):
``x * min(1, C / ||x||_2)``. Integer tensors (counters, e.g. BatchNorm's ``num_batches_tracked``)
are left as they are and do not count towards the norm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedaug.core.payload import counterpart


def l2_norm(tensors: Mapping[str, Tensor]) -> float:
    """``sqrt(sum_k ||t_k||^2)`` over the floating tensors of ``tensors``, in float64.

    >>> l2_norm({"a": torch.tensor([3.0]), "b": torch.tensor([4.0]), "n": torch.tensor(7)})
    5.0
    """
    total = sum((float(t.detach().double().pow(2).sum()) for t in tensors.values() if t.is_floating_point()), 0.0)
    return total**0.5


def clip_factor(norm: float, max_norm: float) -> float:
    """``min(1, max_norm / norm)``: the factor that brings a vector of L2 norm ``norm`` within
    ``max_norm`` (1 for a zero vector).

    Raises:
        ValueError: ``max_norm`` is not a finite number > 0.
    """
    check_bound(max_norm)
    return 1.0 if norm <= max_norm else max_norm / norm


def check_bound(max_norm: float) -> None:
    """Raise ``ValueError`` unless ``max_norm`` is a finite number > 0 (a clipping bound C)."""
    if not (max_norm > 0 and max_norm < float("inf")):
        raise ValueError(f"max_norm must be a finite number > 0, got {max_norm!r}")


def clip_by_l2(tensors: Mapping[str, Tensor], max_norm: float) -> tuple[dict[str, Tensor], float]:
    """Scale the floating tensors of ``tensors`` together so that their joint L2 norm is at most
    ``max_norm``; integer tensors are returned unchanged. The inputs are not modified.

    Args:
        tensors: ``{name: tensor}``, any shapes.
        max_norm: the bound C > 0.

    Returns:
        ``(clipped, norm)``: the clipped tensors (same names, shapes and dtypes) and the norm
        before clipping, for the records.

    >>> out, norm = clip_by_l2({"w": torch.tensor([6.0, 8.0])}, 5.0)
    >>> out["w"].tolist(), norm
    ([3.0, 4.0], 10.0)
    """
    norm = l2_norm(tensors)
    factor = clip_factor(norm, max_norm)
    if factor == 1.0:
        return dict(tensors), norm
    return {k: (t * factor).to(t.dtype) if t.is_floating_point() else t for k, t in tensors.items()}, norm


def update_entries(weights: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> list[str]:
    """The keys of ``weights`` that make up an update ``weights - reference``: floating tensors with
    a floating counterpart of the same shape in ``reference`` (a client's model weights against the
    global ones it received; never a tensor it computed itself, such as a control variate;
    :func:`~fedaug.core.payload.counterpart`)."""
    return [k for k, t in weights.items() if t.is_floating_point() and counterpart(t, reference.get(k))]


def clip_update(weights: Mapping[str, Tensor], reference: Mapping[str, Tensor],
                max_norm: float, keys: Sequence[str] | None = None) -> tuple[dict[str, Tensor], float]:
    """``reference + clip(weights - reference, max_norm)``: a client's weights with its update
    Delta = w_k - w bounded to L2 norm ``max_norm`` over the :func:`update_entries` together
    (DP-FedAvg's ``clip``, McMahan et al. 2018, arXiv:1710.06963, Alg. 1; :func:`clip_by_l2`).

    Args:
        weights: the client's ``{key: tensor}`` (any shapes); not modified.
        reference: the global weights it trained from.
        max_norm: the bound C > 0.
        keys: the floating entries to bound together (default: :func:`update_entries`); an entry without
            a counterpart in ``reference`` is its own update (its reference is zero).

    Returns:
        The bounded weights (each entry in its own dtype; the other entries, e.g. BatchNorm's
        integer ``num_batches_tracked``, as received) and ``||Delta||_2`` before clipping.
    """
    keys = update_entries(weights, reference) if keys is None else keys
    start = {k: reference[k].double() if counterpart(weights[k], reference.get(k)) else torch.zeros((), dtype=torch.float64)
             for k in keys}
    delta, norm = clip_by_l2({k: weights[k].double() - start[k] for k in keys}, max_norm)
    bounded = {k: (start[k] + delta[k]).to(weights[k].dtype) for k in keys}
    return {k: bounded.get(k, t) for k, t in weights.items()}, norm


def clip_rows(x: Tensor, max_norm: float) -> Tensor:
    """Per-sample clipping: each row ``x[i]`` (all its trailing dims taken as one vector) scaled by
    ``min(1, C / ||x[i]||_2)`` (Abadi et al. 2016, Eq. 1; :func:`clip_factor` row by row, vectorised).

    Args:
        x: ``(n, *sample)`` floating; not modified in place.
        max_norm: the bound C > 0.

    Returns:
        Same shape and dtype as ``x``, every row of L2 norm <= C (norms computed in float64).

    Raises:
        ValueError: ``max_norm`` is not a finite number > 0.

    >>> clip_rows(torch.tensor([[6.0, 8.0], [0.3, 0.4]]), 5.0).tolist()
    [[3.0, 4.0], [0.30000001192092896, 0.4000000059604645]]
    """
    check_bound(max_norm)
    norms = x.detach().flatten(1).double().norm(dim=1)
    factor = (max_norm / norms.clamp_min(max_norm)).to(x.dtype)
    return x * factor.reshape(-1, *([1] * (x.dim() - 1)))
