"""The privacy accountant: (eps, delta) of a run's Gaussian releases after t rounds (issue 20;
docs/privacy.md, "Differential privacy").

Built on Google's ``dp_accounting`` (the ``privacy`` extra, pinned to 0.6.0): maintained, no torch
dependency (Opacus would pull its own), and its closed forms are checked here against independent
computations (``tests/privacy/test_accountant.py``). Each :class:`~fedaug.privacy.release.GaussianRelease`
becomes a ``dp_accounting`` event:

* ``schedule="every_round"``: per round, the Gaussian mechanism with noise multiplier z on the
  clients the server sampled; a client's unit (the client, or one of its samples) takes part only
  when its client is sampled, which is accounted as **Poisson sampling with q = m / N**
  (``PoissonSampledDpEvent``), composed over the rounds so far. The engine samples exactly m = round(pN)
  clients without replacement (:func:`fedaug.engine.server.schedule.sample_clients`); Poisson with the
  same q is the usual approximation of that sampler (DP-FedAvg, McMahan et al. 2018), not an exact
  bound for it; with full participation (q = 1) there is no sampling and the bound is exact.
  Sample-level releases get no further amplification: FLea's shared subset is fixed per client,
  so a shared sample is released every round its client is sampled.
* ``schedule="once"``: one Gaussian mechanism per client (its first round), no amplification: each
  unit belongs to one client, so one event covers every unit whatever the rounds (counted from
  round 1, when the first clients release).

The total composes every release (RDP adds the Renyi curves, then converts with Canonne, Kamath and
Steinke 2020, Prop. 12; PLD composes privacy-loss distributions). Neighbouring relation: add/remove
one unit (:mod:`fedaug.privacy.mechanism`). A client-level release implies the same bound for any
one sample, so the total is stated per sample when any release is sample-level, per client otherwise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fedaug.core.errors import ConfigError, FedaugError
from fedaug.privacy.release import GaussianRelease

#: the accountants of ``[privacy] accountant``: Renyi DP (Mironov 2017) or privacy-loss distributions
#: (Koskela et al. 2020; Doroshenko et al. 2022), both from ``dp_accounting``.
ACCOUNTANTS = ("rdp", "pld")
SCHEDULES = ("every_round", "once")
#: the PLD accountant's discretisation of privacy losses (``dp_accounting``'s ``PLDAccountant`` default)
PLD_INTERVAL = 1e-4
#: what ``pip install`` needs for the accountant (pyproject's ``privacy`` extra)
REQUIREMENT = "dp-accounting==0.6.0"


def dp_accounting() -> Any:
    """The ``dp_accounting`` module, imported on first use.

    Raises:
        FedaugError: it is not installed; the message names the extra.
    """
    try:
        import dp_accounting as dpa
        from dp_accounting import pld, rdp  # noqa: F401  (submodules, imported for their accountants)
    except ImportError as exc:
        raise FedaugError(f"differential-privacy accounting needs Google's dp_accounting: pip install "
                          f"'fedaug[privacy]' ({REQUIREMENT})") from exc
    return dpa


class Releaser(Protocol):
    """What the accountant reads of a method component (:class:`~fedaug.methods.component.Component`)."""

    role: str
    releases: tuple[GaussianRelease, ...]


@dataclass(frozen=True)
class Accountant:
    """(eps, delta) of a set of Gaussian releases under client sampling, after t rounds.

    Args:
        releases: what the run's components declare (``Component.releases``); names need not be
            unique (equal names are composed into one entry).
        num_clients: N.
        clients_per_round: m, 1 <= m <= N (q = m / N).
        delta: the target delta, in (0, 1).
        method: ``"rdp"`` or ``"pld"``.
        model_protected: whether the server rule declares a release (DP-FedAvg's model update):
            only then do the model weights fall under the guarantee.

    Raises:
        ConfigError: a value out of range (each message names it).
        FedaugError: ``dp_accounting`` is not installed.

    >>> acc = Accountant((GaussianRelease("model update", 1.0, 1.0),), 10, 10, 1e-5)
    >>> round(acc.epsilon(1)[0], 1)
    4.7
    """

    releases: tuple[GaussianRelease, ...]
    num_clients: int
    clients_per_round: int
    delta: float
    method: str = "rdp"
    model_protected: bool = False
    _cache: dict[GaussianRelease, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 < self.delta < 1.0:
            problems.append(f"privacy.delta must be in (0, 1), got {self.delta!r}")
        if self.method not in ACCOUNTANTS:
            problems.append(f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)}, got {self.method!r}")
        if not 1 <= self.clients_per_round <= self.num_clients:
            problems.append(f"clients per round must be in 1..{self.num_clients}, got {self.clients_per_round}")
        for r in self.releases:
            if not (r.noise_multiplier >= 0 and math.isfinite(r.noise_multiplier)) or r.schedule not in SCHEDULES:
                problems.append(f"release '{r.what}': noise multiplier must be a finite number >= 0 and schedule one "
                                f"of {', '.join(SCHEDULES)}, got {r.noise_multiplier!r} and {r.schedule!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        dp_accounting()  # fail before training, not after round 1

    @property
    def sampling_probability(self) -> float:
        """q = m / N, the chance that a given client takes part in a round."""
        return self.clients_per_round / self.num_clients

    @property
    def unit(self) -> str:
        """``"client"`` if every release is client-level, else ``"sample"`` (the unit of the total)."""
        return "client" if all(r.unit == "client" for r in self.releases) else "sample"

    def round_event(self, release: GaussianRelease) -> Any:
        """The ``dp_accounting`` event of one release by one client: the Gaussian mechanism with noise
        multiplier z (``NonPrivateDpEvent`` for z = 0), Poisson-sampled with q for an every-round
        release when q < 1 (see the module docstring)."""
        dpa = dp_accounting()
        z = release.noise_multiplier
        gaussian = dpa.GaussianDpEvent(z) if z > 0 else dpa.NonPrivateDpEvent()
        q = self.sampling_probability
        if release.schedule == "once" or q == 1.0 or z == 0:
            return gaussian
        return dpa.PoissonSampledDpEvent(q, gaussian)

    @staticmethod
    def count(release: GaussianRelease, rounds: int) -> int:
        """How many times :meth:`round_event` composes after ``rounds`` rounds: ``rounds``, or 1 (once)."""
        return rounds if release.schedule == "every_round" else 1

    def _rdp_curve(self, release: GaussianRelease) -> Any:
        """The Renyi-DP curve ``(orders,)`` of one :meth:`round_event`, over ``dp_accounting``'s
        default orders; cached. Orders at which the library's series does not converge (small
        fractional ones at small q) are left out by it (inf) and its warning is silenced: the
        bound stays valid, only less tight."""
        if release not in self._cache:
            dpa = dp_accounting()
            acc = dpa.rdp.RdpAccountant()
            absl = logging.getLogger("absl")
            level = absl.level
            absl.setLevel(logging.ERROR)
            try:
                acc.compose(self.round_event(release))
            finally:
                absl.setLevel(level)
            self._cache[release] = (acc.orders, acc.rdp)
        return self._cache[release]

    def _pld(self, release: GaussianRelease) -> Any:
        """The privacy-loss distribution of one :meth:`round_event` (``None`` for z = 0); cached.
        Built as ``dp_accounting``'s ``PLDAccountant`` builds it (add/remove, its default grid)."""
        if release not in self._cache:
            dpa = dp_accounting()
            z = release.noise_multiplier
            q = 1.0 if release.schedule == "once" else self.sampling_probability
            self._cache[release] = None if z == 0 else dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=z, sampling_prob=q, value_discretization_interval=PLD_INTERVAL)
        return self._cache[release]

    def epsilon_of(self, releases: Sequence[GaussianRelease], rounds: int) -> float:
        """eps at :attr:`delta` of ``releases`` composed after ``rounds`` rounds (inf when one has z = 0).

        RDP: the curves add (``count`` times each), then ``dp_accounting``'s conversion (Canonne,
        Kamath and Steinke 2020, Prop. 12). PLD: the distributions compose (FFT)."""
        dpa = dp_accounting()
        if self.method == "rdp":
            orders = self._rdp_curve(releases[0])[0]
            total = sum(self.count(r, rounds) * self._rdp_curve(r)[1] for r in releases)
            return float(dpa.rdp.rdp_privacy_accountant.compute_epsilon(orders, total, self.delta)[0])
        plds = [self._pld(r) for r in releases]
        if any(p is None for p in plds):
            return math.inf
        composed = plds[0].self_compose(self.count(releases[0], rounds))
        for r, p in zip(releases[1:], plds[1:]):
            composed = composed.compose(p.self_compose(self.count(r, rounds)))
        return float(composed.get_epsilon_for_delta(self.delta))

    def epsilon(self, rounds: int) -> tuple[float, dict[str, float]]:
        """``(total eps, {release name: eps of that release alone})`` after ``rounds`` >= 1 rounds
        (releases of one name composed into one entry)."""
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        by_name: dict[str, list[GaussianRelease]] = {}
        for r in self.releases:
            by_name.setdefault(r.what, []).append(r)
        per = {what: self.epsilon_of(rs, rounds) for what, rs in by_name.items()}
        return self.epsilon_of(self.releases, rounds), per

    def record(self, rounds: int) -> dict[str, Any]:
        """The round record's ``privacy`` entry after ``rounds`` rounds::

            {"delta": δ, "epsilon": total ε so far, "releases": {what: ε}, "unit": "client" | "sample",
             "accountant": "rdp" | "pld", "sampling_probability": q, "model_protected": bool}
        """
        total, per = self.epsilon(rounds)
        return {"delta": self.delta, "epsilon": total, "releases": per, "unit": self.unit, "accountant": self.method,
                "sampling_probability": self.sampling_probability, "model_protected": self.model_protected}


def run_accountant(components: Sequence[Releaser], num_clients: int, clients_per_round: int, delta: float,
                   method: str) -> Accountant | None:
    """The accountant of a run whose method is ``components``; ``None`` when none declares a release
    (its records then carry no ``privacy`` entry)."""
    releases = tuple(r for c in components for r in c.releases)
    if not releases:
        return None
    protected = any(c.role == "server" and c.releases for c in components)
    return Accountant(releases, num_clients, clients_per_round, delta, method, protected)
