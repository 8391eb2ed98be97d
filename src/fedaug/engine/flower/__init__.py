"""fedaug on Flower (the ``flower`` extra): the same methods, round loop and numbers across real sites.

- :mod:`~fedaug.engine.flower.server_app`: the ServerApp (fedaug's server side over Flower's Grid);
- :mod:`~fedaug.engine.flower.client_app`: the ClientApp (fedaug's client side on a SuperNode);
- :mod:`~fedaug.engine.flower.inprocess`: Flower's message path in one process (no Ray, no network);
- :mod:`~fedaug.engine.flower.simulation`: Flower's simulation runtime (Ray, fedaug's ``ray`` extra);
- :mod:`~fedaug.engine.flower.app`: a ready Flower app directory for a fedaug config;
- :mod:`~fedaug.engine.flower.local`: the SuperLink/SuperNode/``flwr run`` commands of a loopback trial.

Importing this package turns Flower's telemetry off unless ``FLWR_TELEMETRY_ENABLED`` is set, and
fails with the install line when Flower is missing. See docs/flower.md.
"""

from __future__ import annotations

import importlib.util
import os

from fedaug.core.errors import FedaugError

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

#: the Flower versions fedaug is tested with (pyproject's ``flower`` extra)
FLWR_REQUIREMENT = "flwr>=1.41,<1.43"

if importlib.util.find_spec("flwr") is None:
    raise FedaugError(f"fedaug's Flower adapter needs Flower: pip install 'fedaug[flower]' ({FLWR_REQUIREMENT})")
