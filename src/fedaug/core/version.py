"""The package version, at the bottom layer so that any layer may name it (the Flower app writer,
``fedaug --version``); ``fedaug.__version__`` re-exports it. Keep it equal to pyproject.toml's.
Also what earlier versions read and this one no longer does, for the CLI's warnings (importing this
module imports nothing else)."""

__version__ = "0.1.0"
#: chose the FFA layers' path before their ``kernel`` option existed (``auto``: the kernel when it
#: built); no longer read (:mod:`fedaug.layers.kernel`), and ``fedaug`` warns when it is set.
RETIRED_ENV = "FEDAUG_FFA_KERNEL"
