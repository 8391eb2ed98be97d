"""The lean floor of the engine benchmarks (issue 46) does the bare loop's work: the same clients, batches
and SGD steps from the same global weights, FedAvg's weighted average kept as a float32 sum in place
(benchmarks/lean.py) instead of float64 temporaries, so each round's new global weights agree to float32
rounding, BatchNorm's counters exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/bench_throughput.py, imported as its scripts run (their folder on the path)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_throughput

    return bench_throughput


@pytest.mark.parametrize("model, channels", [("mlp", 1), ("small_cnn", 3), ("alexnet_bn", 3)])
def test_the_lean_loop_computes_the_bare_loops_rounds(bench, model, channels):
    size = 64 if model == "alexnet_bn" else 28
    job = bench.Job("T", model, channels, num_clients=6, samples=12, per_round=3, steps=2, batch=6, size=size)
    bare, lean = bench.BareLoop(job, 1), bench.LeanLoop(job, 1)
    assert all(torch.equal(a, b) for a, b in zip(bare.global_sd.values(), lean.average.global_entries))
    for r in (1, 2, 3):
        for dst, src in zip(lean.average.global_entries, bare.global_sd.values()):  # the same start each round
            dst.copy_(src)  # (a rounding's difference grows as training goes on)
        bare.run_round(r)
        lean.run_round(r)
        for (name, want), got in zip(bare.global_sd.items(), lean.average.global_entries):
            assert got.dtype == want.dtype, name
            if want.is_floating_point():
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"round {r}: {name}")
            else:  # BatchNorm's num_batches_tracked: the largest, as FedAvg keeps it
                assert torch.equal(got, want), name
    counts = [t for t in lean.average.global_entries if not t.is_floating_point()]
    assert (model != "mlp") == bool(counts) and all(int(c) == 3 * job.steps for c in counts)


def test_the_holding_loop_computes_the_lean_loops_rounds_and_holds_each_clients_weights(bench):
    """``--held``'s other side does the lean loop's work bit for bit, and keeps what each client trained (the
    weights the sum added) until its round ends."""
    job = bench.Job("T", "mlp", 1, num_clients=6, samples=12, per_round=3, steps=2, batch=6)
    lean, holding = bench.LeanLoop(job, 1), bench.HoldingLoop(job, 1)
    seen: list[list[torch.Tensor]] = []
    add = holding.average.add_client
    holding.average.add_client = lambda w: (seen.append([t.clone() for t in holding.average.floats]), add(w))[1]
    for r in (1, 2):
        lean.run_round(r)
        seen.clear()
        holding.run_round(r)
        assert len(holding.held) == job.per_round == len(seen)
        assert all(torch.equal(a, b) for kept, want in zip(holding.held, seen) for a, b in zip(kept, want))
        assert all(torch.equal(a, b) for a, b in zip(lean.average.global_entries, holding.average.global_entries))
