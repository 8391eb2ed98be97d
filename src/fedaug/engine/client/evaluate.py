"""Evaluation of the global model on every client's splits and on the pooled test set.

The client's side (:func:`evaluate_client`) runs where the client's data is and returns its meters;
the server's side (:func:`fedaug.engine.server.evaluation.summarize_eval`) combines them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedaug.core.device import autocast
from fedaug.core.payload import Message
from fedaug.data.base import ClientData
from fedaug.engine.protocol import EVAL_SPLITS, METERS, Reply, meters_part
from fedaug.methods.component import Batch, ClientCtx, State, transform_inputs
from fedaug.methods.recipe import Recipe



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
            evaluates the worker model as it is (a fine-tuned model, :mod:`fedaug.engine.client.finetune`),
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
    for split in EVAL_SPLITS:
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

