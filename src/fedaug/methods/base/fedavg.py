"""FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629, Algorithm 1) as an ordinary component."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal, get_args

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

from fedaug.core.errors import ConfigError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.core.server_ops import weighted_sums
from fedaug.methods._common import detached, load_entries, plain_entries
from fedaug.methods.component import ClientCtx, Component, Phase, State, Uplink
from fedaug.methods.options import check_choice, range_problem
from fedaug.methods.recipe import METHODS
from fedaug.privacy.clip import clip_update
from fedaug.privacy.release import GaussianRelease

#: how client updates are weighted (option ``weighting``): by training samples, or equally.
Weighting = Literal["samples", "uniform"]
WEIGHTINGS: tuple[str, ...] = get_args(Weighting)
#: what happens to BatchNorm entries (option ``bn``).
BnPolicy = Literal["average", "local", "drop"]
BN_POLICIES: tuple[str, ...] = get_args(BnPolicy)
#: where client updates are clipped (option ``clip_at``): by the server on receipt, or by the client.
ClipSite = Literal["server", "client"]
CLIP_SITES: tuple[str, ...] = get_args(ClipSite)


#: BatchNorm entries that hold no negative value (a running variance, a batch counter)
NONNEGATIVE = ("running_var", "num_batches_tracked")


def _entry(key: str) -> str:
    """The last dotted segment of a ``state_dict`` key (``"block1.1.running_var"`` -> ``"running_var"``)."""
    return key.rsplit(".", 1)[-1]


def norm_stat_keys(model: nn.Module) -> list[str]:
    """``state_dict`` keys of the running statistics of every BatchNorm-like layer in ``model``."""
    keys = []
    for prefix, module in model.named_modules():
        if isinstance(module, _NormBase) and module.track_running_stats:
            dot = f"{prefix}." if prefix else ""
            keys += [f"{dot}running_mean", f"{dot}running_var", f"{dot}num_batches_tracked"]
    return keys


def entry_kinds(model: nn.Module) -> dict[str, str]:
    """The kind (:data:`~fedaug.core.payload.KINDS`) of each of ``model``'s ``state_dict`` entries, as the
    update screening measures them apart: ``"parameters"`` for its parameters, ``"statistics"`` for its
    buffers (BatchNorm's running means and variances, which the forward pass accumulates)."""
    kinds = {k: "statistics" for k, _ in model.named_buffers()}
    return {**kinds, **{k: "parameters" for k, _ in model.named_parameters()}}


def weighted_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """``sum_k w_k t_k / sum_k w_k`` in float64, cast back to the inputs' dtype (FedAvg, Alg. 1).

    Integer tensors (e.g. BatchNorm's ``num_batches_tracked``) take the maximum instead. The sum is
    :func:`~fedaug.core.server_ops.weighted_sum` (one pass over each upload where the compiled
    library is built; the same bits either way).

    Args:
        tensors: same-shaped tensors, one per client, in client-id order.
        weights: non-negative, not all zero.
    """
    return weighted_averages({"": tensors}, weights)[""]


def weighted_averages(columns: Mapping[str, Sequence[Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """:func:`weighted_average` of every entry ``{key: tensors, one per client}`` with the same weights, the
    floating entries' sums together (:func:`~fedaug.core.server_ops.weighted_sums`: a few multi-tensor
    operations per client where the compiled library does not take them, not three per entry)."""
    w = _normalized(tuple(weights))
    floats = [k for k, column in columns.items() if column[0].is_floating_point()]
    sums = dict(zip(floats, weighted_sums([columns[k] for k in floats], w)))
    return {k: sums[k].to(column[0].dtype) if k in sums else torch.stack(list(column)).amax(0)
            for k, column in columns.items()}


@functools.lru_cache(maxsize=8)
def _normalized(weights: tuple[float, ...]) -> list[float]:
    """``w_k / sum_k w_k`` in float64, as host scalars (computed once per aggregation, not once per entry:
    :func:`weighted_average` runs per entry with the same weights)."""
    w = torch.tensor(weights, dtype=torch.float64)
    return (w / w.sum()).tolist()


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
        clip_norm: bound C on each client's update Delta_k = w_k - w over all floating shared
            entries (:func:`clip_update`); 0 (default) clips nothing.
        clip_at: who clips: ``"server"`` (on receipt, Flower's server-side fixed clipping) or
            ``"client"`` (before sending, from the global weights it received; Flower's
            ``fixedclipping_mod``). Only ``"server"`` bounds a client that does not follow the protocol.
        noise_multiplier: z >= 0; z > 0 is DP-FedAvg's update mechanism (McMahan et al. 2018,
            arXiv:1710.06963, Alg. 1): N(0, (z C / m)^2) added by the server to every floating
            coordinate of the average of the m accepted clipped updates. Needs ``clip_norm > 0``
            and ``weighting="uniform"`` (the sensitivity C / m holds for the uniform mean only);
            declared in :attr:`releases` for the privacy accountant.

    >>> fedavg = FedAvg(weighting="uniform", bn="local")
    >>> dp = FedAvg(weighting="uniform", clip_norm=1.0, noise_multiplier=1.1)
    >>> dp.releases[0].what, dp.releases[0].sensitivity
    ('model update', 1.0)
    """

    name = "fedavg"
    role = "server"
    #: aggregation (weighting, noise), which entries travel (bn) and the client's clipping of its reply
    pack_free: ClassVar[frozenset[str]] = frozenset({"weighting", "bn", "clip_norm", "clip_at", "noise_multiplier"})
    phases = ("train", "query", "evaluate")

    def __init__(self, *, weighting: Weighting = "samples", bn: BnPolicy = "average", clip_norm: float = 0.0,
                 clip_at: ClipSite = "server", noise_multiplier: float = 0.0) -> None:
        self.weighting = check_choice(self.name, "weighting", weighting, WEIGHTINGS)
        self.bn = check_choice(self.name, "bn", bn, BN_POLICIES)
        self.clip_at = check_choice(self.name, "clip_at", clip_at, CLIP_SITES)
        problems = [p for p in (range_problem(f"{self.name}.clip_norm", clip_norm, lo=0.0),
                                range_problem(f"{self.name}.noise_multiplier", noise_multiplier, lo=0.0)) if p]
        if not problems and noise_multiplier > 0 and clip_norm == 0:
            problems.append(f"{self.name}.noise_multiplier={noise_multiplier} needs {self.name}.clip_norm > 0 "
                            "(the noise is calibrated to the clipping bound C): set clip_norm")
        if not problems and noise_multiplier > 0 and weighting == "samples":
            problems.append(f"{self.name}.noise_multiplier={noise_multiplier} needs {self.name}.weighting='uniform': "
                            "with weights n_k / n one client moves the average by up to C n_k / n, not C / m, "
                            "so the noise z C / m would not cover it (Flower's DP wrappers keep the inner "
                            "strategy's example weights and leave this to the user)")
        if problems:
            raise ConfigError("; ".join(problems))
        self.clip_norm, self.noise_multiplier = float(clip_norm), float(noise_multiplier)
        if self.noise_multiplier > 0:
            self.releases = (GaussianRelease("model update", self.noise_multiplier, self.clip_norm,
                                             "every_round", "client"),)
        self._received: Part = {}  # the global weights this client trains from (clip_at="client")
        self._kinds: dict[str, str] = {}  # each shared entry's kind (entry_kinds), known from init_server on

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
        if ctx.training and self.clip_norm and self.clip_at == "client":
            self._received = {k: v.detach().clone() for k, v in part.items()}

    def _load(self, model: nn.Module, shared: Part, state: State) -> None:
        load_entries(model, shared)
        if self.bn == "local":
            if "bn" in state:
                load_entries(model, state["bn"])
            else:  # a client's first round: fresh statistics, never another client's
                for module in model.modules():
                    if isinstance(module, _NormBase) and module.track_running_stats:
                        module.reset_running_stats()

    def group_blocker(self) -> str:
        return ""

    def group_capture(self, ctx: ClientCtx) -> State:
        """The global weights this client received, where it clips its own update (``clip_at="client"``)."""
        return {"received": self._received} if self.clip_norm and self.clip_at == "client" else {}

    def group_restore(self, ctx: ClientCtx, captured: State) -> None:
        if "received" in captured:
            self._received = captured["received"]

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        if not ctx.training:
            return {}, {}
        sd = plain_entries(ctx.model)
        sd = ctx.model.state_dict(keep_vars=True) if sd is None else sd
        local = self._local_keys(ctx.model)
        uplink = detached({k: v for k, v in sd.items() if k not in local})
        if self.clip_norm and self.clip_at == "client":
            uplink = clip_update(uplink, self._received, self.clip_norm)[0]
        state = {"bn": detached({k: sd[k] for k in local})} if local else {}
        return uplink, state

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        self._kinds = entry_kinds(model)
        return {"weights": {k: v.detach().clone() for k, v in self._shared(model).items()}}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        return dict(server["weights"])

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        return {k: TensorSpec.like(v) for k, v in self._shared(model).items()}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        """The shared weights' shapes and dtypes, and their kinds (parameters or normalisation statistics,
        :func:`entry_kinds`; an entry of unknown origin counts as a parameter); BatchNorm running variances
        and batch counters must be >= 0 (a negative variance, e.g. a sign-flipped update, would make the
        averaged model's normalisation NaN for everyone)."""
        if phase != "train":
            return {}
        specs = {k: TensorSpec.like(v, kind=self._kinds.get(k, "parameters")) for k, v in server["weights"].items()}
        return {k: dataclasses.replace(s, low=0) if _entry(k) in NONNEGATIVE else s for k, s in specs.items()}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train",
                  rng: torch.Generator | None = None) -> State:
        """Clip (``clip_at="server"``), :meth:`combine`, add DP noise (``noise_multiplier``).

        Raises:
            ValueError: ``noise_multiplier > 0`` and no ``rng`` (the noise must come from the
                server's seeded stream, never from global state).
        """
        current = server["weights"]
        parts = [u.part for u in uplinks]
        if self.clip_norm and self.clip_at == "server":
            parts = [clip_update(p, current, self.clip_norm)[0] for p in parts]
        weights = [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uplinks]
        new = self.combine(parts, weights, list(current))
        if self.noise_multiplier:
            if rng is None:
                raise ValueError(f"{self.name}: noise_multiplier > 0 needs the server's random stream (rng)")
            std = self.noise_multiplier * self.clip_norm / len(uplinks)  # DP-FedAvg, sigma = z C / m
            new = {k: (v.double() + std * torch.randn(v.shape, generator=rng, dtype=torch.float64,
                                                      device=rng.device).to(v.device)).to(v.dtype)
                   if v.is_floating_point() else v for k, v in new.items()}
            # post-processing (no effect on the guarantee): a noisy BatchNorm variance below 0 would make
            # the global model's normalisation NaN and every client's next upload be refused (uplink_spec)
            new = {k: v.clamp_min(0.0) if _entry(k) == "running_var" else v for k, v in new.items()}
        return {**server, "weights": new}

    def combine(self, parts: Sequence[Part], weights: Sequence[float], keys: Sequence[str]) -> Part:
        """The new global weights from the clients' (clipped) weights: FedAvg's weighted mean per
        entry (Alg. 1); robust rules (:mod:`fedaug.methods.base.robust`) override this step only.

        Args:
            parts: one ``{key: tensor}`` per accepted client, in client-id order.
            weights: their aggregation weights (``weighting``).
            keys: the shared entries to aggregate, in order.

        Returns:
            ``{key: tensor}``, each in its entries' dtype.
        """
        return weighted_averages({k: [p[k] for p in parts] for k in keys}, weights)
