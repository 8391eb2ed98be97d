"""Training uploads judged against the round: each upload's update norm, and the screening of the
ones far larger than the round's median (docs/engine.md, "The trust boundary").

The magnitude bound (``trust.max_abs``) refuses values no model holds; an upload can stay under it
and still be a model no client can train from (every weight at 5e5: the average of one such
upload and two honest ones is ~1.7e5 per weight, and every client's next round blows up). What
gives such an upload away is its *update*, ``Delta_k = w_k - w``: the client's weights minus
what it received, over the floating entries of the server rule's part that the downlink sent
with the same name and shape (the model weights; never a SCAFFOLD control variate or FedNova's
``a_norm``, which have no counterpart). The server records ``||Delta_k||_2`` of every validated
upload, and with ``trust.screen`` set (default ``"reject"``) compares it with
``trust.screen_multiple`` times the round's median norm: the norm-bounding defence of Sun et al.
2019, "Can you really backdoor federated learning?" (arXiv:1911.07963, Sec. 4), with the bound
taken relative to the round instead of a fixed constant, so that it needs no tuning per model.

- ``"reject"``: an upload over the limit is rejected with its norm, the median and the limit (the
  round goes on with the others, like every rejected upload).
- ``"clip"``: it is scaled back to the round's median norm, ``w + Delta_k * median / ||Delta_k||``
  (the paper's norm bounding, with the typical honest norm as its bound), and aggregated: the
  outlier keeps the influence of a typical client. Clipping to the limit itself would let a
  persistent attacker push ``screen_multiple`` times harder than anyone else every round; on the
  tiny test federation that inflates the honest clients' next updates, hence the median and the
  limit, until the model is lost by round 3 (median norm 1.9 -> 2e7). Clipped to the median it
  stays bounded, but it still moves the model: ``"reject"`` is the default.
- ``"off"``: norms are recorded, nothing is screened.

The median is the *lower* median of the validated uploads' norms (the ``ceil(M/2)``-th smallest),
so a single attacker among two uploads is measured against the honest one. A server rule that
keeps no global model (FedProto) has no update to measure: nothing is recorded or screened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fedaug.config.schema import TrustConfig
from fedaug.core.errors import ConfigError, suggest
from fedaug.core.payload import distance
from fedaug.engine.server.exchange import PhaseResult
from fedaug.engine.protocol import METERS, Reply
from fedaug.methods.component import Component, State
from fedaug.methods.recipe import Recipe
from fedaug.privacy.clip import clip_update, update_entries


def update_norm(base: Component, server: State, client_id: int, reply: Reply,
                distances: Mapping[str, float] | None = None) -> float:
    """``||w_k - w||_2`` of one reply's part of the server rule ``base``, against the downlink ``base``
    sends that client in training, over the floating entries of equal name and shape
    (:func:`~fedaug.privacy.clip.update_entries`): each entry's distance (:func:`~fedaug.core.payload.distance`),
    combined in float64. The exchange measures the distances as it checks the reply's values (one pass over the
    upload, :class:`~fedaug.core.payload.Against`); an entry it did not measure is measured here.

    Args:
        base: the server rule (the component that owns the model weights).
        server: its server state (as it was when the round's messages were built).
        client_id: the client.
        reply: its validated training reply.
        distances: the entries' distances the exchange measured (``PhaseResult.distances``).
    """
    sent, part = base.downlink(server, client_id, "train"), reply.message[base.name]
    known = distances or {}
    squares = [(known[k] if k in known else distance(part[k], sent[k])) ** 2 for k in update_entries(part, sent)]
    return math.sqrt(sum(squares))


def update_norms(base: Component, server: State, replies: Mapping[int, Reply],
                 distances: Mapping[int, Mapping[str, Mapping[str, float]]] | None = None) -> dict[int, float]:
    """:func:`update_norm` of each reply, by ascending client id (with the exchange's ``distances``)."""
    return {cid: update_norm(base, server, cid, replies[cid], (distances or {}).get(cid, {}).get(base.name))
            for cid in sorted(replies)}


def lower_median(values: list[float]) -> float:
    """The ``ceil(M/2)``-th smallest of ``values`` (M >= 1): the median for odd M, the lower of the
    two middle values for even M.

    >>> lower_median([3.0, 1.0, 2.0]), lower_median([4.0, 1.0])
    (2.0, 1.0)
    """
    return sorted(values)[(len(values) - 1) // 2]


def screen_updates(trust: TrustConfig, base: Component, server: State, result: PhaseResult,
                   r: int) -> dict[str, Any] | None:
    """Record the update norm of every validated training reply in ``result`` and screen them as
    ``trust.screen`` says (module docstring); ``result`` is changed in place: a rejected reply moves
    from ``replies`` to ``rejected`` with its reason, a clipped one has its ``base`` part replaced
    by one whose update norm is the median.

    The norms come from the distances the exchange measured (``result.distances``), where it did.

    Returns:
        The round record's ``updates`` entry: ``norm`` (client id -> norm), ``median`` and, with
        screening on, ``limit``, and ``clipped`` (ids) when any was; ``None`` when ``base`` keeps no
        global model or no reply was valid.
    """
    if not base.keeps_global_model or not result.replies:
        return None
    norms = update_norms(base, server, result.replies, result.distances)
    median = lower_median(list(norms.values()))
    record: dict[str, Any] = {"norm": {str(cid): n for cid, n in norms.items()}, "median": median}
    if trust.screen == "off":
        return record
    limit = trust.screen_multiple * median
    record["limit"] = limit
    over = [cid for cid, n in norms.items() if n > limit]
    for cid in over:
        reply = result.replies[cid]
        if trust.screen == "reject":
            del result.replies[cid]
            result.rejected.append({"client": cid, "phase": "train", "reason": (
                f"round {r}: uplink of client {cid}, part '{base.name}': update norm {norms[cid]:.4g} is "
                f"{norms[cid] / median:.3g} times the round's median {median:.4g}, over "
                f"trust.screen_multiple={trust.screen_multiple:g} (limit {limit:.4g})")})
        else:
            sent = base.downlink(server, cid, "train")
            clipped = clip_update(reply.message[base.name], sent, median)[0]
            result.replies[cid] = replace(reply, message={**reply.message, base.name: clipped})
    if over and trust.screen == "clip":
        record["clipped"] = over
    return record


def check_trust(trust: TrustConfig, recipe: Recipe) -> None:
    """Refuse a ``trust.max_abs_parts`` entry that names no part of the method's messages (a bound
    that would bound nothing: a security setting that fails open).

    Raises:
        ConfigError: naming each such entry, the parts there are and the closest one.
    """
    parts = (*recipe.names, METERS)
    unknown = [name for name in trust.max_abs_parts if name not in parts]
    if unknown:
        raise ConfigError("; ".join(
            f"trust.max_abs_parts names '{name}', which is not a part of this method's messages, so it would bound "
            f"nothing; choose from {', '.join(parts)}{suggest(name, parts)}" for name in unknown))
