"""Where clients run: the :class:`~fedaug.engine.protocol.Fleet` protocol's implementations. In this process
(:mod:`~fedaug.engine.fleet.inprocess`), on worker processes of this machine
(:mod:`~fedaug.engine.fleet.processes`, through :mod:`~fedaug.engine.fleet.transport`), or on Flower's
SuperNodes (:class:`fedaug.engine.flower.server_app.FlowerFleet`, with the ``flower`` extra)."""

from fedaug.engine import _moved
from fedaug.engine.fleet.base import StatesHere

__all__ = ["StatesHere"]

#: the names the old module ``fedaug.engine.fleet`` had that now live in the protocol
__getattr__ = _moved.forward("fedaug.engine.fleet", {n: "fedaug.engine.protocol" for n in (
    "METERS", "RECORD_NAME", "Answer", "Dropped", "Fleet", "Malformed", "Reply")})
