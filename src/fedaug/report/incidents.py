"""What went wrong in a run, round by round: rejected replies and why, drop-outs, attacks, and
aggregates the server did not commit (docs/engine.md, "The trust boundary" and "Attack scenarios").

Read from the round records (``metrics.jsonl``): ``rejected``, ``dropped``, ``attack``,
``aggregate`` and the evaluation's ``rejected`` / ``dropped``. Only rounds with something to say
get a row, and consecutive rounds that say the same thing share one (``"3-20"``), so a 30-round
run with an attacker in every round stays one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fedaug.report.document import Table

#: the columns of one incident row, after the row's ``rounds``
COLUMNS = ("attack", "rejected", "dropped", "aggregate")
#: the longest reason shown per client (the records keep the whole text)
MAX_REASON = 120
#: the "round r: <what> of client k" that opens a rejection reason (the row already says both)
_WHERE = re.compile(r"^round \d+: (?:(?:uplink|post-aggregation uplink|evaluation reply) of client \d+(?:, |: ))?")


def _short(text: str) -> str:
    text = _WHERE.sub("", text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def _phase(entry: dict[str, Any], default: str) -> str:
    return str(entry.get("phase", default))


def round_incident(record: dict[str, Any]) -> dict[str, str]:
    """One round record's incidents as short texts by :data:`COLUMNS` (empty where none):
    ``attack``: ``"sign_flip by 1, 2"``; ``rejected`` / ``dropped``: ``"client (phase): reason"``
    joined by ``"; "``; ``aggregate``: ``"phase: kept previous (reason)"``."""
    ev = record.get("eval", {})
    rejected = [*record.get("rejected", []), *ev.get("rejected", [])]
    dropped = [*record.get("dropped", []), *ev.get("dropped", [])]
    attack = record.get("attack")
    return {
        "attack": f"{attack['kind']} by {', '.join(map(str, attack['clients']))}" if attack else "",
        "rejected": "; ".join(f"{x['client']} ({_phase(x, 'evaluate')}): {_short(str(x['reason']))}" for x in rejected),
        "dropped": "; ".join(f"{x['client']} ({_phase(x, 'evaluate')}): {x['reason']}"
                             + (f", {_short(str(x['detail']))}" if x.get("detail") else "") for x in dropped),
        "aggregate": "; ".join(f"{k['phase']}: kept {k['kept']} ({_short(str(k['reason']))})"
                               for k in record.get("aggregate", [])),
    }


def run_incidents(rounds: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Every round of a run with an incident, as ``{"rounds": "3" or "3-5", **round_incident}``;
    consecutive rounds with equal texts share one entry."""
    out: list[dict[str, str]] = []
    last = (None, -1)  # (texts, round) of the previous row
    for record in rounds:
        texts, r = round_incident(record), int(record["round"])
        if not any(texts.values()):
            continue
        if last[0] == texts and last[1] == r - 1:
            out[-1]["rounds"] = f"{out[-1]['rounds'].split('-')[0]}-{r}"
        else:
            out.append({"rounds": str(r), **texts})
        last = (texts, r)
    return out


def incidents_table(rows: Sequence[dict[str, str]], lead: Sequence[str] = ()) -> Table:
    """A document table of incident rows (:func:`run_incidents`, with any ``lead`` keys first,
    e.g. ``method`` and ``seed``); ``-`` in empty cells."""
    header = [*lead, "rounds", *COLUMNS]
    return Table(header, [[str(row.get(k, "")) or "-" for k in header] for row in rows])
