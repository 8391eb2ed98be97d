"""Every base algorithm composes with an augmentation in one run: a test augmentation that uses
messages and random draws, and the paper augmentations FedFA and FedRDN when registered; every
other registered augmentation runs with one base (rotating through them). The same seed gives
the same numbers."""

from __future__ import annotations

import math

import pytest
import torch

from fedaug.config.schema import validate
from fedaug.core.payload import TensorSpec
from fedaug.data.registry import load_dataset
from fedaug.engine.run import Simulation
from fedaug.methods import METHODS
from fedaug.models.walk import trainable
from fedaug.methods.component import Batch, Component
from fedaug.methods.recipe import Recipe, build_component


class Jitter(Component):
    """Test augmentation: input noise from ``ctx.rng`` in training; uploads its batch-mean input
    per channel, which the server averages and sends back."""

    name = "jitter"
    spec = {"mean": TensorSpec((1,), torch.float32)}

    def init_server(self, model, num_clients): return {"mean": torch.zeros(1)}
    def downlink(self, server, client_id, phase="train"): return {"mean": server["mean"]}
    def downlink_spec(self, model, phase="train"): return self.spec
    def uplink_spec(self, server, phase="train"): return self.spec
    def receive(self, ctx, part, state): self.sum, self.n = torch.zeros(1), 0

    def transform_batch(self, ctx, batch):
        if not ctx.training:
            return batch
        self.sum += batch.x.mean(dim=(0, 2, 3))
        self.n += 1
        return Batch(batch.x + 0.01 * torch.randn(batch.x.shape, generator=ctx.rng("noise")), batch.y)

    def reply(self, ctx): return {"mean": self.sum / self.n}, {}
    def aggregate(self, server, uplinks, phase="train"): return {"mean": torch.stack([u.part["mean"] for u in uplinks]).mean(0)}


BASES = [n for n in METHODS.names() if METHODS.get(n).role != "augmentation"]  # server rules and legacy objective bases
REGISTERED_AUGS = [n for n in METHODS.names() if METHODS.get(n).role == "augmentation"]
MAIN_AUGS = ["jitter"] + [a for a in ("fedfa", "fedrdn") if a in REGISTERED_AUGS]
OTHER_PAIRS = [(BASES[i % len(BASES)], a) for i, a in enumerate(a for a in REGISTERED_AUGS if a not in MAIN_AUGS)]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny runs are fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(num_clients: int = 2):
    return validate({"seed": 3, "data": {"name": "synthetic", "options": {"num_clients": num_clients,
                                                                            "samples_per_client": 24,
                                                                            "num_classes": 3, "size": 8}},
                     "model": {"name": "small_cnn", "options": {"width": 4}},
                     "train": {"rounds": 2, "local_steps": 2, "batch_size": 8, "lr": 0.05, "participation": 1.0}})


def run(base: str, aug: str) -> tuple[dict, Simulation]:
    cfg = config(3 if base == "krum" else 2)  # Krum needs M > 2f + 2 updates (f = 0 by default)
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    try:
        other = Jitter() if aug == "jitter" else build_component(aug, {})
        first = build_component(base, {})
        recipe = (Recipe(build_component("fedavg", {}), [first, other]) if first.role == "objective"
                  else Recipe(first, [other]))
    except Exception as exc:  # an augmentation that needs options, or one replacing the same hook
        pytest.skip(f"{aug} does not build with default options on {base}: {exc}")
    sim = Simulation(cfg, data, recipe)
    for r in (1, 2):
        rec = sim.run_round(r)
    return {"rec": rec, "eval": sim.evaluate()}, sim


@pytest.mark.parametrize("base, aug", [(b, a) for b in BASES for a in MAIN_AUGS] + OTHER_PAIRS)
def test_base_composes_with_augmentation(base, aug):
    out, sim = run(base, aug)
    assert not out["rec"]["rejected"]
    assert out["rec"]["comm"]["up"][aug] >= 0 and base in out["rec"]["comm"]["up"]
    assert math.isfinite(out["rec"]["train"]["loss"]) and math.isfinite(out["eval"]["mean"]["test_acc"])
    assert all(torch.isfinite(p).all() for p in trainable(sim.model).values())


@pytest.mark.parametrize("base", BASES)
def test_same_seed_same_numbers(base):
    a, _ = run(base, "jitter")
    b, _ = run(base, "jitter")
    assert without_times(a) == without_times(b)


def without_times(out: dict) -> tuple[dict, dict]:
    return {k: v for k, v in out["rec"].items() if k != "time"}, out["eval"]
