"""FLea: federated learning with a shared buffer of obfuscated features (Xia et al., KDD 2024,
arXiv:2312.02327, Sec. 3, Alg. 1).

The model is split at a stage l (:mod:`fedaug.models.split`). Per round t, on a sampled client:

* round start: receive the global buffer F(t) (empty in round 1) and keep a frozen copy of the
  global model theta(t) for distillation;
* per batch: features ``f = theta_k[:l](x)``; each is mixed with a random buffer feature with
  ``beta_i ~ Beta(a, a)`` (Eq. 2; skipped while the buffer is empty); the loss (Eq. 6) is the
  soft-label cross-entropy on ``theta_k[l:](f~)`` (Eq. 3, the task loss) plus
  ``lambda1 * KL(p^l || p^g)`` against theta(t) on the same mixed features (Eq. 4) plus
  ``lambda2 * dCor^2(x, f)`` between the raw batch and its features (Eq. 5 / Eq. 8);
* after aggregation (the engine's post-aggregation query, Alg. 1 lines 14-18): the clients of the
  round extract the features of a fixed ``share_fraction`` of their samples with the NEW global
  model theta(t+1) and upload them with their labels; the server replaces the buffer with them.

Options ``unmixed_ce``, ``distill_on="buffer"`` and ``dcor_final_weight`` reproduce choices of the
authors' public code (``docs/flea.md``); the defaults are the paper's. Classification only.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from fedaug.core.device import module_device
from fedaug.core.errors import ConfigError, PayloadError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.layers.attach import dry_run, output_shape
from fedaug.layers.mixing import soft_labels
from fedaug.methods.options import check_choice, check_dp, check_noise, range_problem, require_classification
from fedaug.methods.aug.flea_buffer import (distillation_loss, draw_pairs, empty_buffer, merge_buffer,
                                            mix_features, share_indices)
from fedaug.methods.component import Batch, ClientCtx, Component, Phase, Runner, State, Uplink
from fedaug.methods.recipe import METHODS
from fedaug.models.split import extract_features, forward_back, forward_front, split_stages
from fedaug.privacy.clip import clip_rows
from fedaug.privacy.dcor import distance_correlation
from fedaug.privacy.mechanism import gaussian_mechanism
from fedaug.privacy.noise import NoiseScale, add_gaussian_noise
from fedaug.privacy.release import GaussianRelease

DistillOn = Literal["mixed", "buffer"]
DISTILL_ON: tuple[str, ...] = get_args(DistillOn)


@METHODS.register("flea", "FLea (KDD 2024): mixup with a buffer of shared dCor-obfuscated features + distillation")
class FLea(Component):
    """FLea's client training and feature buffer (replaces the forward pass, in its step form:
    :meth:`group_replace_forward`, so FLea trains eagerly, grouped and captured alike).

    Args:
        stage: the split stage l (one of the model's ``split_stages``); default: the model's first
            ``feature_stages`` entry.
        share_fraction: alpha, the fraction of its samples a client shares (0.1; ``int(alpha n)``).
        beta: a of ``Beta(a, a)`` for the per-sample mixing weight (Eq. 2; 2.0).
        distill_weight: lambda1 (Eq. 6; 1.0).
        dcor_weight: lambda2 (Eq. 6; 3.0), in round 1.
        dcor_final_weight: ``None`` keeps lambda2 constant (paper); a value decays it linearly to
            this value over ``dcor_decay_rounds`` rounds (public code: 3 -> 1 over 20).
        dcor_decay_rounds: rounds of that decay.
        dcor_squared: ``True``: dCor^2 (Eq. 8); ``False``: dCor (the public code).
        distill_on: ``"mixed"`` (Eq. 4: both models on the mixed features) or ``"buffer"`` (public
            code: on the unmixed buffer features; on the local features while the buffer is empty).
        unmixed_ce: add a plain cross-entropy on the unmixed local batch (public code).
        max_buffer: the most rows the global buffer holds; beyond it, rows are subsampled evenly
            over contributors (:func:`~fedaug.methods.aug.flea_buffer.merge_buffer`).
        share_noise: std of Gaussian noise added to the shared features (0: none; :mod:`fedaug.privacy.noise`).
        share_noise_scale: ``"absolute"`` or ``"relative"`` (to the features' standard deviation).
        dp_clip: C > 0: the sample-level Gaussian mechanism on the shared features: each row (one
            sample's features, flattened) is clipped to L2 norm C; ``None`` (default): off.
        dp_noise: z >= 0: each clipped row gets ``N(0, (z C)^2)`` per value (needs ``dp_clip``).
            Declares the release ``"flea features"`` (every round the client is queried,
            sample-level). The labels travel in clear (not covered), and the bound holds for the
            features of a given global model (docs/privacy.md). ``share_noise`` adds its noise on top.

    >>> flea = FLea(stage="block2", share_fraction=0.1, beta=2.0, distill_weight=1.0, dcor_weight=3.0)
    """

    name = "flea"
    phases = ("train", "query")
    needs_global_model = True

    def __init__(self, *, stage: str | None = None, share_fraction: float = 0.1, beta: float = 2.0,
                 distill_weight: float = 1.0, dcor_weight: float = 3.0, dcor_final_weight: float | None = None,
                 dcor_decay_rounds: int = 20, dcor_squared: bool = True, distill_on: DistillOn = "mixed",
                 unmixed_ce: bool = False, max_buffer: int = 10_000, share_noise: float = 0.0,
                 share_noise_scale: NoiseScale = "absolute", dp_clip: float | None = None,
                 dp_noise: float | None = None) -> None:
        problems = [p for p in (
            range_problem("flea.share_fraction", share_fraction, lo=0.0, hi=1.0),
            range_problem("flea.beta", beta, lo=0.0, lo_open=True),  # the Beta(a, a) concentration
            range_problem("flea.distill_weight", distill_weight, lo=0.0),
            range_problem("flea.dcor_weight", dcor_weight, lo=0.0),
            None if dcor_final_weight is None else range_problem("flea.dcor_final_weight", dcor_final_weight, lo=0.0),
            range_problem("flea.dcor_decay_rounds", dcor_decay_rounds, lo=1, integer=True),
            range_problem("flea.max_buffer", max_buffer, lo=1, integer=True),
        ) if p]
        if problems:
            raise ConfigError("; ".join(problems))
        check_noise(self.name, share_noise, share_noise_scale)
        self.dp_clip, self.dp_noise = check_dp(self.name, dp_clip, dp_noise)
        if self.dp_clip is not None and self.dp_noise > 0:
            self.releases = (GaussianRelease("flea features", self.dp_noise, self.dp_clip, "every_round", "sample"),)
        self.stage, self.share_fraction, self.beta = stage, float(share_fraction), float(beta)
        self.distill_weight, self.dcor_weight = float(distill_weight), float(dcor_weight)
        self.dcor_final_weight, self.dcor_decay_rounds = dcor_final_weight, dcor_decay_rounds
        self.dcor_squared, self.unmixed_ce = bool(dcor_squared), bool(unmixed_ce)
        self.distill_on = check_choice(self.name, "distill_on", distill_on, DISTILL_ON)
        self.max_buffer, self.share_noise, self.share_noise_scale = max_buffer, float(share_noise), share_noise_scale
        self._teacher: nn.Module | None = None
        #: whether Eq. 5's term is ever weighted (lambda2 > 0 in some round; its weight of the round is a tensor)
        self._dcor = self.dcor_weight != 0 or self.dcor_final_weight not in (None, 0)
        self._shape: tuple[int, ...] | None = None  # one sample's features and the class count, from setup
        self._classes: int | None = None

    def dcor_weight_at(self, round: int) -> float:
        """lambda2 in ``round`` (1-based): constant, or linear from ``dcor_weight`` to ``dcor_final_weight``."""
        if self.dcor_final_weight is None:
            return self.dcor_weight
        t = min(max(round - 1, 0) / self.dcor_decay_rounds, 1.0)
        return self.dcor_weight + t * (self.dcor_final_weight - self.dcor_weight)

    # --- client side -----------------------------------------------------------------------
    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        stages = split_stages(model)
        if self.stage is None:
            self.stage = (getattr(model, "feature_stages", ()) or stages)[0]
        elif self.stage not in stages:
            raise ConfigError(f"flea.stage '{self.stage}' is not a stage of {type(model).__name__}; "
                              f"choose from {', '.join(stages)}")
        with dry_run(model):  # what every shared row holds: D values and a label below the class count
            f = extract_features(model, torch.zeros(2, *input_shape, device=module_device(model)), self.stage)
        self._shape = tuple(f.shape[1:]) if isinstance(f, Tensor) else None
        self._classes = output_shape(model, input_shape)[0]

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        require_classification(ctx, self.name)
        if not ctx.training:  # the query: the new global model is all it needs
            return
        if self._teacher is None:  # theta(t) for Eq. 4; attached layers' hooks are not copied
            self._teacher = copy.deepcopy(ctx.model).requires_grad_(False)
            for m in self._teacher.modules():
                m._forward_hooks.clear()
                m._forward_pre_hooks.clear()
        self._teacher.load_state_dict(ctx.model.state_dict())
        self._teacher.eval()
        self._task_loss, self._num_classes = ctx.task.loss, ctx.task.num_classes
        feats, labels = part["features"], part["labels"]
        self._buf_x, self._buf_y = feats[:0], labels
        if feats.shape[0]:
            shape = self._shape or ()
            if feats.shape[1] != math.prod(shape):
                raise PayloadError(f"flea: buffer rows hold {feats.shape[1]} values, this client's features at "
                                   f"'{self.stage}' {tuple(shape)} hold {math.prod(shape)}")
            self._buf_x = feats.reshape(-1, *shape)
            self._buf_y = soft_labels(labels, ctx.task.num_classes)

    # --- the step (fedaug.engine.client.step: eager, grouped and captured training) -------------
    def group_blocker(self) -> str:
        """Nothing: the pairs are drawn before each step, the buffer and the global model are the step's
        tensors, and the split forward runs on the step's parameters."""
        return ""

    def group_capture(self, ctx: ClientCtx) -> State:
        """The buffer (features ``(M, *shape)``, soft labels ``(M, K)``), the global model's parameters and
        buffers (theta(t), references), and lambda2 of the round, as tensors."""
        return {"buf_x": self._buf_x, "buf_y": self._buf_y, "teacher": dict(self._teacher.state_dict()),
                "lam2": torch.tensor(self.dcor_weight_at(ctx.round), device=ctx.device)}

    def group_inputs(self, ctx: ClientCtx, batch_size: int) -> State:
        """Each local sample's buffer row and mixing weight (Alg. 1 line 7), while the buffer holds any."""
        if not self._buf_x.shape[0]:
            return {}
        j, beta = draw_pairs(batch_size, self._buf_x.shape[0], self.beta, ctx.rng("mix"))
        return {"j": j, "beta": beta}

    def group_replace_forward(self, run: Runner, captured: State, inputs: State, batch: Batch
                              ) -> tuple[Tensor, Batch, dict[str, Tensor]]:
        """The split forward with feature mixing (Eq. 2-3) and the loss terms of Eq. 4-5 (module docstring)."""
        front = lambda model, x: forward_front(model, x, self.stage)  # noqa: E731
        back = lambda model, f: forward_back(model, f, self.stage)  # noqa: E731
        f = run(front, batch.x)
        if not isinstance(f, Tensor):
            raise ConfigError(f"flea.stage '{self.stage}': the features are not a tensor ({type(f).__name__}); "
                              "choose a stage of a chain model")
        y = soft_labels(batch.y, self._num_classes)
        f_mix, y_mix, f_buf = f, y, None
        if inputs:
            j = inputs["j"]
            f_buf = captured["buf_x"][j].to(f)
            f_mix, y_mix = mix_features(f, y, f_buf, captured["buf_y"][j], inputs["beta"])
        out = run(back, f_mix)
        terms: dict[str, Tensor] = {}
        if self.distill_weight:
            if self.distill_on == "mixed":
                inp, local = f_mix, out
            else:
                inp = f_buf if f_buf is not None else f
                local = run(back, inp)
            with torch.no_grad():
                teacher = run(back, inp.detach(), module=self._teacher, state=captured["teacher"])
            terms["distill"] = self.distill_weight * distillation_loss(local, teacher)
        if self._dcor and batch.x.shape[0] >= 2:
            terms["dcor"] = captured["lam2"] * distance_correlation(batch.x, f, squared=self.dcor_squared)
        if self.unmixed_ce:
            terms["ce_unmixed"] = self._task_loss(run(back, f), y)
        return out, Batch(batch.x, y_mix), terms

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        if ctx.training:
            self._buf_x = self._buf_y = None  # the buffer is never kept between rounds
            return {}, {}
        idx = share_indices(len(ctx.data), self.share_fraction, ctx.seed, ctx.client_id, ctx.device)
        f = extract_features(ctx.model, ctx.data.x[idx], self.stage)
        if self.dp_clip is not None:  # one sample's release per row
            f = gaussian_mechanism({"f": clip_rows(f, self.dp_clip)}, self.dp_clip, self.dp_noise, ctx.rng("dp"))["f"]
        f = add_gaussian_noise(f, self.share_noise, ctx.rng("noise"), scale=self.share_noise_scale)
        return {"features": f.flatten(1).float(), "labels": ctx.data.y[idx].to(torch.int64)}, {}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        return empty_buffer(module_device(model))

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        if phase != "train":
            return {}
        return {"features": server["features"].clone(), "labels": server["labels"].clone()}

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        if phase != "train":
            return {}
        return self._rows_spec(width=None)  # the empty round-1 buffer is (0, 0); receive checks D

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        width = None if self._shape is None else math.prod(self._shape)
        return self._rows_spec(width=width) if phase == "query" else {}

    def _rows_spec(self, width: int | None) -> Spec:
        """Shared rows: ``features (n, width)`` and ``labels (n,)`` in ``[0, num_classes)``, the
        class count from :meth:`setup` (known from round 1)."""
        return {"features": TensorSpec(("rows", width), torch.float32, kind="data"),
                "labels": TensorSpec(("rows",), torch.int64, low=0, kind="data",
                                     high=None if self._classes is None else self._classes - 1)}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        return merge_buffer(uplinks, self.max_buffer) if phase == "query" else server
