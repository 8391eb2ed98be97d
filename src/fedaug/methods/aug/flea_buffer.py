"""FLea's pure parts: the shared subset, the feature buffer, feature mixup and the distillation loss
(Xia et al., KDD 2024, "FLea", Sec. 3.2-3.4, Eq. 2 and 4, Alg. 1 lines 14-18).

Wire format of the buffer (rows are samples, flattened so that the server needs no shapes):
``features (N, D) float32`` (``D`` = the feature map's size at the split stage) and
``labels (N,) int64`` class ids; the server also keeps ``owner (N,) int64`` (who contributed each
row), which it never sends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedaug.core.rng import generator
from fedaug.layers.mixing import mix, sample_beta
from fedaug.methods.component import State, Uplink


def empty_buffer(device: torch.device) -> State:
    """The server's buffer before anyone has shared (round 1 trains without it, Alg. 1 line 3), on ``device``."""
    return {"features": torch.zeros(0, 0, device=device), "labels": torch.zeros(0, dtype=torch.int64, device=device),
            "owner": torch.zeros(0, dtype=torch.int64, device=device)}


def share_indices(num_samples: int, fraction: float, seed: int, client_id: int,
                  device: torch.device = torch.device("cpu")) -> Tensor:
    """The client's shared subset: ``int(fraction * n)`` distinct samples (Sec. 3.2), drawn once per
    (seed, client) and reused every round it is queried; only its features change. Drawn on
    ``device`` (the data's), from a stream there (:func:`~fedaug.core.rng.generator`).

    Returns:
        ``(k,)`` int64 indices into the client's training split (``k = 0`` for small clients).
    """
    k = int(fraction * num_samples)
    g = generator(seed, "flea", "share", client_id, device=device)
    return torch.randperm(num_samples, generator=g, device=device)[:k]


def merge_buffer(uplinks: Sequence[Uplink], max_rows: int) -> State:
    """The new global buffer F(t+1) from the round's contributions (Alg. 1 line 18): it REPLACES
    the old one. Rows are concatenated in client-id order.

    When the contributions exceed ``max_rows``, every contributor keeps the first
    ``max_rows // m`` of its rows (``m`` contributors; its rows are already a random subset) and the
    ``max_rows % m`` left-over slots go to one more row each of the lowest client ids that have
    rows to spare; the rule is deterministic and spreads the buffer over clients.

    Args:
        uplinks: parts ``{"features": (n_k, D), "labels": (n_k,)}``, sorted by client id.
        max_rows: the most rows the buffer may hold (``flea.max_buffer``).

    Returns:
        ``{"features": (N, D), "labels": (N,), "owner": (N,)}`` with ``N <= max_rows``.
    """
    good = [u for u in uplinks if u.part["features"].shape[0] > 0]  # rows and labels agree (uplink spec)
    if not good:
        return empty_buffer(uplinks[0].part["features"].device if uplinks else torch.device("cpu"))
    sizes = [u.part["features"].shape[0] for u in good]
    keep = sizes
    if sum(sizes) > max_rows:
        keep = [min(n, max_rows // len(good)) for n in sizes]
        spare = max_rows - sum(keep)
        for i, n in enumerate(sizes):
            if spare and n > keep[i]:
                keep[i] += 1
                spare -= 1
    return {"features": torch.cat([u.part["features"][:k] for u, k in zip(good, keep)]),
            "labels": torch.cat([u.part["labels"][:k] for u, k in zip(good, keep)]),
            "owner": torch.cat([torch.full((k,), u.client_id, dtype=torch.int64, device=u.part["labels"].device)
                                for u, k in zip(good, keep)])}


def mix_features(f: Tensor, y: Tensor, f_buf: Tensor, y_buf: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 2: ``f~_i = beta_i f_i + (1 - beta_i) f^F_i`` and ``y~_i = beta_i y_i + (1 - beta_i) y^F_i``.

    Args:
        f: ``(B, *feature_shape)`` local features (in the autograd graph).
        y: ``(B, K)`` local soft (one-hot) labels.
        f_buf: ``(B, *feature_shape)`` the buffer features paired with them.
        y_buf: ``(B, K)`` their one-hot labels.
        beta: ``(B,)`` weights in [0, 1], one per pair.

    Returns:
        Mixed features like ``f`` and mixed labels ``(B, K)`` (rows sum to 1 if the inputs' do).
    """
    return mix(f, f_buf.to(f), beta.to(f)), mix(y, y_buf.to(y), beta.to(y))


def draw_pairs(batch_size: int, buffer_size: int, a: float, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """One buffer row per local sample, uniformly with replacement, and ``beta_i ~ Beta(a, a)``
    (Alg. 1 line 7): ``(B,)`` int64 indices and ``(B,)`` float32 weights, both from ``g``."""
    j = torch.randint(buffer_size, (batch_size,), generator=g, device=g.device)
    return j, sample_beta(a, batch_size, g)


def distillation_loss(local_logits: Tensor, global_logits: Tensor) -> Tensor:
    """Eq. 4: ``1/|B| sum_i sum_c -p^l_i[c] log(p^g_i[c] / p^l_i[c])``, i.e. the mean over the batch
    of KL(p^l || p^g) (local model first, as the paper writes it), temperature 1.

    Args:
        local_logits: ``(B, K)``, in the autograd graph.
        global_logits: ``(B, K)`` of the round's global model (detached).

    Returns:
        A 0-d tensor >= 0.
    """
    log_pl = torch.log_softmax(local_logits, dim=1)
    log_pg = torch.log_softmax(global_logits.detach(), dim=1)
    return (log_pl.exp() * (log_pl - log_pg)).sum(1).mean()
