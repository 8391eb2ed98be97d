"""The post-aggregation query: the round's clients answer with the NEW global model.

FLea (KDD 2024, Alg. 1 lines 14-18) has the clients that just trained receive the aggregated model
theta(t+1), compute something with it (their shared features) and upload it, within the same round.
This phase is generic: it runs only if some component overrides
:meth:`~fedaug.methods.component.Component.after_aggregate`, and it names no method.

Per client whose uplink was accepted this round, in the engine's execution order:

1. the base algorithm's downlink part is built from the new server state, counted as downlink
   bytes and validated as any downlink (the client "receives the new model");
2. the base's ``round_start`` loads it (and the client's own per-client state, e.g. local BatchNorm);
3. in eval mode and without gradients, every querying component's ``after_aggregate`` returns a
   part, counted as uplink bytes and validated against its ``after_aggregate_spec``; a bad part
   is rejected with its reason (the other clients go on);

then each querying component's ``after_aggregate_update`` folds the accepted parts, sorted by
client id, into its server state. Randomness comes from ``ctx.rng`` as everywhere else, so the
result does not depend on the execution order (invariant 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedaug.core.errors import PayloadError
from fedaug.core.payload import Part, Spec, part_nbytes, validate_part
from fedaug.core.rng import scoped_global_seed
from fedaug.data.base import FederatedData
from fedaug.methods.component import ClientCtx, Component, State, Uplink
from fedaug.methods.recipe import Recipe, overrides
from fedaug.metrics.tasks import Task


def queriers(recipe: Recipe) -> tuple[Component, ...]:
    """The recipe's components that override ``after_aggregate`` (empty: the phase is skipped)."""
    return tuple(c for c in recipe.components if overrides(c, "after_aggregate"))


@dataclass
class QueryResult:
    """Bytes per component and direction, and the rejected parts with their reasons."""

    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)


def query_clients(
    recipe: Recipe, model: torch.nn.Module, server: dict[str, State], client_states: dict[int, dict[str, State]],
    data: FederatedData, task: Task, seed: int, r: int, client_ids: Sequence[int], base_spec: Spec,
    order: Callable[[list[int]], list[int]],
) -> QueryResult:
    """Run the post-aggregation query on ``client_ids``; update ``server`` in place.

    Args:
        recipe: the method; the phase runs for :func:`queriers` of it.
        model: the worker model (its weights are overwritten).
        server: ``{component name: server state}``, already aggregated for round ``r``; the
            queriers' entries are replaced by their ``after_aggregate_update``.
        client_states: per-client states after round ``r``'s training (read only).
        data: the federation (each client's training split is its ``ctx.data``).
        task: the task (for ``ctx.task``).
        seed: the run's seed.
        r: the round number.
        client_ids: the clients whose uplinks were accepted this round.
        base_spec: what the client accepts as the base's downlink part.
        order: the engine's execution order (the result does not depend on it).

    Returns:
        Bytes of the re-sent base part (``down``) and of the queried parts (``up``), per component,
        and the rejected parts.

    Raises:
        PayloadError: the server's base part fails the client's check (a bad server message fails
            loudly, DESIGN.md invariant 3).
    """
    asking = queriers(recipe)
    base = recipe.base
    out = QueryResult(down={base.name: 0}, up={c.name: 0 for c in asking})
    parts: dict[str, dict[int, Part]] = {c.name: {} for c in asking}
    for cid in order(sorted(client_ids)):
        part = base.downlink(server[base.name], cid)
        out.down[base.name] += part_nbytes(part)
        validate_part(part, base_spec, f"round {r}: post-aggregation downlink to client {cid}, part '{base.name}'")
        ctx = ClientCtx(model, cid, r, seed, data.clients[cid].train, training=False, task=task)
        state = client_states.get(cid, {})
        with scoped_global_seed(seed, "after_aggregate", r, cid), torch.no_grad():
            base.round_start(ctx.view(base.name), part, state.get(base.name, {}))
            model.eval()
            for c in asking:
                reply = c.after_aggregate(ctx.view(c.name), state.get(c.name, {}))
                out.up[c.name] += part_nbytes(reply) if isinstance(reply, dict) else 0
                try:
                    parts[c.name][cid] = validate_part(
                        reply, c.after_aggregate_spec(server[c.name]),
                        f"round {r}: post-aggregation uplink of client {cid}, part '{c.name}'")
                except PayloadError as exc:
                    out.rejected.append({"client": cid, "phase": "after_aggregate", "reason": str(exc)})
    for c in asking:
        ups = [Uplink(cid, len(data.clients[cid].train), parts[c.name][cid]) for cid in sorted(parts[c.name])]
        server[c.name] = c.after_aggregate_update(server[c.name], ups)
    return out
