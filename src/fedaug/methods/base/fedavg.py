"""FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629, Algorithm 1) as an ordinary component."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.methods.component import ClientCtx, Component, Phase, State, Uplink
from fedaug.methods.options import check_choice
from fedaug.methods.recipe import METHODS

WEIGHTINGS = ("samples", "uniform")
BN_POLICIES = ("average", "local", "drop")


def norm_stat_keys(model: nn.Module) -> list[str]:
    """``state_dict`` keys of the running statistics of every BatchNorm-like layer in ``model``."""
    keys = []
    for prefix, module in model.named_modules():
        if isinstance(module, _NormBase) and module.track_running_stats:
            dot = f"{prefix}." if prefix else ""
            keys += [f"{dot}running_mean", f"{dot}running_var", f"{dot}num_batches_tracked"]
    return keys


def weighted_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """``sum_k w_k t_k / sum_k w_k`` in float64, cast back to the inputs' dtype (FedAvg, Alg. 1).

    Integer tensors (e.g. BatchNorm's ``num_batches_tracked``) take the maximum instead.

    Args:
        tensors: same-shaped tensors, one per client, in client-id order.
        weights: non-negative, not all zero.
    """
    if not tensors[0].is_floating_point():
        return torch.stack(list(tensors)).amax(0)
    w = torch.tensor(weights, dtype=torch.float64, device=tensors[0].device)
    w = w / w.sum()
    acc = torch.zeros(tensors[0].shape, dtype=torch.float64, device=tensors[0].device)
    for wk, t in zip(w, tensors):
        acc += wk * t.to(torch.float64)
    return acc.to(tensors[0].dtype)


@METHODS.register("fedavg", "FedAvg (McMahan et al. 2017): weighted mean of the clients' weights")
class FedAvg(Component):
    """Federated Averaging: clients start from the global weights; the server averages theirs.

    The weights travel in every phase: clients train from them, the post-aggregation query and
    evaluation load them (with the client's own statistics under ``bn="local"``); only training
    replies with weights.

    Args:
        weighting: ``"samples"`` weights client k by its training-set size n_k (the paper);
            ``"uniform"`` weights every client equally.
        bn: what happens to BatchNorm running statistics: ``"average"`` (communicated and
            averaged like every other entry), ``"local"`` (never sent: each client keeps its own
            in its per-client state and is evaluated with them, as SiloBN), ``"drop"`` (removed:
            every BatchNorm layer normalises with the current batch's statistics, in training
            and evaluation, so results depend on the evaluation batch size).

    >>> fedavg = FedAvg(weighting="uniform", bn="local")
    """

    name = "fedavg"
    role = "server"
    phases = ("train", "query", "evaluate")

    def __init__(self, *, weighting: str = "samples", bn: str = "average") -> None:
        self.weighting = check_choice(self.name, "weighting", weighting, WEIGHTINGS)
        self.bn = check_choice(self.name, "bn", bn, BN_POLICIES)

    def _local_keys(self, model: nn.Module) -> list[str]:
        return norm_stat_keys(model) if self.bn == "local" else []

    def _shared(self, model: nn.Module) -> Part:
        local = set(self._local_keys(model))
        return {k: v for k, v in model.state_dict().items() if k not in local}

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        if self.bn == "drop":
            for module in model.modules():
                if isinstance(module, _NormBase) and module.track_running_stats:
                    module.track_running_stats = False
                    module.running_mean = module.running_var = module.num_batches_tracked = None

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._load(ctx.model, part, state)

    def _load(self, model: nn.Module, shared: Part, state: State) -> None:
        model.load_state_dict(shared, strict=False)
        if self.bn == "local":
            if "bn" in state:
                model.load_state_dict(state["bn"], strict=False)
            else:  # a client's first round: fresh statistics, never another client's
                for module in model.modules():
                    if isinstance(module, _NormBase) and module.track_running_stats:
                        module.reset_running_stats()

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        if not ctx.training:
            return {}, {}
        sd = ctx.model.state_dict()
        local = self._local_keys(ctx.model)
        uplink = {k: v.detach().clone() for k, v in sd.items() if k not in local}
        state = {"bn": {k: sd[k].detach().clone() for k in local}} if local else {}
        return uplink, state

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        return {"weights": {k: v.detach().clone() for k, v in self._shared(model).items()}}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        return dict(server["weights"])

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        return {k: TensorSpec.like(v) for k, v in self._shared(model).items()}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        return {k: TensorSpec.like(v) for k, v in server["weights"].items()} if phase == "train" else {}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        weights = [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uplinks]
        new = {k: weighted_average([u.part[k] for u in uplinks], weights) for k in server["weights"]}
        return {**server, "weights": new}
