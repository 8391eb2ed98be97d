"""The lean floor's FedAvg bookkeeping (issue 46), shared by bench_throughput.py and bench_device.py: the
leanest honest way to start each client from the global weights and average the clients' weights, on any
device, with no host synchronisation.

* each client starts from the global weights copied into the model's own tensors in place (one
  ``_foreach_copy_``; no ``load_state_dict``), with the one optimiser's state cleared (not a new optimiser);
* its floating-point weights are added into a float32 sum in place, each with its sample weight (one
  ``_foreach_add_``; no float64 temporaries, no copy of the client's state);
* its integer entries (BatchNorm's ``num_batches_tracked``) are kept as the largest seen, as FedAvg keeps them;
* the round's end copies the sum into the global weights.
"""

from __future__ import annotations

import torch


class LeanAverage:
    """FedAvg's start and average for one model, in place.

    Args:
        model: the model the clients train in turn (its ``state_dict`` entries, in order, are the state).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.entries = [t.detach() for t in model.state_dict(keep_vars=True).values()]
        self.floats = [t for t in self.entries if t.is_floating_point()]
        self.counts = [t for t in self.entries if not t.is_floating_point()]
        self.global_entries = [t.clone() for t in self.entries]
        self.sum = [torch.zeros_like(t) for t in self.floats]
        self.top = [torch.zeros_like(t) for t in self.counts]

    @torch.no_grad()
    def start_round(self) -> None:
        """The sum and the integer entries' maxima emptied."""
        torch._foreach_zero_(self.sum)
        for t in self.top:
            t.fill_(torch.iinfo(t.dtype).min)

    @torch.no_grad()
    def start_client(self, opt: torch.optim.Optimizer) -> None:
        """The model at the global weights, ``opt``'s state (momentum) cleared."""
        torch._foreach_copy_(self.entries, self.global_entries)
        opt.state.clear()

    @torch.no_grad()
    def add_client(self, weight: float) -> None:
        """The model's weights added into the round's sum with ``weight`` (its share of the round's samples)."""
        torch._foreach_add_(self.sum, self.floats, alpha=weight)
        if self.counts:
            torch._foreach_maximum_(self.top, self.counts)

    @torch.no_grad()
    def finish_round(self) -> None:
        """The global weights set to the round's weighted sum (and the integer entries to their maxima)."""
        fl, it = iter(self.sum), iter(self.top)
        for dst in self.global_entries:
            dst.copy_(next(fl) if dst.is_floating_point() else next(it))
