"""Attacks on shared representations (FLea, KDD 2024, Sec. 4.4 and Appendix D).

* Reconstruction (Dosovitskiy and Brox, CVPR 2016): an attacker with auxiliary data from the same
  distribution trains a small convolutional decoder from shared features back to inputs; its test
  MSE measures leakage (lower = more leakage).
* Context identification: a marker (a coloured square, a flat segment for signals) is planted in
  part of the data; the attacker trains a binary classifier on the shared representations of
  marked and clean data and is scored on held-out ones, as a function of its training-set size
  (paper Fig. 9d). ``group_size`` > 1 attacks shared means of groups that share a context
  (FedMix's batch means of one client's data).

Everything is seeded by ``seed``; the attacker's models are initialised under a scoped global seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaug.core.eager_optim import LocalAdam
from fedaug.core.errors import ConfigError
from fedaug.core.rng import generator, scoped_global_seed


def plant_marker(x: Tensor, *, size: int = 4, value: Sequence[float] | None = None) -> Tensor:
    """Inputs with a ``size``-wide square (every spatial dim) in the top-left corner set to ``value``.

    Args:
        x: ``(N, C, *spatial)``, not modified in place.
        size: side of the square in positions.
        value: one value per channel; default red ``(1, 0, 0)`` for 3 channels, else the maximum of ``x``.

    Returns:
        A copy of ``x`` with the marker.
    """
    out = x.clone()
    if value is None:
        value = (1.0, 0.0, 0.0) if x.shape[1] == 3 else (float(x.max()),) * x.shape[1]
    if len(value) != x.shape[1]:
        raise ConfigError(f"marker value has {len(value)} entries, the inputs have {x.shape[1]} channels")
    region = (slice(None), slice(None), *(slice(0, size) for _ in x.shape[2:]))
    out[region] = torch.tensor(value, dtype=x.dtype).reshape(1, -1, *([1] * (x.dim() - 2)))
    return out


class FeatureDecoder(nn.Module):
    """Four conv layers from features ``(B, C_l, *s_l)`` to inputs ``(B, C, *s)`` (1 or 2 spatial
    dims), resizing to the input size after the second (the paper's four-conv2d decoder).

    >>> FeatureDecoder(16, 1, (28, 28))(torch.zeros(2, 16, 14, 14)).shape
    torch.Size([2, 1, 28, 28])
    """

    def __init__(self, feature_channels: int, out_channels: int, out_size: Sequence[int], width: int = 64) -> None:
        super().__init__()
        if len(out_size) not in (1, 2):
            raise ConfigError(f"FeatureDecoder supports 1 or 2 spatial dims, got output size {tuple(out_size)}")
        conv = nn.Conv2d if len(out_size) == 2 else nn.Conv1d
        self.out_size = tuple(out_size)
        self.head = nn.Sequential(conv(feature_channels, width, 3, padding=1), nn.ReLU(),
                                  conv(width, width, 3, padding=1), nn.ReLU())
        self.tail = nn.Sequential(conv(width, width, 3, padding=1), nn.ReLU(), conv(width, out_channels, 3, padding=1))

    def forward(self, f: Tensor) -> Tensor:
        mode = "bilinear" if len(self.out_size) == 2 else "linear"
        return self.tail(F.interpolate(self.head(f), size=self.out_size, mode=mode, align_corners=False))


@dataclass
class ReconstructionResult:
    """Test MSE, the per-epoch training MSE, and the test reconstructions ``(N, C, *spatial)``."""

    mse: float
    train_mse: list[float]
    reconstructions: Tensor


def reconstruction_attack(f_aux: Tensor, x_aux: Tensor, f_test: Tensor, x_test: Tensor, *, epochs: int = 20,
                          lr: float = 1e-3, batch_size: int = 64, seed: int = 0) -> ReconstructionResult:
    """Train :class:`FeatureDecoder` on the attacker's ``(f_aux, x_aux)`` pairs (Adam, MSE) and
    reconstruct ``x_test`` from ``f_test``.

    Args:
        f_aux, f_test: features ``(N, C_l, *s_l)`` computed with the attacked model (detached).
        x_aux, x_test: the matching inputs ``(N, C, *s)``.
        epochs, lr, batch_size: decoder training (paper: 20 epochs, lr 1e-3).
        seed: seeds the initialisation and the shuffling.

    Raises:
        ConfigError: ``epochs`` or ``batch_size`` below 1, no attacker or test samples, or
            features and inputs with different numbers of spatial dims.
    """
    counts = {"epochs": epochs, "batch_size": batch_size, "attacker samples": f_aux.shape[0],
              "test samples": f_test.shape[0]}
    low = [f"{k} = {v}" for k, v in counts.items() if v < 1]
    if low:
        raise ConfigError(f"reconstruction attack needs at least 1 of each of {', '.join(counts)}, got {', '.join(low)}")
    if f_aux.dim() != x_aux.dim():
        raise ConfigError(f"features {tuple(f_aux.shape[1:])} and inputs {tuple(x_aux.shape[1:])} must have the "
                          "same number of spatial dims for the conv decoder; split at a convolutional stage")
    with scoped_global_seed(seed, "reconstruction"):
        dec = FeatureDecoder(f_aux.shape[1], x_aux.shape[1], x_aux.shape[2:])
    opt = LocalAdam(dec.parameters(), lr=lr)
    g = generator(seed, "reconstruction", "shuffle")
    history = []
    for _ in range(epochs):
        perm, total = torch.randperm(f_aux.shape[0], generator=g), 0.0
        for i in range(0, len(perm), batch_size):
            j = perm[i : i + batch_size]
            loss = F.mse_loss(dec(f_aux[j]), x_aux[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(j)
        history.append(total / len(perm))
    with torch.no_grad():
        rec = torch.cat([dec(f_test[i : i + 256]) for i in range(0, f_test.shape[0], 256)])
    return ReconstructionResult(float(F.mse_loss(rec, x_test)), history, rec)


def _probe_accuracy(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, steps: int, seed: int) -> float:
    """Accuracy of a logistic-regression probe (standardised inputs, Adam, full batch)."""
    mu, sd = train_x.mean(0), train_x.std(0, unbiased=False) + 1e-6
    a, b = (train_x - mu) / sd, (test_x - mu) / sd
    with scoped_global_seed(seed, "context-probe"):
        probe = nn.Linear(a.shape[1], 1)
    opt = LocalAdam(probe.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(probe(a).squeeze(1), train_y.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(((probe(b).squeeze(1) > 0).long() == test_y).float().mean())


def context_attack(represent: Callable[[Tensor], Tensor], x: Tensor, *, train_sizes: Sequence[int],
                   test_size: int, group_size: int = 1, marker_size: int = 4, steps: int = 300,
                   seed: int = 0) -> list[dict[str, float]]:
    """Accuracy of identifying a planted context from shared representations, per training-set size.

    The inputs are cut into groups of ``group_size`` (a group shares one context: all marked or all
    clean, half of the groups each); ``represent`` maps groups ``(G, group_size, *in_shape)`` to
    shared representations ``(G, ...)`` (FLea: the features of each sample, ``group_size = 1``;
    FedMix: the group's mean input). The last ``test_size`` groups are the test set; the
    attacker trains on the first ``n`` groups for each ``n`` in ``train_sizes``.

    Args:
        represent: the sharing rule (no gradients needed).
        x: ``(N, C, *spatial)`` clean inputs, N >= group_size * (max(train_sizes) + test_size).
        train_sizes: attacker training-set sizes, in groups.
        test_size: held-out groups.
        group_size: samples per shared representation.
        marker_size: side of the planted square.
        steps: probe training steps.
        seed: seeds the grouping, which groups are marked, and the probe.

    Returns:
        ``[{"train_size": n, "accuracy": acc}, ...]`` in the order of ``train_sizes``.

    Raises:
        ConfigError: no train size, a size below 1, or fewer inputs than the sizes need.
    """
    if not train_sizes or min(train_sizes) < 1 or test_size < 1 or group_size < 1:
        raise ConfigError(f"context attack needs train_sizes >= 1 (at least one), test_size >= 1 and group_size >= 1, "
                          f"got {list(train_sizes)}, {test_size} and {group_size}")
    need = group_size * (max(train_sizes) + test_size)
    if x.shape[0] < need:
        raise ConfigError(f"context attack needs {need} inputs (group_size={group_size} x (max train size "
                          f"{max(train_sizes)} + test_size {test_size})), got {x.shape[0]}; lower the sizes")
    g = generator(seed, "context")
    groups = x[torch.randperm(x.shape[0], generator=g)[:need]].reshape(-1, group_size, *x.shape[1:])
    marked = torch.randperm(groups.shape[0], generator=g) < groups.shape[0] // 2
    flat = groups.flatten(0, 1)
    planted = torch.where(marked.repeat_interleave(group_size).reshape(-1, *([1] * (x.dim() - 1))),
                          plant_marker(flat, size=marker_size), flat).reshape(groups.shape)
    with torch.no_grad():
        reps = torch.cat([represent(planted[i : i + 64]).flatten(1) for i in range(0, planted.shape[0], 64)])
    y = marked.long()
    test = slice(reps.shape[0] - test_size, None)
    return [{"train_size": n, "accuracy": _probe_accuracy(reps[:n], y[:n], reps[test], y[test], steps, seed)}
            for n in train_sizes]
