"""Personalised evaluation (``eval.finetune_steps = k``): each evaluated client fine-tunes the global
model for ``k`` steps of the method's own local training, keeps nothing and sends nothing but its
meters, and is evaluated again (FL-bench's ``finetune_epoch``; TFF's personalisation evaluation).

The evaluation message then carries, beside the evaluation parts, every training component's
*training* downlink under ``finetune/<name>`` (:func:`finetune_senders`), so that fine-tuning
receives exactly what a training round would (the global weights, FedFA's statistics, FLea's
buffer, SCAFFOLD's controls). On the client (:func:`finetune_meters`) the method's one local loop
(:func:`~fedaug.engine.client.training.train_client`) runs ``k`` steps from the client's per-client state with
the learning rate of the evaluated round; its uplink and new state are dropped. The fine-tuned model
is then evaluated by :func:`~fedaug.engine.client.evaluate.evaluate_client` without the server rule
reloading the global weights (the other components receive their evaluation parts as usual, e.g.
FedRDN's statistics). Fine-tuning draws the random streams of the evaluated round's training
(seed, round, client, component, purpose), so it is as deterministic as the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fedaug.config.schema import RunConfig, learning_rate
from fedaug.core.payload import Message, Part, Spec, validate_part
from fedaug.data.base import ClientData
from fedaug.engine.client.evaluate import evaluate_client
from fedaug.engine.protocol import FINETUNE_PREFIX, FINETUNED, METERS, Reply
from fedaug.engine.client.training import train_client
from fedaug.methods.component import ClientCtx, State
from fedaug.methods.recipe import Recipe

def finetune_meters(recipe: Recipe, ctx: ClientCtx, client: ClientData, message: Message,
                    state: Mapping[str, State], cfg: RunConfig, down_specs: Mapping[str, Spec]) -> Part:
    """Fine-tune the global model on one client for ``cfg.eval.finetune_steps`` steps and evaluate it.

    Args:
        recipe: the method.
        ctx: the client's evaluation context (phase ``"evaluate"``), the worker model holding anything.
        client: the client's data, on ``ctx.device``.
        message: the evaluation message, with the ``finetune/<name>`` parts, on ``ctx.device``.
        state: the client's per-client state (read only: fine-tuning keeps nothing).
        cfg: the run configuration (local training options, the round's learning rate, precision).
        down_specs: ``{component name: spec}`` of the training downlink, checked before use.

    Returns:
        The fine-tuned model's meters (:func:`~fedaug.engine.protocol.meters_part` keys) under
        :data:`~fedaug.engine.client.evaluate.FINETUNED`.

    Raises:
        PayloadError: a ``finetune/<name>`` part is missing or fails its spec.
    """
    downlink = {}
    for name, spec in down_specs.items():
        part = message.get(FINETUNE_PREFIX + name)
        validate_part(part, spec, f"round {ctx.round}: fine-tuning downlink to client {ctx.client_id}, "
                                  f"part '{FINETUNE_PREFIX + name}'")
        downlink[name] = part
    train_ctx = dataclasses.replace(ctx, phase="train", data=client.train, lr=learning_rate(cfg.train, ctx.round),
                                    _streams={})  # fresh streams, as the round's training had
    steps = dataclasses.replace(cfg.train, local_steps=cfg.eval.finetune_steps, local_epochs=None)
    train_client(recipe, train_ctx, downlink, dict(state), steps, cfg.precision)
    evaluated = evaluate_client(recipe, ctx, client, message, state, cfg.eval.batch_size, cfg.precision,
                                load_global=False)
    return {FINETUNED + k: v for k, v in evaluated.message[METERS].items()}


def with_finetuned(reply: Reply, meters: Part) -> Reply:
    """``reply`` (an evaluation reply) with the fine-tuned meters added to its meters part."""
    return dataclasses.replace(reply, message={METERS: {**reply.message[METERS], **meters}})
