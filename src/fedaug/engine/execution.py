"""Which execution a run's clients get (issue 63): what ``train.cuda_graph`` resolves to on this machine, the name a
run's records give the execution that ran, and how a comparison of configs sees the two keys whose default is
``"auto"`` (docs/engine.md, "Which execution runs").

``train.cuda_graph`` counts in a comparison as the execution it resolves to, captured or eager steps: ``true``
captures, ``false`` does not, and ``"auto"`` captures where the run's clients compute on CUDA and nothing blocks a
capture (:func:`~fedaug.engine.client.graphed.capture_blockers`), so that wherever the clients compute on a CPU,
``"auto"`` and ``false`` are one experiment. ``data.on_device`` is placement: where the data waits between rounds
changes no number. A stored config that lacks either key predates it and ran with ``false``
(:func:`~fedaug.config.schema.with_legacy`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedaug.config.schema import RunConfig
from fedaug.engine.client.graphed import capture_blockers
from fedaug.engine.fleet.ray import actor_device
from fedaug.methods.recipe import Recipe, build_recipe
from fedaug.models.registry import build_model


def step_parts(cfg: RunConfig) -> tuple[Recipe, nn.Module]:
    """``cfg``'s method and a model of it, as far as the shape of a client's step needs them: the model is built for
    3 input channels and 10 classes (what the step's checks read of it, the kinds of its layers, does not depend on
    them).

    Raises:
        FedaugError: the method or the model cannot be built.
    """
    recipe = build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
    return recipe, build_model(cfg.model.name, 3, 10, **cfg.model.options)


def on_cuda(cfg: RunConfig) -> bool:
    """Whether ``cfg``'s clients compute on a CUDA device of this machine: on their workers' devices (``devices``
    with worker processes, else ``device``; a Ray actor's GPU where it reserves one), ``"auto"`` being CUDA where this
    machine has it."""
    if cfg.fleet == "ray":
        names = [actor_device(cfg)]
    else:
        names = (cfg.devices if cfg.workers > 1 else []) or [cfg.device]
    return any(n.startswith("cuda") or n == "auto" and torch.cuda.is_available() for n in names)


def captures(cfg: RunConfig, parts: tuple[Recipe, nn.Module] | None = None) -> bool:
    """Whether ``cfg``'s clients train from captured graphs on this machine: with ``train.cuda_graph = true``; with
    ``"auto"`` where they compute on CUDA (:func:`on_cuda`) and :func:`capture_blockers` finds nothing for the method
    and model (``parts``, built from ``cfg`` where not given: :func:`step_parts`); never with ``false``. A step that
    is refused when it is first captured, which only a run finds, trains eagerly under ``"auto"`` all the same (its
    record says so: :func:`execution_name`).

    Raises:
        FedaugError: ``"auto"`` on CUDA, and the method or the model cannot be built.
    """
    mode = cfg.train.cuda_graph
    if mode is True or mode is False:
        return mode
    if not on_cuda(cfg):
        return False
    recipe, model = parts or step_parts(cfg)
    return not capture_blockers(recipe, model, cfg.precision)


def execution_name(*, packed: bool, grouped: bool, captured: bool) -> str:
    """The name a run's records give the execution of its clients' steps (the summary's ``environment``): ``"eager"``,
    ``"grouped"``, ``"captured"`` or ``"grouped captured"``, and in a pack (whose steps are grouped) ``"packed"`` or
    ``"packed captured"``.

    >>> execution_name(packed=False, grouped=True, captured=True)
    'grouped captured'
    >>> execution_name(packed=True, grouped=True, captured=False)
    'packed'
    """
    words = ["packed"] if packed else ["grouped"] if grouped else []
    return " ".join(words + (["captured"] if captured else [])) or "eager"


def compared(cfg: RunConfig) -> dict[str, Any]:
    """The two keys whose default is ``"auto"`` as a comparison of configs sees them (module docstring), dotted, to
    update a flattened config with: ``train.cuda_graph`` the execution it resolves to here (:func:`captures`: a
    boolean, so that a key computed before the default changed stays the same), ``data.on_device`` ``false``
    whatever the config says (placement; ``false`` is what every run recorded before ``"auto"``).

    Raises:
        FedaugError: as :func:`captures`.
    """
    return {"train.cuda_graph": captures(cfg), "data.on_device": False}
