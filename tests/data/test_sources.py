"""What each offline data source needs, checked without building it (``fedaug env``)."""

from __future__ import annotations

import pytest

from fedaug.data import sources
from fedaug.data.sources import SOURCES, Need, source_status


def test_a_need_is_present_or_not(tmp_path):
    assert Need("package", "json", "").present() and not Need("package", "no_such_module_xyz", "").present()
    assert not Need("file", str(tmp_path / "f"), "").present()
    (tmp_path / "f").write_text("")
    assert Need("file", str(tmp_path / "f"), "").present()
    assert not Need("program", "no-such-program-xyz", "").present()
    with pytest.raises(ValueError, match=r"unknown kind of need 'url'; choose from package, file, program"):
        Need("url", "x", "").present()


def test_every_registered_source_is_listed_and_a_missing_need_is_named_with_its_install(monkeypatch, tmp_path):
    from fedaug.data.registry import DATASETS

    assert set(SOURCES) <= set(DATASETS)
    monkeypatch.setitem(sources.SOURCES, "spoken_digits", (
        Need("program", "no-such-espeak", "apt-get install espeak-ng"), Need("package", "json", "pip")))
    status = source_status()
    assert status["spoken_digits"] == {"present": False,
                                       "missing": ["program no-such-espeak (apt-get install espeak-ng)"]}
    assert status["synthetic"] == {"present": True, "missing": []}
