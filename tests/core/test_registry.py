"""Registries: lookup, listing, errors with suggestions."""

from __future__ import annotations

import pytest

from fedaug.core.errors import ConfigError
from fedaug.core.registry import Registry


def make():
    reg: Registry[int] = Registry("widget")
    reg.register("alpha", "the first")(1)
    reg.register("beta", "the second")(2)
    return reg


def test_get_help_names():
    reg = make()
    assert reg.get("beta") == 2 and reg.help("alpha") == "the first"
    assert reg.names() == ["alpha", "beta"] and "alpha" in reg and list(reg) == ["alpha", "beta"]


def test_unknown_name_lists_choices_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown widget 'alpah'; choose from alpha, beta \(did you mean 'alpha'\?\)"):
        make().get("alpah")


def test_duplicate_and_uppercase_names_are_refused():
    reg = make()
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("alpha", "again")(3)
    with pytest.raises(ValueError, match="lowercase"):
        reg.register("Gamma", "x")
