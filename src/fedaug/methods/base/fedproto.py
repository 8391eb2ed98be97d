"""FedProto: clients keep their own models and exchange class prototypes only."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaug.core.device import module_device
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.methods._common import classifier_head, detached, feature_tap, hard_labels, label_counts
from fedaug.methods.options import check_range
from fedaug.methods.component import Batch, ClientCtx, Component, Phase, State, Uplink
from fedaug.methods.recipe import METHODS


#: each entry's kind (:data:`~fedaug.core.payload.KINDS`): the class counts grow with a client's data
KINDS = {"protos": "shared", "counts": "data"}


def prototype_spec(model: nn.Module) -> Spec:
    """Prototypes ``(K, D)`` and per-class weights ``(K,)`` for ``model``'s linear head."""
    _, head = classifier_head(model)
    k, d = head.out_features, head.in_features
    return {"protos": TensorSpec((k, d), torch.float32),
            "counts": TensorSpec((k,), torch.float32, low=0.0, kind=KINDS["counts"])}


@METHODS.register("fedproto", "FedProto (Tan et al. 2022): local models, shared class prototypes (lam)")
class FedProto(Component):
    """FedProto (Tan et al., AAAI 2022, arXiv:2105.00243, Sec. 4, Algorithm 1).

    No weights are exchanged: each client trains and is evaluated with its own model (per-client
    state ``"model"``: a full ``state_dict``; the initial model in its first round). Local loss:
    ``CE + lam * MSE(z_i, C_{y_i})`` over the samples whose class has a global prototype, with z the
    input of the classifier head (the regulariser as in the authors' code). The client's prototypes
    ``C_j^(i)`` are the mean z of class j over its round's training forwards; it uploads them with
    its class counts ``n_ij`` (message part, ``(K, D)`` and ``(K,)``); the server's prototype is
    ``C_j = sum_i n_ij C_j^(i) / sum_i n_ij`` (a class no sampled client has keeps its previous one).
    Predictions use each local classifier (not nearest-prototype inference). Classification only.

    Args:
        lam: weight of the prototype regulariser (>= 0, default 1).

    >>> proto = FedProto(lam=1.0)
    """

    name = "fedproto"
    role = "server"
    phases = ("train", "query", "evaluate")
    keeps_global_model = False

    def __init__(self, *, lam: float = 1.0) -> None:
        check_range("fedproto.lam", lam, lo=0.0)
        self.lam = lam

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        feature_tap(model)
        self._initial = detached(model.state_dict())

    def _load(self, model: nn.Module, state: State) -> None:
        model.load_state_dict(state.get("model", self._initial))

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._load(ctx.model, state)
        if not ctx.training:  # the query and evaluation use the client's own model
            return
        label_counts(ctx, self.name)  # classification only
        self._global, self._known = part["protos"], part["counts"] > 0
        self._sums = torch.zeros_like(self._global)
        self._counts = torch.zeros_like(part["counts"])

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        z, y = feature_tap(ctx.model).features, hard_labels(batch.y)
        self._sums.index_add_(0, y, z.detach())
        self._counts += torch.bincount(y, minlength=self._counts.shape[0]).float()
        known = self._known[y]
        if not bool(known.any()):
            return {}
        return {"proto": self.lam * F.mse_loss(z[known], self._global[y[known]])}

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        if not ctx.training:
            return {}, {}
        protos = self._sums / self._counts.clamp_min(1)[:, None]
        return {"protos": protos, "counts": self._counts.clone()}, {"model": detached(ctx.model.state_dict())}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        spec = prototype_spec(model)
        return {k: torch.zeros(s.shape, device=module_device(model)) for k, s in spec.items()}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        return dict(server) if phase == "train" else {}

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        return prototype_spec(model) if phase == "train" else {}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        return {k: TensorSpec.like(v, kind=KINDS[k]) for k, v in server.items()} if phase == "train" else {}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        n = torch.stack([u.part["counts"] for u in uplinks])  # (S, K)
        sums = sum(u.part["counts"][:, None] * u.part["protos"] for u in uplinks)  # (K, D)
        total = n.sum(0)
        seen = total > 0
        protos = torch.where(seen[:, None], sums / total.clamp_min(1)[:, None], server["protos"])
        return {"protos": protos, "counts": torch.where(seen, total, server["counts"])}
