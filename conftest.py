"""Collection rules for the whole repository (``testpaths`` covers ``tests`` and ``src/fedaug``)."""

from __future__ import annotations

import importlib.util

# The Flower adapter's modules import Flower (the ``flower`` extra, which ``make test`` installs);
# without it their doctests cannot be imported, and its tests skip themselves, saying why.
collect_ignore_glob = [] if importlib.util.find_spec("flwr") else ["src/fedaug/engine/flower/*"]
