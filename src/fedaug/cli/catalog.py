"""What ``fedaug list`` shows: every registered method, dataset and model with its options, and every
config key, as the validator reads them.

The options of a component or builder are :func:`fedaug.core.options.describe_options` of the
function :func:`fedaug.data.registry.check_options` validates against; the keys are
:func:`fedaug.config.schema.describe` of the schema the config is validated with. :func:`build`
collects them from the live registries (which imports torch and every method). The built-in part is
shipped as ``catalog.json`` next to this module, so that ``fedaug list`` answers without importing
torch; ``tests/cli/test_catalog.py`` keeps the file equal to :func:`build` (rewrite it with
``python -m fedaug.cli.catalog`` after changing a registration, a signature or an option's docstring).
With your own modules imported (``--import``, installed plugins) ``fedaug list`` builds it live.
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any

#: the shipped catalog of the built-in methods, datasets and models and the config keys
CATALOG = Path(__file__).with_name("catalog.json")
#: the registries the catalog describes
KINDS = ("methods", "datasets", "models")
#: a model builder's arguments that come from the dataset, not from ``[model.options]``
FROM_DATA = ("in_channels", "num_classes")


def _options(fn: Any, **kwargs: Any) -> dict[str, dict[str, Any]]:
    from fedaug.core.options import describe_options

    return {o.name: o.to_dict() for o in describe_options(fn, **kwargs)}


def _builtin(obj: Any) -> bool:
    return getattr(obj, "__module__", "").startswith("fedaug.")


def build(*, builtin_only: bool = False) -> dict[str, Any]:
    """The catalog from the registries: ``{"methods": {name: {"help", "role", "module", "options"}},
    "datasets": {...}, "models": {...}, "keys": {key: option}}``, each option as
    :meth:`fedaug.core.options.OptionInfo.to_dict`.

    Args:
        builtin_only: leave out what modules outside fedaug registered (what ``catalog.json`` holds).
    """
    from fedaug.config.schema import describe
    from fedaug.data.registry import COMMON_OPTIONS, DATASETS
    from fedaug.methods.recipe import METHODS
    from fedaug.models.registry import MODELS

    def keep(obj: Any) -> bool:
        return _builtin(obj) or not builtin_only

    methods = {}
    for name in METHODS:
        cls = METHODS.get(name)
        if keep(cls):
            methods[name] = {"help": METHODS.help(name), "role": cls.role, "module": cls.__module__,
                             "options": _options(cls.__init__, docs=cls.__mro__)}
    datasets = {name: {"help": DATASETS.help(name), "module": fn.__module__,
                       "options": _options(fn, extra=COMMON_OPTIONS)}
                for name in DATASETS if keep(fn := DATASETS.get(name))}
    models = {}
    for name in MODELS:
        fn = MODELS.get(name)
        if keep(fn):
            returns = typing.get_type_hints(fn).get("return")
            models[name] = {"help": MODELS.help(name), "module": fn.__module__,
                            "options": _options(fn, docs=[returns] if inspect.isclass(returns) else [],
                                                skip=FROM_DATA)}
    return {"methods": methods, "datasets": datasets, "models": models,
            "keys": {o.name: o.to_dict() for o in describe()}}


def load(live: bool = False) -> dict[str, Any]:
    """The catalog: the shipped ``catalog.json`` (nothing imported), or with ``live`` :func:`build`
    (everything registered in this process, your own modules too)."""
    return build() if live else json.loads(CATALOG.read_text())


def write(path: Path = CATALOG) -> Path:
    """Write the built-in catalog (:func:`build` with ``builtin_only``) to ``path``."""
    path.write_text(json.dumps(build(builtin_only=True), indent=1, ensure_ascii=False) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {write()}")
