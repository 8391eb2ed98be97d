"""Engines: the server's round loop, the clients' work, the fleets that run clients, and the records a run leaves.

``server/`` (the round loop, the exchange, screening, sampling, evaluation summaries), ``client/`` (the
worker, training, evaluation, fine-tuning, the query, attacks), ``fleet/`` (where clients run: in this
process, in worker processes; Flower's fleet is :mod:`fedaug.engine.flower`), ``records/`` (run
directory, lock, tracking, progress), :mod:`~fedaug.engine.protocol` (the messages every side shares) and
:mod:`~fedaug.engine.run` (build, run and resume an experiment); docs/engine.md draws them.
"""

from fedaug.engine import _moved

_moved.install()

from fedaug.engine.run import Simulation, run_experiment  # noqa: E402  (after the old paths are importable)

__all__ = ["Simulation", "run_experiment"]
