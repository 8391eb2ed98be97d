"""The client side of the post-aggregation query: the round's clients answer with the NEW global state.

FLea (KDD 2024, Alg. 1 lines 14-18) has the clients that just trained receive the aggregated model
theta(t+1), compute something with it (their shared features) and upload it, within the same round.
The phase is generic: the server runs it when a component that takes part in ``"query"`` declares
a non-empty query uplink spec (:meth:`~fedaug.engine.server.loop.Server.run_round`), and it names no
method. On the client, every component that takes part receives its part (the server rule: the new
weights, loaded with the client's own per-client state, e.g. local BatchNorm), then, in eval mode and
without gradients, replies. Randomness comes from ``ctx.rng`` as everywhere else, so the result does
not depend on the execution order (invariant 1).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedaug.core.payload import Message
from fedaug.core.rng import scoped_global_seed
from fedaug.engine.protocol import Reply
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import Recipe


def answer_query(recipe: Recipe, ctx: ClientCtx, message: Message, state: Mapping[str, State]) -> Reply:
    """Load the new global state and answer every component that takes part in the query.

    Args:
        recipe: the method.
        ctx: the client's context, phase ``"query"`` (its model's weights are overwritten).
        message: ``{component name: part}`` of the query, already validated.
        state: the client's per-client state after this round's training (read only).

    Returns:
        ``{component name: its query part}``; the server validates them.
    """
    taking_part = recipe.participants("query")
    views = {c.name: ctx.view(c.name) for c in taking_part}
    with scoped_global_seed(ctx.seed, "after_aggregate", ctx.round, ctx.client_id), torch.no_grad():
        for c in taking_part:
            c.receive(views[c.name], message.get(c.name, {}), state.get(c.name, {}))
        ctx.model.eval()
        return Reply({c.name: c.reply(views[c.name])[0] for c in taking_part})
