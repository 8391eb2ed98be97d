"""benchmarks/bench_ffa.py's captured column (issue 63): each configuration's training step captured and timed as
replays, on CUDA in a CUDA graph, here in its CPU emulation (fedaug.engine.client.capture.TracedCapture), which
replays what a graph would: so the step the column times is checked here to be the eager step itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fedaug.core.rng import scoped_global_seed
from fedaug.models import build_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/bench_ffa.py, imported as its scripts run (their folder on the path)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_ffa

    return bench_ffa


def training_state(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a step changes: the parameters, the buffers and the momentum buffers."""
    momentum = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    return [*model.parameters(), *model.buffers(), *momentum]


@pytest.mark.parametrize("key", ["none", "instancenorm"])
def test_a_replayed_capture_is_the_eager_training_step_bit_for_bit(bench, key):
    device = torch.device("cpu")
    with scoped_global_seed(0, "bench", "test"):
        model = build_model("small_cnn", in_channels=1, num_classes=10).train()
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 3, 1, 3])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    channels = {"block1": 32, "block2": 32}
    layers = {} if key == "none" else {n: bench.instance_norm(c, 2) for n, c in channels.items()}
    with bench.attach(model, layers):
        bench.sgd_step(model, opt, x, y)()  # the optimiser's state, as after the benchmark's eager steps
        start = [t.detach().clone() for t in training_state(model, opt)]
        bench.sgd_step(model, opt, x, y)()
        eager = [t.detach().clone() for t in training_state(model, opt)]
    replay = bench.captured(model, opt, x, y, layers, device)
    with torch.no_grad():
        for t, value in zip(training_state(model, opt), start, strict=True):
            t.copy_(value)
    replay()
    replayed = training_state(model, opt)
    assert not all(torch.equal(a, b) for a, b in zip(start, eager))  # the step trains
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager, strict=True))


def test_the_benchmark_times_ffa_and_instancenorm_captured_beside_eager(bench, monkeypatch):
    """time_model's medians (a small_cnn on 12 x 12 inputs, batch 4): every eager configuration and the captured
    ones, each a positive time per step."""
    monkeypatch.setitem(bench.MODELS, "small_cnn", (1, 10, (1, 12, 12), (), 4))
    med = bench.time_model("small_cnn", repeats=1, steps=1, device=torch.device("cpu"))
    captured = {f"{k} captured" for k in bench.CAPTURED}
    assert set(med) == set(bench.makers(torch.device("cpu"))) | captured
    assert captured == {"none captured", "ffa captured", "instancenorm captured"}
    assert all(v > 0 for v in med.values()), med
