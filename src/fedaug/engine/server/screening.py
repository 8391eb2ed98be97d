"""Training uploads judged against the round: each upload's update norm per kind of tensor, and the
screening of the ones far larger than the round's (docs/engine.md, "The trust boundary").

The magnitude bound (``trust.max_abs``) refuses values no model holds; an upload can stay under it
and still be a model no client can train from (every weight at 5e5: the average of one such
upload and two honest ones is ~1.7e5 per weight, and every client's next round blows up). What
gives such an upload away is its *update*. For every floating entry of every part of a validated
training upload the server measures ``||t_k - t||_2``, ``t`` the entry of the same name and shape it
sent that client (the model weights), or ``||t_k||_2`` where it sent none (a tensor the client computed:
SCAFFOLD's control-variate change, FedNova's ``a_i``, an augmentation's statistics), in the pass that
checks the upload's values (:class:`~fedaug.core.payload.Against`). The entries are grouped by part and
by the *kind* their spec declares (:data:`~fedaug.core.payload.KINDS`: the model's trained parameters,
its normalisation statistics, control quantities, shared statistics), and each group's norm
``n_g(k) = sqrt(sum of its entries' squared distances)`` is judged against the same group of the
round's other uploads only: BatchNorm's running statistics, which a boosting attacker leaves as
trained, no longer hide a boosted parameter update (issue 48). Rows of data and sample counts
(kind ``"data"``: FLea's features, FedMix's pools, class counts) grow with a client's data and are
not sized against the round.

The rule, for the M validated uploads of a round (the norm bounding of Sun et al. 2019, "Can you
really backdoor federated learning?", arXiv:1911.07963, Sec. 4, with the bound taken relative to the
round instead of a fixed constant, so that it needs no tuning per model):

- each group's *median* ``m_g`` is the upper median of its M norms (:func:`upper_median`, the
  ``(floor(M/2) + 1)``-th smallest) and its limit ``L_g = trust.screen_multiple * m_g``; a group whose
  median is 0 (most of the round sent that kind back unchanged: free-riders) has no limit, since no
  multiple of 0 sizes anything;
- an upload is *over* where some group's norm exceeds that group's limit. One group alone puts
  fewer than half of the round over (at least ``floor(M/2) + 1`` norms are ``<= m_g < L_g``); over
  several groups, where the uploads over some limit are not fewer than half of the round, the screen
  cannot tell outliers from the rest and screens nothing (the record names them: ``undecided``);
- otherwise each upload over is screened as ``trust.screen`` says.

What it decides, for any M: an upload is screened only when more than half of the round is within
every limit that it exceeds. If more than half of the uploads are honest and the honest norms of each
group lie within a factor ``screen_multiple`` of each other, the median of each group lies between the
smallest and the largest honest norm, so no honest upload is ever screened, whatever the minority
sends (zeros, tiny or huge updates, ties), and every upload that passes has, in each group, at most
``screen_multiple`` times the largest honest norm: the attacker's power in a round is bounded by the
honest clients', per kind. What it cannot decide: with one upload there is nothing to compare (its
median is its own norm); with two, which of two norms is the wrong one (the median is the larger:
nothing is screened, the magnitude bound and a robust rule are the defence there); a majority of
attackers (the median is then theirs); a round whose median is 0; and what is not large (a
sign-flipped or x3 update, label flips: a robust rule's job, docs/robustness.md).

Measured (docs/robustness.md, "Free-riders, boosted and small updates under the screening"; 3 seeds of
tiny synthetic federations): no honest upload screened, of 1,368 per setting of the screening, beside
free-riders, majorities of free-riders, x3, x10 and x0.05 updates. Honest norms reach at most 1.9 times
their kind's median (Fashion-MNIST Dir(0.1), clients of very different sizes, one local epoch), so the
default multiple of 10 lets an attacker push, per kind, up to 10 times the largest honest update: a
parameter update boosted x10 measures ``10 ||Delta_k|| / m_g`` and is rejected only in the rounds where
its own update is above the median (14 and 9 of 24 on 3 and 8 clients); ``screen_multiple = 5`` rejects
it in all 48, still without an honest upload.

- ``"reject"`` (default): an upload over is rejected with, per group over, its norm, the median and
  the limit (the round goes on with the others, like every rejected upload).
- ``"clip"``: each group over is scaled back to the group's median, ``t + Delta_g * m_g / n_g``
  (the paper's norm bounding, with the typical honest norm as its bound), and aggregated: the
  outlier keeps the influence of a typical client. Clipping to the limit itself would let a
  persistent attacker push ``screen_multiple`` times harder than anyone else every round; on the
  tiny test federation that inflates the honest clients' next updates, hence the median and the
  limit, until the model is lost by round 3 (median norm 1.9 -> 2e7). Clipped to the median it
  stays bounded, but it still moves the model: ``"reject"`` is the default.
- ``"off"``: norms are recorded, nothing is screened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fedaug.config.schema import TrustConfig
from fedaug.core.errors import ConfigError, suggest
from fedaug.core.payload import KINDS, Spec, counterpart, distance
from fedaug.engine.server.exchange import PhaseResult
from fedaug.engine.protocol import METERS, Rejected
from fedaug.methods.component import Component, State
from fedaug.methods.recipe import Recipe
from fedaug.privacy.clip import clip_update

#: the kinds sized against the round: all but ``"data"`` (rows and counts grow with a client's data)
SCREENED = tuple(kind for kind in KINDS if kind != "data")
#: Norms = part name -> kind -> client id -> ``||Delta||_2`` of that group of the client's upload
Norms = dict[str, dict[str, dict[int, float]]]


def screened_entries(specs: Mapping[str, Spec]) -> dict[str, dict[str, set[str]]]:
    """Part name -> kind -> the names of its floating entries of that kind, for the kinds in
    :data:`SCREENED` (kinds in :data:`~fedaug.core.payload.KINDS` order)."""
    out: dict[str, dict[str, set[str]]] = {}
    for part, spec in specs.items():
        for kind in SCREENED:
            names = {n for n, s in spec.items() if s.kind == kind and s.dtype.is_floating_point}
            if names:
                out.setdefault(part, {})[kind] = names
    return out


def update_norms(result: PhaseResult, components: Sequence[Component], server: Mapping[str, State]) -> Norms:
    """Each validated training reply's update norm per part and kind (:func:`screened_entries` of
    ``result.specs``): the square root of the sum, in float64 and in the part's order, of its entries'
    squared distances to what the server sent (:func:`~fedaug.core.payload.distance`; the entry's own norm
    where it sent no counterpart). The exchange measured the distances of the float32/float64 entries
    as it checked the reply's values (``result.distances``); another entry is measured here, against
    the downlink ``components`` send that client in training.

    Args:
        result: the training phase's outcome (replies, their distances and the specs they met).
        components: the components that took part (by name: the parts).
        server: their server states, as they were when the round's messages were built.

    Returns:
        Part name -> kind -> client id (ascending) -> norm; a client whose entries of a group are all
        empty has norm 0 there.
    """
    entries = screened_entries(result.specs)
    by_name = {c.name: c for c in components}
    out: Norms = {part: {kind: {} for kind in kinds} for part, kinds in entries.items()}
    kind_of = {part: {name: kind for kind, names in reversed(kinds.items()) for name in names}  # (the first kind wins)
               for part, kinds in entries.items()}
    for cid in sorted(result.replies):
        for part, kinds in entries.items():
            values, known = result.replies[cid].message.get(part, {}), result.distances.get(cid, {}).get(part, {})
            sent: dict[str, Any] | None = None
            squares: dict[str, list[float]] = {kind: [] for kind in kinds}
            for name, t in values.items():
                kind = kind_of[part].get(name)
                if kind is None or not t.numel():
                    continue
                if name in known:
                    d = known[name]
                else:
                    sent = by_name[part].downlink(server[part], cid, "train") if sent is None else sent
                    r = sent.get(name)
                    d = distance(t, r if counterpart(t, r) else None)
                squares[kind].append(d * d)
            for kind, sq in squares.items():
                out[part][kind][cid] = math.sqrt(sum(sq))
    return out


def upper_median(values: Sequence[float]) -> float:
    """The ``(floor(M/2) + 1)``-th smallest of ``values`` (M >= 1, none NaN): the median for odd M, the
    upper of the two middle values for even M. More than half of the values are at most it, so fewer
    than half exceed any multiple >= 1 of it.

    >>> upper_median([3.0, 1.0, 2.0]), upper_median([4.0, 1.0]), upper_median([0.0, 0.0, 5.0])
    (2.0, 4.0, 0.0)
    """
    return sorted(values)[len(values) // 2]


def limit_of(median: float, multiple: float) -> float | None:
    """The screening limit of a group whose median is ``median``: ``multiple * median``, or ``None``
    (no limit) where the median is 0."""
    return multiple * median if median > 0 else None


def screen_updates(trust: TrustConfig, components: Sequence[Component], server: Mapping[str, State],
                   result: PhaseResult, r: int) -> dict[str, Any] | None:
    """Record the update norms of every validated training reply in ``result`` (:func:`update_norms`)
    and screen them as ``trust.screen`` says (module docstring); ``result`` is changed in place: a
    rejected reply moves from ``replies`` to ``rejected`` with its reason, a clipped one has the groups
    over their limits scaled back to the groups' medians.

    Returns:
        The round record's ``updates`` entry: ``norm`` (part -> kind -> client id -> norm), ``median``
        (part -> kind -> median) and, with screening on, ``limit`` (part -> kind -> limit, ``None``
        where the median is 0), ``clipped`` (ids) when any was, ``undecided`` (ids) when the uploads over
        a limit were not fewer than half of the round; ``None`` when no reply was valid or no part has
        an entry the screening sizes.
    """
    if not result.replies:
        return None
    norms = update_norms(result, components, server)
    if not norms:
        return None
    medians = {part: {kind: upper_median(list(n.values())) for kind, n in kinds.items()} for part, kinds in norms.items()}
    record: dict[str, Any] = {"norm": {part: {kind: {str(cid): v for cid, v in n.items()} for kind, n in kinds.items()}
                                       for part, kinds in norms.items()}, "median": medians}
    if trust.screen == "off":
        return record
    limits = {part: {kind: limit_of(m, trust.screen_multiple) for kind, m in kinds.items()}
              for part, kinds in medians.items()}
    record["limit"] = limits
    over: dict[int, list[tuple[str, str]]] = {}
    for part, kinds in norms.items():
        for kind, n in kinds.items():
            limit = limits[part][kind]
            for cid, v in n.items():
                if limit is not None and v > limit:
                    over.setdefault(cid, []).append((part, kind))
    if not over:
        return record
    if 2 * len(over) >= len(result.replies):
        record["undecided"] = sorted(over)
        return record
    by_name = {c.name: c for c in components}
    entries = screened_entries(result.specs)
    for cid in sorted(over):
        reply = result.replies[cid]
        if trust.screen == "reject":
            del result.replies[cid]
            result.rejected.append(Rejected(f"round {r}: uplink of client {cid}, " + "; ".join(
                f"part '{part}', {kind}: update norm {norms[part][kind][cid]:.4g} is "
                f"{norms[part][kind][cid] / medians[part][kind]:.3g} times the round's median {medians[part][kind]:.4g}, "
                f"over trust.screen_multiple={trust.screen_multiple:g} (limit {limits[part][kind]:.4g})"
                for part, kind in over[cid])).record(cid, "train"))
        else:
            message = dict(reply.message)
            for part, kind in over[cid]:
                keys = [k for k, t in message[part].items() if k in entries[part][kind] and t.numel()]
                sent = by_name[part].downlink(server[part], cid, "train")
                message[part] = clip_update(message[part], sent, medians[part][kind], keys)[0]
            result.replies[cid] = replace(reply, message=message)
    if trust.screen == "clip":
        record["clipped"] = sorted(over)
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
