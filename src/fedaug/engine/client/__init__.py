"""A client's work, wherever it runs: the worker (:mod:`~fedaug.engine.client.worker`), local training
(:mod:`~fedaug.engine.client.training`; grouped: :mod:`~fedaug.engine.client.grouped`; captured:
:mod:`~fedaug.engine.client.graphed`), evaluation, fine-tuning, the query and attacks. Nothing here imports a
fleet or the server: what crosses to them is :mod:`fedaug.engine.protocol`."""
