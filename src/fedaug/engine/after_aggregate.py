"""The post-aggregation query: the round's clients answer with the NEW global model.

FLea (KDD 2024, Alg. 1 lines 14-18) has the clients that just trained receive the aggregated model
theta(t+1), compute something with it (their shared features) and upload it, within the same round.
This phase is generic: it runs only if some component overrides
:meth:`~fedaug.methods.component.Component.after_aggregate`, and it names no method.

Per client whose uplink was accepted this round, in whatever order the fleet runs them:

1. the server builds the base algorithm's downlink part from the new server state and counts it
   as downlink bytes; the client validates it as any downlink (:func:`answer_query`; the client
   "receives the new model");
2. the base's ``round_start`` loads it (and the client's own per-client state, e.g. local BatchNorm);
3. in eval mode and without gradients, every querying component's ``after_aggregate`` returns a
   part; the server counts it as uplink bytes and validates it against its
   ``after_aggregate_spec``; a bad part is rejected with its reason (the other clients go on);

then each querying component's ``after_aggregate_update`` folds the accepted parts, sorted by
client id, into its server state (:func:`query_phase`). Randomness comes from ``ctx.rng`` as
everywhere else, so the result does not depend on the execution order (invariant 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedaug.core.errors import PayloadError
from fedaug.core.payload import Part, Spec, part_nbytes, validate_part
from fedaug.core.rng import scoped_global_seed
from fedaug.data.base import Split
from fedaug.engine.fleet import Dropped, Fleet
from fedaug.methods.component import ClientCtx, Component, State, Uplink
from fedaug.methods.recipe import Recipe, overrides
from fedaug.metrics.tasks import Task


def queriers(recipe: Recipe) -> tuple[Component, ...]:
    """The recipe's components that override ``after_aggregate`` (empty: the phase is skipped)."""
    return tuple(c for c in recipe.components if overrides(c, "after_aggregate"))


@dataclass
class QueryResult:
    """Bytes per component and direction, the rejected parts and the dropped clients, with reasons."""

    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)


def query_phase(recipe: Recipe, server: dict[str, State], fleet: Fleet, r: int, client_ids: Sequence[int],
                num_samples: Sequence[int]) -> QueryResult:
    """The server side of the query: send the new base part, accept the answers, update ``server``.

    Args:
        recipe: the method; the phase runs for :func:`queriers` of it.
        server: ``{component name: server state}``, already aggregated for round ``r``; the
            queriers' entries are replaced by their ``after_aggregate_update``.
        fleet: reaches the clients.
        r: the round number.
        client_ids: the clients whose uplinks were accepted this round.
        num_samples: every client's number of training samples, by client id.

    Returns:
        Bytes of the re-sent base part (``down``) and of the queried parts (``up``), per component,
        the rejected parts and the clients that dropped out of this phase.
    """
    asking = queriers(recipe)
    base = recipe.base
    out = QueryResult(down={base.name: 0}, up={c.name: 0 for c in asking})
    parts: dict[str, dict[int, Part]] = {c.name: {} for c in asking}

    def downlink(cid: int) -> Part:
        part = base.downlink(server[base.name], cid)
        out.down[base.name] += part_nbytes(part)
        return part

    for cid, replies in fleet.query(r, sorted(client_ids), downlink):
        if isinstance(replies, Dropped):
            out.dropped.append(replies.record(cid, "after_aggregate"))
            continue
        for c in asking:
            reply = replies.get(c.name)
            out.up[c.name] += part_nbytes(reply) if isinstance(reply, Mapping) else 0
            try:
                parts[c.name][cid] = validate_part(
                    reply, c.after_aggregate_spec(server[c.name]),
                    f"round {r}: post-aggregation uplink of client {cid}, part '{c.name}'")
            except PayloadError as exc:
                out.rejected.append({"client": cid, "phase": "after_aggregate", "reason": str(exc)})
    for c in asking:
        ups = [Uplink(cid, num_samples[cid], parts[c.name][cid]) for cid in sorted(parts[c.name])]
        server[c.name] = c.after_aggregate_update(server[c.name], ups)
    return out


def answer_query(recipe: Recipe, model: torch.nn.Module, base_spec: Spec, client_id: int, r: int, seed: int,
                 data: Split, task: Task, part: Part, state: Mapping[str, State]) -> dict[str, object]:
    """The client side of the query: load the new global model, answer every querying component.

    Args:
        recipe: the method.
        model: the worker model (its weights are overwritten).
        base_spec: what the client accepts as the base's downlink part.
        client_id, r, seed: who, which round, the run's seed.
        data: the client's training split (``ctx.data``).
        task: the task (for ``ctx.task``).
        part: the base's downlink part built from the new server state.
        state: the client's per-client state after round ``r``'s training (read only).

    Returns:
        ``{querying component's name: its after_aggregate part}`` (validated by the server).

    Raises:
        PayloadError: ``part`` fails the client's check (a bad server message fails loudly,
            DESIGN.md invariant 3).
    """
    base = recipe.base
    validate_part(part, base_spec, f"round {r}: post-aggregation downlink to client {client_id}, part '{base.name}'")
    ctx = ClientCtx(model, client_id, r, seed, data, training=False, task=task)
    with scoped_global_seed(seed, "after_aggregate", r, client_id), torch.no_grad():
        base.round_start(ctx.view(base.name), part, state.get(base.name, {}))
        model.eval()
        return {c.name: c.after_aggregate(ctx.view(c.name), state.get(c.name, {})) for c in queriers(recipe)}
