"""The paper-scale variant of a stand-in grid (issue 60): the grid's cells at the paper's own rounds and local
epochs, on the same stand-in data, with five seeds, in a directory of its own (``fedaug compare GRID --scale
paper``; docs/compare_and_report.md, "Paper scale").

A stand-in grid trains fewer rounds than its paper (Digits-4's 30 x 1 against FedFA's 400 x 1); its verdicts
are taken at that scale. The variant ``GRID-paper-scale`` sets every cell's ``train.rounds`` and
``train.local_epochs`` to the paper's numbers, which the grid declares (``paper_rounds``,
``paper_local_epochs``), and unsets ``train.local_steps``; it is otherwise the grid. Where the paper trains its
datasets for different counts (FedFA: 400 rounds on Office-Caltech 10 and DomainNet, 500 on ProstateMRI) the
variant takes the largest, so that no stand-in trains for fewer rounds than the paper gives any of its datasets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from fedaug.core.errors import ConfigError
from fedaug.report.grid import GridSpec, check_cells

#: the scales ``fedaug compare --scale`` runs a grid at: as its file says, or at the paper's rounds and local epochs
SCALES = ("stand-in", "paper")
#: the seeds of a paper-scale variant unless ``--seeds`` says otherwise
PAPER_SEEDS = (0, 1, 2, 3, 4)
#: what a paper-scale variant's name adds to its grid's (its output directory: ``runs/compare/GRID-paper-scale``)
SUFFIX = "-paper-scale"
#: the config keys a paper-scale variant sets in every cell (``--set`` may not set them too)
SCALE_KEYS = ("train.rounds", "train.local_epochs", "train.local_steps")


def paper_counts(spec: GridSpec) -> tuple[int, int]:
    """The paper's rounds and local epochs that ``spec`` declares (:class:`~fedaug.report.grid.PaperScale`, the
    grid file's ``paper_rounds`` and ``paper_local_epochs``); where the paper trains its datasets for different
    counts, the largest (module docstring).

    Raises:
        ConfigError: the grid does not declare both as counts; the message names the grid and what it lacks.
    """
    paper = spec.paper
    declared = {"paper_rounds": paper.rounds if paper else None,
                "paper_local_epochs": paper.local_epochs if paper else None}
    missing = [f"{key} ({'not stated' if counts == () else 'absent'})" for key, counts in declared.items()
               if not counts]
    if missing:
        raise ConfigError(f"grid '{spec.name}' has no paper scale: it does not state the paper's "
                          f"{' and '.join(missing)}; --scale paper needs both as counts (paper_rounds = 400, "
                          "paper_local_epochs = 1 in the grid file), or run the grid at its own scale "
                          "(--scale stand-in)")
    return max(declared["paper_rounds"]), max(declared["paper_local_epochs"])


@dataclass(frozen=True)
class PaperScaleGrid(GridSpec):
    """A grid at the paper's scale (module docstring): every cell of the stand-in grid ``grid`` with
    ``train.rounds = rounds``, ``train.local_epochs = local_epochs`` and no ``train.local_steps``. Made by
    :func:`paper_scale`.

    Attributes:
        grid: the stand-in grid's name.
        rounds, local_epochs: the paper's.

    >>> g = PaperScaleGrid(name="g-paper-scale", methods={"FedAvg": {}}, seeds=[0], base="digits4", grid="g",
    ...                    rounds=400, local_epochs=1)
    >>> train = g.raw("default", "FedAvg", 0)["train"]
    >>> train["rounds"], train["local_epochs"], "local_steps" in train
    (400, 1, False)
    """

    grid: str = ""
    rounds: int = 1
    local_epochs: int = 1

    def raw(self, setting: str, method: str, seed: int) -> dict[str, Any]:
        """The cell's config (:meth:`GridSpec.raw`) at the paper's rounds and local epochs."""
        merged = super().raw(setting, method, seed)
        train = {k: v for k, v in merged.get("train", {}).items() if k != "local_steps"}
        merged["train"] = {**train, "rounds": self.rounds, "local_epochs": self.local_epochs}
        return merged

    def meta(self) -> dict[str, Any]:
        """:meth:`GridSpec.meta` and the scale: ``{"scale": "paper", "grid", "rounds", "local_epochs"}``."""
        return {**super().meta(), "scale": {"scale": "paper", "grid": self.grid, "rounds": self.rounds,
                                            "local_epochs": self.local_epochs}}


def paper_scale(spec: GridSpec, seeds: Sequence[int] = PAPER_SEEDS) -> PaperScaleGrid:
    """The paper-scale variant of ``spec`` (module docstring), named ``<grid>-paper-scale``, with ``seeds``.

    Raises:
        ConfigError: the grid states no paper scale (:func:`paper_counts`), its ``--set`` overrides set a key
            the scale sets (:data:`SCALE_KEYS`), or a cell's config is invalid at that scale.
    """
    rounds, local_epochs = paper_counts(spec)
    clashes = [o for o in spec.overrides if o.partition("=")[0].strip() in SCALE_KEYS]
    if clashes:
        raise ConfigError(f"--scale paper sets {' and '.join(SCALE_KEYS[:2])} to the paper's ({rounds} x "
                          f"{local_epochs}) and unsets {SCALE_KEYS[2]}; drop --set {' '.join(clashes)}, or run the "
                          "grid at its own scale (--scale stand-in)")
    scale = f"at the paper's scale: {rounds} rounds x {local_epochs} local epoch{'s' * (local_epochs != 1)}"
    own = {f.name: getattr(spec, f.name) for f in fields(GridSpec)}
    own.update(name=spec.name + SUFFIX, seeds=list(seeds),
               description=f"{spec.description} ({scale})" if spec.description else scale.capitalize())
    variant = PaperScaleGrid(**own, grid=spec.name, rounds=rounds, local_epochs=local_epochs)
    check_cells(variant)
    return variant


def at_scale(spec: GridSpec, scale: str, seeds: Sequence[int] | None = None) -> GridSpec:
    """``spec`` at ``scale`` (:data:`SCALES`): itself, or its :func:`paper_scale` variant with ``seeds`` (default
    :data:`PAPER_SEEDS`)."""
    if scale == "paper":
        return paper_scale(spec, seeds or PAPER_SEEDS)
    if scale == "stand-in":
        return spec
    raise ConfigError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
