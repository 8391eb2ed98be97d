"""A synthetic feature-shift dataset for tests, benchmarks and quick trials (labelled synthetic)."""

from __future__ import annotations

import torch

from fedaug.core.errors import ConfigError
from fedaug.core.rng import generator
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.registry import DATASETS


def _check(name: str, value: int | float, lo: int | float) -> None:
    if value < lo:
        raise ConfigError(f"synthetic.{name} must be >= {lo}, got {value}")


@DATASETS.register("synthetic", "SYNTHETIC class prototypes + per-client contrast/offset shift (tests, benchmarks)")
def synthetic(*, seed: int, num_clients: int = 4, samples_per_client: int = 200, num_classes: int = 10,
              channels: int = 1, size: int = 28, shift: float = 0.5, noise: float = 0.5) -> FederatedData:
    """Each class is a fixed random low-frequency pattern; client k rescales and offsets it
    (feature shift of strength ``shift``) and adds Gaussian noise.

    Every client gets ``samples_per_client`` train samples and a quarter of that each for val and
    test, with labels uniform over classes. Inputs ``(channels, size, size)`` float32.

    Args:
        num_clients: number of clients, >= 1.
        samples_per_client: train samples per client, >= 4.
        num_classes: number of classes, >= 2.
        channels: input channels, >= 1.
        size: image side, >= 4.
        shift: strength of the per-client contrast and offset shift, >= 0.
        noise: standard deviation of the added Gaussian noise, >= 0.
    """
    for name, value, lo in (("num_clients", num_clients, 1), ("samples_per_client", samples_per_client, 4),
                            ("num_classes", num_classes, 2), ("channels", channels, 1), ("size", size, 4),
                            ("shift", shift, 0.0), ("noise", noise, 0.0)):
        _check(name, value, lo)
    g = generator(seed, "synthetic", "prototypes")
    coarse = torch.randn(num_classes, channels, 4, 4, generator=g)
    protos = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    clients = []
    for k in range(num_clients):
        gk = generator(seed, "synthetic", "client", k)
        scale = 1.0 + shift * (2 * torch.rand(channels, 1, 1, generator=gk) - 1)
        offset = shift * torch.randn(channels, 1, 1, generator=gk)

        def make(n: int) -> Split:
            y = torch.randint(0, num_classes, (n,), generator=gk)
            x = protos[y] * scale + offset + noise * torch.randn(n, channels, size, size, generator=gk)
            return Split(x.float(), y)

        n_eval = max(samples_per_client // 4, 1)
        clients.append(ClientData(f"client{k}", f"client{k}", make(samples_per_client), make(n_eval), make(n_eval)))
    info = {"synthetic": True, "source": "fedaug.data.synthetic (generated, not real data)"}
    return FederatedData("synthetic", "classification", num_classes, (channels, size, size), clients, info)
