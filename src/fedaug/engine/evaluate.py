"""Evaluation of the global model on every client's splits and on the pooled test set.

The client side (:func:`evaluate_client`) runs where the client's data is and returns its meters;
the server side (:func:`summarize_eval`) combines them, in client-id order, into per-client,
mean and pooled figures, whichever engine carried the meters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedaug.data.base import ClientData
from fedaug.methods.component import Batch, ClientCtx, State, transform_inputs
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import Meter, Task

SPLITS = ("val", "test")


@torch.no_grad()
def evaluate_client(
    model: torch.nn.Module, recipe: Recipe, server: Mapping[str, State], state: Mapping[str, State],
    client_id: int, client: ClientData, task: Task, seed: int, round: int, batch_size: int,
) -> dict[str, Meter]:
    """Evaluate the global model on one client's ``val`` and ``test`` splits.

    The client is evaluated with the model its components set up in ``eval_start`` from the server
    state and its per-client ``state`` (e.g. its own BatchNorm statistics); its inputs pass every
    component's ``transform_batch`` with ``training=False``.

    Returns:
        ``{"val": meter, "test": meter}``, each the task's meter over that split.
    """
    ctx = ClientCtx(model, client_id, round, seed, client.train, training=False, task=task)
    views = {c.name: ctx.view(c.name) for c in recipe.components}
    for c in recipe.components:
        c.eval_start(views[c.name], server[c.name], state.get(c.name, {}))
    model.eval()
    meters = {}
    for split in SPLITS:
        part = getattr(client, split)
        meter = task.meter()
        for i in range(0, len(part), batch_size):
            batch = transform_inputs(recipe.per_batch["transform_batch"], views,
                                     Batch(part.x[i : i + batch_size], part.y[i : i + batch_size]))
            meter.update(model(batch.x), batch.y)
        meters[split] = meter
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
        "test_loss"}, "pooled": {"test_<m>", "test_loss", "n"}}`` with ``<m>`` the task's metric
        (``acc`` or foreground ``dice``); the mean is unweighted over clients with a non-empty
        split; the pooled test set is the union of the clients' test splits, so pooled accuracy
        is the sample-weighted client mean and the pooled Dice is computed over all pooled pixels.
    """
    m = task.metric
    pooled = task.meter()
    clients: dict[str, Any] = {}
    for cid in sorted(meters):
        clients[names[cid]] = {split: meters[cid][split].result() for split in SPLITS}
        pooled.merge(meters[cid]["test"])
    mean = {}
    for split in SPLITS:
        rows = [r[split] for r in clients.values() if r[split]["n"] > 0]
        mean[f"{split}_{m}"] = sum(r[m] for r in rows) / len(rows) if rows else None
        if split == "test":
            mean["test_loss"] = sum(r["loss"] for r in rows) / len(rows) if rows else None
    p = pooled.result()
    return {"clients": clients, "mean": mean, "pooled": {f"test_{m}": p[m], "test_loss": p["loss"], "n": p["n"]}}
