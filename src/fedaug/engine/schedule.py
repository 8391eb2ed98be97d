"""Client sampling and the learning-rate schedule across rounds (pure functions of the round)."""

from __future__ import annotations

import math

import torch

from fedaug.config.schema import TrainConfig
from fedaug.core.errors import ConfigError
from fedaug.core.rng import generator


def clients_per_round(num_clients: int, participation: float) -> int:
    """``round(participation * num_clients)``; zero is an error naming the smallest valid rate."""
    k = int(round(participation * num_clients))
    if k < 1:
        raise ConfigError(
            f"train.participation={participation} samples 0 of {num_clients} clients per round; "
            f"use train.participation >= {0.5 / num_clients:.4g} (1 client) or more"
        )
    return min(k, num_clients)


def sample_clients(seed: int, round: int, num_clients: int, participation: float) -> list[int]:
    """The sorted client ids sampled in ``round`` (uniform without replacement; seeded by
    (seed, "sample", round), so it depends on nothing else)."""
    k = clients_per_round(num_clients, participation)
    if k == num_clients:
        return list(range(num_clients))
    perm = torch.randperm(num_clients, generator=generator(seed, "sample", round))
    return sorted(perm[:k].tolist())


def learning_rate(cfg: TrainConfig, round: int) -> float:
    """The local learning rate of 1-based ``round``.

    constant: ``lr``; exponential: ``max(lr * decay^(r-1), lr_min)`` (FLea: 2 % per round);
    cosine: ``lr_min + (lr - lr_min) (1 + cos(pi (r-1) / R)) / 2``; step: ``lr * decay^floor((r-1)/S)``.
    """
    r = round - 1
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "exponential":
        return max(cfg.lr * cfg.lr_decay**r, cfg.lr_min)
    if cfg.lr_schedule == "cosine":
        return cfg.lr_min + (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * r / cfg.rounds)) / 2
    if cfg.lr_schedule == "step":
        return cfg.lr * cfg.lr_decay ** (r // cfg.lr_step_rounds)
    raise ConfigError(f"unknown train.lr_schedule '{cfg.lr_schedule}'; choose constant, exponential, cosine, step")
