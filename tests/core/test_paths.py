"""Options that name paths: the declaration (``LocalPath``, ``PathOption``) and making a value absolute."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import pytest

from fedaug.core.options import describe_options
from fedaug.core.paths import LocalPath, PathOption, absolute, absolute_uri, make_absolute, path_option, path_options


def builder(*, seed: int, root: LocalPath | None = None, split: Annotated[str, PathOption(within="root")] | None = None,
            name: str = "x", size: int = 8) -> None:
    """A builder with two path options.

    Args:
        root: the data.
        split: a file in it.
        name: not a path.
        size: not a path.
    """


def test_path_options_are_found_by_annotation_in_unions_and_nowhere_else():
    assert path_options(builder) == {"root": PathOption(), "split": PathOption(within="root")}
    assert path_option(LocalPath) == PathOption() and path_option(str | None) is None and path_option(int) is None
    assert {o.name: o.type for o in describe_options(builder)} == {"root": "path", "split": "path", "name": "str",
                                                                   "size": "int"}


@pytest.mark.parametrize("given, root, want", [
    ("imgs", "/exp", "/exp/imgs"),                     # relative: from root
    ("./a/../imgs", "/exp", "/exp/imgs"),              # normalised
    ("/srv/data", "/exp", "/srv/data"),                # absolute: as written
    ("~/data", "/exp", os.path.expanduser("~/data")),  # home expanded
])
def test_absolute(given, root, want):
    assert absolute(given, Path(root)) == want


@pytest.mark.parametrize("uri, want", [
    ("sqlite:///mlflow.db", "sqlite:////exp/mlflow.db"),
    ("sqlite:///runs/m.db?timeout=5", "sqlite:////exp/runs/m.db?timeout=5"),   # a query is kept
    ("sqlite+pysqlite:///m.db", "sqlite+pysqlite:////exp/m.db"),               # a driver is kept
    ("sqlite:////abs/m.db", "sqlite:////abs/m.db"),                            # absolute already
    ("sqlite:///:memory:", "sqlite:///:memory:"),                              # no file
    ("file:./mlruns", "file:///exp/mlruns"),
    ("file:my%20runs", "file:///exp/my%20runs"),                               # percent-encoding round-trips
    ("file:///abs/mlruns", "file:///abs/mlruns"),
    ("mlruns", "/exp/mlruns"),                                                 # a bare path is a file store
    ("http://host:5000", "http://host:5000"),                                  # a server
    ("postgresql://u@host/db", "postgresql://u@host/db"),
])
def test_absolute_uri(uri, want):
    assert absolute_uri(uri, Path("/exp")) == want


def test_make_absolute_leaves_values_that_name_no_path():
    for value in ("", None, 3, ["a"]):  # off, unset, wrong types (the validator reports those)
        assert make_absolute(value, PathOption(), Path("/exp")) == value
    assert make_absolute("m.db", PathOption(), Path("/exp")) == "/exp/m.db"
    assert make_absolute("sqlite:///m.db", PathOption(uri=True), Path("/exp")) == "sqlite:////exp/m.db"
