"""What a component releases under a Gaussian mechanism: the declaration the privacy accountant
reads (issue 20; docs/privacy.md).

A component whose options turn on differential privacy (DP-FedAvg's update noise, the clipped and
noised statistics, features or mean images an augmentation shares) lists one
:class:`GaussianRelease` per artefact in its :attr:`~fedaug.methods.component.Component.releases`;
the accountant composes them over the run's rounds and client sampling. A component with no
release shares nothing under a formal guarantee (its ``share_noise`` options, if any, are
perturbations with no sensitivity bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: when a client releases the artefact: each round it is sampled in, or once (its first round).
Schedule = Literal["every_round", "once"]
#: the neighbouring relation the sensitivity is stated for: one client's whole data, or one sample.
Unit = Literal["client", "sample"]


@dataclass(frozen=True)
class GaussianRelease:
    """One artefact released through the Gaussian mechanism ``f(D) + N(0, (z * Delta)^2 I)``.

    Args:
        what: the artefact, as the records and report name it (e.g. ``"model update"``).
        noise_multiplier: ``z = sigma / Delta`` (> 0).
        sensitivity: the L2 sensitivity ``Delta`` the clipping guarantees, for one ``unit``.
        schedule: ``"every_round"`` or ``"once"``.
        unit: ``"client"`` (client-level DP) or ``"sample"`` (sample-level DP).
    """

    what: str
    noise_multiplier: float
    sensitivity: float
    schedule: Schedule = "every_round"
    unit: Unit = "client"
