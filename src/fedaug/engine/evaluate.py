"""Evaluation of the global model on every client's splits and on the pooled test set.

The client side (:func:`evaluate_client`) runs where the client's data is and returns its meters;
the server side (:func:`summarize_eval`) combines them, in client-id order, into per-client,
mean and pooled figures, whichever engine carried the meters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedaug.core.device import autocast
from fedaug.core.errors import PayloadError
from fedaug.core.payload import Message, Part, Spec, TensorSpec
from fedaug.data.base import ClientData
from fedaug.engine.fleet import METERS, Reply
from fedaug.methods.component import Batch, ClientCtx, State, transform_inputs
from fedaug.methods.recipe import Recipe
from fedaug.metrics.spread import client_spread
from fedaug.metrics.tasks import Meter, Task

SPLITS = ("val", "test")
#: the key prefix of the fine-tuned model's meters in an evaluation reply (``eval.finetune_steps``)
FINETUNED = "finetuned."


@torch.no_grad()
def evaluate_client(recipe: Recipe, ctx: ClientCtx, client: ClientData, message: Message,
                    state: Mapping[str, State], batch_size: int, precision: str = "32",
                    load_global: bool = True) -> Reply:
    """Evaluate the global model on one client's ``val`` and ``test`` splits.

    The components that take part in ``"evaluate"`` receive their parts and the client's
    per-client ``state`` (the server rule loads the global weights, e.g. with the client's own
    BatchNorm statistics); the inputs pass every component's ``transform_batch`` with
    ``ctx.training`` False.

    Args:
        recipe: the method.
        ctx: the client's context, phase ``"evaluate"``.
        client: the client's data, on ``ctx.device``.
        message: ``{component name: part}`` of the evaluation, already validated, on ``ctx.device``.
        state: the client's per-client state (read only).
        batch_size: evaluation batch size.
        precision: the forward pass runs under its autocast (:func:`fedaug.core.device.autocast`);
            the meters see float32 logits.
        load_global: let the server rule receive its part (load the global weights); ``False``
            evaluates the worker model as it is (a fine-tuned model, :mod:`fedaug.engine.finetune`),
            the other components still receiving theirs.

    Returns:
        The meters of both splits as one part (:func:`meters_part`), under :data:`METERS`.
    """
    views = {c.name: ctx.view(c.name) for c in recipe.components}
    for c in recipe.participants("evaluate"):
        if not load_global and c.role == "server":
            continue
        c.receive(views[c.name], message.get(c.name, {}), state.get(c.name, {}))
    model = ctx.model
    model.eval()
    meters = {}
    for split in SPLITS:
        part = getattr(client, split)
        meter = ctx.task.meter()
        for i in range(0, len(part), batch_size):
            batch = transform_inputs(recipe.per_batch["transform_batch"], views,
                                     Batch(part.x[i : i + batch_size], part.y[i : i + batch_size]))
            with autocast(ctx.device, precision):
                out = model(batch.x)
            meter.update(out.float(), batch.y)
        meters[split] = meter
    return Reply({METERS: meters_part(meters)})


def meters_part(meters: Mapping[str, Meter]) -> Part:
    """``{"<split>.<count>": tensor}`` from each split's :meth:`Meter.state`: floats as float64 and
    integers as int64 0-d tensors, tensors as they are (exact round trip, :func:`meters_of`)."""
    out = {}
    for split, meter in meters.items():
        for key, value in meter.state().items():
            if isinstance(value, torch.Tensor):
                out[f"{split}.{key}"] = value
            else:
                out[f"{split}.{key}"] = torch.tensor(value, dtype=torch.int64 if isinstance(value, int) else torch.float64)
    return out


def meters_spec(task: Task, finetuned: bool = False) -> Spec:
    """What the server accepts as an evaluation reply: the task's meter counts for each split, and
    with ``finetuned`` the same again under :data:`FINETUNED` (``eval.finetune_steps``)."""
    spec = {k: TensorSpec.like(v) for k, v in meters_part({s: task.meter() for s in SPLITS}).items()}
    return {**spec, **{FINETUNED + k: v for k, v in spec.items()}} if finetuned else spec


def meters_of(task: Task, part: Part, prefix: str = "") -> dict[str, Meter]:
    """The meters a :func:`meters_part` describes (validated against :func:`meters_spec` first),
    those whose keys start with ``prefix`` (``""``: the global model's; :data:`FINETUNED`).

    Raises:
        PayloadError: a count is negative.
    """
    meters = {}
    for split in SPLITS:
        state = {k[len(prefix):].split(".", 1)[1]: v for k, v in part.items() if k.startswith(f"{prefix}{split}.")}
        negative = sorted(f"{split}.{k}" for k, v in state.items() if bool((v < 0).any()))
        if negative:
            raise PayloadError(f"evaluation counts must be >= 0, got negative {', '.join(negative)}")
        meters[split] = task.meter()
        meters[split].load_state(state)
    return meters


def summarize_eval(task: Task, names: Sequence[str], meters: Mapping[int, Mapping[str, Meter]]) -> dict[str, Any]:
    """Per-client results, their unweighted mean, and the pooled test set.

    Args:
        task: the task (its meter and metric name).
        names: every client's name, by client id.
        meters: ``{client id: {"val": meter, "test": meter}}`` of the clients evaluated (a client
            missing here, e.g. one that dropped out on Flower, is left out of every figure).

    Returns:
        ``{"clients": {name: {"val": {...}, "test": {...}}}, "mean": {"val_<m>", "test_<m>",
        "test_loss"}, "pooled": {"test_<m>", "test_loss", "n"}, "spread": {"val_<m>", "test_<m>":
        {"std", "min", "worst10"}}}`` with ``<m>`` the task's metric (``acc`` or foreground
        ``dice``); the mean is unweighted over clients with a non-empty split; the pooled test set
        is the union of the clients' test splits, so pooled accuracy is the sample-weighted client
        mean and the pooled Dice is computed over all pooled pixels; the spread is over the same
        clients as the mean (:func:`fedaug.metrics.spread.client_spread`: population std, the
        worst client, the mean of the worst 10 %).
    """
    m = task.metric
    pooled = task.meter()
    clients: dict[str, Any] = {}
    for cid in sorted(meters):
        clients[names[cid]] = {split: meters[cid][split].result() for split in SPLITS}
        pooled.merge(meters[cid]["test"])
    mean, spread = {}, {}
    for split in SPLITS:
        rows = [r[split] for r in clients.values() if r[split]["n"] > 0]
        mean[f"{split}_{m}"] = sum(r[m] for r in rows) / len(rows) if rows else None
        if split == "test":
            mean["test_loss"] = sum(r["loss"] for r in rows) / len(rows) if rows else None
        spread[f"{split}_{m}"] = client_spread([r[m] for r in rows])
    p = pooled.result()
    return {"clients": clients, "mean": mean, "pooled": {f"test_{m}": p[m], "test_loss": p["loss"], "n": p["n"]},
            "spread": spread}
