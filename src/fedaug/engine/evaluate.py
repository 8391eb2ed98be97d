"""Evaluation of the global model on every client's splits and on the pooled test set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedaug.data.base import FederatedData
from fedaug.methods.component import Batch, ClientCtx, State
from fedaug.methods.recipe import Recipe
from fedaug.metrics.tasks import Task

SPLITS = ("val", "test")


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, recipe: Recipe, server: Mapping[str, State],
    client_states: Mapping[int, Mapping[str, State]], data: FederatedData, task: Task,
    seed: int, round: int, batch_size: int,
) -> dict[str, Any]:
    """Evaluate the global model (as each component prepares it for each client).

    Client ``k`` is evaluated with the model its components set up in ``eval_start`` (e.g. its own
    BatchNorm statistics) and its inputs pass every component's ``transform_batch`` with
    ``training=False``. The pooled test set is the union of the clients' test splits, each sample
    evaluated as its own client's (so pooled accuracy is the sample-weighted client mean).

    Returns:
        ``{"clients": {name: {"val": {...}, "test": {...}}}, "mean": {"val_<m>", "test_<m>",
        "test_loss"}, "pooled": {"test_<m>", "test_loss", "n"}}`` with ``<m>`` the task's metric
        (``acc`` or foreground ``dice``); the mean is unweighted over clients with a non-empty
        split; the pooled Dice is computed over all pooled pixels.
    """
    clients: dict[str, Any] = {}
    pooled = task.meter()
    m = task.metric
    transforms = recipe.per_batch["transform_batch"]
    for cid, client in enumerate(data.clients):
        ctx = ClientCtx(model, cid, round, seed, client.train, training=False, task=task)
        views = {c.name: ctx.view(c.name) for c in recipe.components}
        for c in recipe.components:
            c.eval_start(views[c.name], server[c.name], client_states.get(cid, {}).get(c.name, {}))
        model.eval()
        res = {}
        for split in SPLITS:
            part = getattr(client, split)
            meter = task.meter()
            for i in range(0, len(part), batch_size):
                batch = Batch(part.x[i : i + batch_size], part.y[i : i + batch_size])
                for c in transforms:
                    batch = c.transform_batch(views[c.name], batch)
                meter.update(model(batch.x), batch.y)
            res[split] = meter.result()
            if split == "test":
                pooled.merge(meter)
        clients[client.name] = res
    mean = {}
    for split in SPLITS:
        rows = [r[split] for r in clients.values() if r[split]["n"] > 0]
        mean[f"{split}_{m}"] = sum(r[m] for r in rows) / len(rows) if rows else None
        if split == "test":
            mean["test_loss"] = sum(r["loss"] for r in rows) / len(rows) if rows else None
    p = pooled.result()
    return {"clients": clients, "mean": mean, "pooled": {f"test_{m}": p[m], "test_loss": p["loss"], "n": p["n"]}}
