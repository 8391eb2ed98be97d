"""The server's side of evaluation: what it accepts as a client's evaluation reply (:func:`meters_spec`),
the meters it reads from one (:func:`meters_of`), and their summary in client-id order into per-client, mean
and pooled figures (:func:`summarize_eval`), whichever fleet carried the meters. The client's side is
:func:`fedaug.engine.client.evaluate.evaluate_client`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedaug.core.errors import PayloadError
from fedaug.core.payload import Part, Spec, TensorSpec, host_values
from fedaug.engine.protocol import EVAL_SPLITS, FINETUNED, meters_part
from fedaug.metrics.spread import client_spread
from fedaug.metrics.tasks import Meter, Task


def meters_spec(task: Task, finetuned: bool = False) -> Spec:
    """What the server accepts as an evaluation reply: the task's meter counts for each split, and
    with ``finetuned`` the same again under :data:`FINETUNED` (``eval.finetune_steps``)."""
    spec = {k: TensorSpec.like(v) for k, v in meters_part({s: task.meter() for s in EVAL_SPLITS}).items()}
    return {**spec, **{FINETUNED + k: v for k, v in spec.items()}} if finetuned else spec


def meters_of(task: Task, part: Part, prefix: str = "") -> dict[str, Meter]:
    """The meters a :func:`meters_part` describes (validated against :func:`meters_spec` first),
    those whose keys start with ``prefix`` (``""``: the global model's; :data:`FINETUNED`), their counts
    read at once (:func:`~fedaug.core.payload.host_values`: one synchronisation per reply, not one per count).

    Raises:
        PayloadError: a count is negative.
    """
    values = host_values({k: v for k, v in part.items() if k.startswith(prefix)})
    meters = {}
    for split in EVAL_SPLITS:
        state = {k[len(prefix):].split(".", 1)[1]: v for k, v in values.items() if k.startswith(f"{prefix}{split}.")}
        negative = sorted(f"{split}.{k}" for k, v in state.items()
                          if any(x < 0 for x in (v if isinstance(v, list) else [v])))
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
        clients[names[cid]] = {split: meters[cid][split].result() for split in EVAL_SPLITS}
        pooled.merge(meters[cid]["test"])
    mean, spread = {}, {}
    for split in EVAL_SPLITS:
        rows = [r[split] for r in clients.values() if r[split]["n"] > 0]
        mean[f"{split}_{m}"] = sum(r[m] for r in rows) / len(rows) if rows else None
        if split == "test":
            mean["test_loss"] = sum(r["loss"] for r in rows) / len(rows) if rows else None
        spread[f"{split}_{m}"] = client_spread([r[m] for r in rows])
    p = pooled.result()
    return {"clients": clients, "mean": mean, "pooled": {f"test_{m}": p[m], "test_loss": p["loss"], "n": p["n"]},
            "spread": spread}
