"""Options recorded in every run: method options that change a run's numbers and are written into
its ``config.toml`` even at their default value, so that a run directory says how it ran.

A component class lists them in ``recorded_options`` (option name -> :class:`Recorded`), e.g. the
FFA layers' ``kernel`` (:class:`~fedaug.methods.aug.featstats.FeatureStatsAug`). A run's config
that lacks one was written before fedaug recorded it, and ran with :attr:`Recorded.legacy`. Where
that is a value no config can ask for (``kernel``: ``"auto"``, the compiled kernel whenever it
built), such a run is neither resumed (:func:`check_resume`) nor reused by ``fedaug compare
--reuse`` (:func:`fill_legacy`) on a path it may not have taken, until its ``config.toml`` says
which. Where it is a valid value the run certainly ran with (:attr:`Recorded.legacy_known`: VFDA's
``noise_scale``, ``"variance"`` until the default became ``"std"``), the run resumes with it and is
reused for cells that ask for it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedaug.config.schema import RunConfig
from fedaug.core.errors import ConfigError
from fedaug.methods.recipe import METHODS


@dataclass(frozen=True)
class Recorded:
    """One recorded option.

    Attributes:
        default: the value a config that does not set the option runs with.
        legacy: what a run recorded before the option existed ran with.
        legacy_help: what ``legacy`` meant and, unless ``legacy_known``, which value to write into
            such a run's config to continue or reuse it, in words.
        legacy_known: ``legacy`` is a valid value that every such run ran with (an option whose
            default changed), so the run resumes with it; ``False``: a value no config can ask for
            (what the run took is not known), so the user has to write it in.
    """

    default: Any
    legacy: Any
    legacy_help: str
    legacy_known: bool = False


def recorded_options(cfg: RunConfig) -> dict[tuple[str, str], Recorded]:
    """``(component, option) -> Recorded`` for every recorded option of the config's method.

    Raises:
        ConfigError: a component name is not registered.
    """
    found = {}
    for name in (cfg.method.base, *cfg.method.augs):
        for option, rec in getattr(METHODS.get(name), "recorded_options", {}).items():
            found[(name, option)] = rec
    return found


def _with(cfg: RunConfig, values: Mapping[tuple[str, str], Any]) -> RunConfig:
    out = copy.deepcopy(cfg)
    for (name, option), value in values.items():
        out.method.options.setdefault(name, {}).setdefault(option, value)
    return out


def pin(cfg: RunConfig) -> RunConfig:
    """A copy of ``cfg`` that sets every recorded option: its configured value, else its default
    (what a run directory's ``config.toml`` and checkpoints hold)."""
    return _with(cfg, {k: rec.default for k, rec in recorded_options(cfg).items()})


def fill_legacy(cfg: RunConfig) -> RunConfig:
    """A copy of a run directory's stored ``cfg`` where each recorded option it lacks is set to its
    :attr:`Recorded.legacy` value (what the run ran with, as far as can be known)."""
    return _with(cfg, {k: rec.legacy for k, rec in recorded_options(cfg).items()})


def legacy_notes(cfg: RunConfig) -> list[str]:
    """One sentence per recorded option that a run directory's stored ``cfg`` lacks and whose
    legacy value is not known (the user has to say what the run ran with)."""
    return [f"method.options.{name}.{option} is not recorded (the run predates it; it ran with "
            f"{option} = {rec.legacy!r}: {rec.legacy_help})"
            for (name, option), rec in recorded_options(cfg).items()
            if option not in cfg.method.options.get(name, {}) and not rec.legacy_known]


_MISSING = object()


def check_resume(cfg: RunConfig, checkpoint_config: dict[str, Any] | None, where: str) -> RunConfig:
    """The config to resume a run with: its stored ``cfg`` with every recorded option set.

    Args:
        cfg: the run directory's ``config.toml``.
        checkpoint_config: the ``"config"`` of the checkpoint to continue from (``None``: no
            checkpoint, the run starts again from round 1 and takes the defaults).
        where: the run directory, for messages.

    Returns:
        :func:`pin` of ``cfg``. Where the checkpoint predates the record and ``config.toml`` now
        states a value (the user wrote it in), ``checkpoint_config`` is updated to that value, so
        that the checkpoint's config check passes; where neither states one and the legacy value
        is known (:attr:`Recorded.legacy_known`), both take that value.

    Raises:
        ConfigError: a recorded option that the checkpoint and ``config.toml`` give different
            values (``config.toml`` edited), or that neither records (a run that predates the
            record); one message naming every such option, the values and the fix.
    """
    known: dict[tuple[str, str], Any] = {}
    if checkpoint_config is not None:
        problems = []
        ckpt_options = checkpoint_config.setdefault("method", {}).setdefault("options", {})
        for (name, option), rec in recorded_options(cfg).items():
            key = f"method.options.{name}.{option}"
            stored = cfg.method.options.get(name, {}).get(option, _MISSING)
            ran = ckpt_options.get(name, {}).get(option, _MISSING)
            if ran is _MISSING and stored is _MISSING and rec.legacy_known:
                ckpt_options.setdefault(name, {})[option] = known[(name, option)] = rec.legacy
            elif ran is _MISSING and stored is _MISSING:
                problems.append(
                    f"{key} is not recorded: the run was started before fedaug recorded it and ran with "
                    f"{option} = {rec.legacy!r} ({rec.legacy_help}); write the value it ran with into "
                    f"{where}/config.toml ([method.options.{name}] {option} = ...) and resume again, "
                    "or start the run anew")
            elif ran is _MISSING:
                ckpt_options.setdefault(name, {})[option] = stored  # the user says how it ran
            elif ran != (rec.default if stored is _MISSING else stored):
                now = rec.default if stored is _MISSING else stored
                problems.append(
                    f"{key}: the run's checkpoints were made with {ran!r} but its config.toml now gives "
                    f"{now!r}; a run continues on the path it started on: set {option} = {ran!r} "
                    f"under [method.options.{name}] in {where}/config.toml, or start a new run")
        if problems:
            raise ConfigError(f"cannot resume '{where}': " + "; ".join(problems))
    return pin(_with(cfg, known))
