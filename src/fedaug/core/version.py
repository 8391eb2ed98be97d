"""The package version, at the bottom layer so that any layer may name it (the Flower app writer,
``fedaug --version``); ``fedaug.__version__`` re-exports it. Keep it equal to pyproject.toml's."""

__version__ = "0.1.0"
