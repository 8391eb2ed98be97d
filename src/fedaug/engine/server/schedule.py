"""Client sampling across rounds (pure functions of the round; the learning rate of a round is
:func:`fedaug.config.schema.learning_rate`)."""

from __future__ import annotations


import torch

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
