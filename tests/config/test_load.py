"""The TOML writer: whatever a config holds is written so that it reads back exactly (property tests)."""

from __future__ import annotations

import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedaug.config.load import dump_toml, parse_config, read_toml, toml_string
from fedaug.config.schema import MAX_NAME, validate
from fedaug.core.errors import ConfigError
from fedaug.engine.records.rundir import CONFIG, RunDir

# any key: empty, dotted, quoted, with spaces, control characters or non-ASCII letters
KEYS = st.text(max_size=8)
SCALARS = st.one_of(st.text(), st.integers(), st.floats(allow_nan=False), st.booleans())
# lists of values, tables (dicts) at any depth: under a table they are [sub.tables], in a list inline tables
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(KEYS, inner, max_size=4)), max_leaves=20)
DOCUMENTS = st.dictionaries(KEYS, VALUES, max_size=6)


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS)
def test_every_document_reads_back_equal(doc):
    assert tomllib.loads(dump_toml(doc)) == doc


@settings(deadline=None)
@given(st.text())
def test_every_string_reads_back_exactly(s):
    assert tomllib.loads(f"v = {toml_string(s)}")["v"] == s


@pytest.mark.parametrize("s, written", [
    ("a\nb", r'"a\nb"'), ("tab\there", r'"tab\there"'), ('say "hi"', r'"say \"hi\""'), ("back\\slash", r'"back\\slash"'),
    ("\x00\x1f\x7f", r'"\u0000\u001F\u007F"'), ("\r\b\f", r'"\r\b\f"'), ("ünï €", '"ünï €"'),
])
def test_control_characters_quotes_and_backslashes_are_escaped(s, written):
    assert toml_string(s) == written


def test_non_finite_floats_are_written_as_toml_spells_them():
    back = tomllib.loads(dump_toml({"a": math.nan, "b": math.inf, "c": -math.inf}))
    assert math.isnan(back["a"]) and back["b"] == math.inf and back["c"] == -math.inf


@pytest.mark.parametrize("doc, match", [
    ({"a": None}, r"cannot write None \(NoneType\) to TOML"),
    ({"a": [object()]}, r"cannot write <object .*> \(object\) to TOML"),
    ({"a": {1: 2}}, r"cannot write the key 1 \(int\) to TOML; keys are strings"),
])
def test_what_toml_cannot_hold_is_a_config_error(doc, match):
    with pytest.raises(ConfigError, match=match):
        dump_toml(doc)


OPTION_TABLES = st.dictionaries(KEYS, st.dictionaries(KEYS, VALUES, max_size=3), max_size=3)


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=MAX_NAME), out_dir=st.text(), data_options=st.dictionaries(KEYS, VALUES, max_size=4),
       method_options=OPTION_TABLES, augs=st.lists(st.text(), max_size=3))
def test_every_valid_config_round_trips_through_its_config_toml(name, out_dir, data_options, method_options, augs):
    cfg = validate({"name": name, "out_dir": out_dir, "data": {"options": data_options},
                    "method": {"augs": augs, "options": method_options}})
    assert validate(tomllib.loads(dump_toml(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("name", ["line one\nline two", "tab\tand \"quotes\" \\ \x00 \x1b[31m", "../../etc", "日本語"])
def test_a_run_named_with_any_characters_gets_a_safe_directory_and_a_readable_config(tmp_path, name):
    cfg = validate({"name": name, "method": {"augs": ["fedprox"], "options": {"fedprox": {"mu": 0.1, "note": name}}}})
    with RunDir.start(cfg, tmp_path) as run:
        assert run.path.parent == tmp_path
        assert run.path.name.startswith(("line_one_line_two", "tab_and", ".._.._etc", "___"))
        assert parse_config(read_toml(run.path / CONFIG)) == cfg
