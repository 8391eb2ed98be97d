"""The generic load-or-build disk cache."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
import torch

from fedaug.data import cache
from fedaug.core.serialize import load_tensors, save_tensors
from fedaug.data.cache import cache_dir, cache_path, load_or_build, package_versions

KEY = {"dataset": "toy", "seed": 0, "versions": {"numpy": "1.0"}}


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


class CountingBuild:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"x": torch.arange(6, dtype=torch.uint8).reshape(2, 3), "y": torch.tensor([0, 1])}


def test_cache_dir_from_env_and_default(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_dir() == tmp_cache
    monkeypatch.delenv("FEDAUG_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "fedaug"


def test_cache_path_is_a_function_of_the_key(tmp_cache: Path) -> None:
    path = cache_path(KEY, "toy")
    assert path.parent == tmp_cache and path.name.startswith("toy-") and path.suffix == ".pt"
    assert cache_path(dict(reversed(list(KEY.items()))), "toy") == path  # key order does not matter
    assert cache_path(KEY | {"seed": 1}, "toy") != path
    assert cache_path(KEY | {"versions": {"numpy": "2.0"}}, "toy") != path


def test_miss_builds_and_saves_then_hit_loads() -> None:
    build = CountingBuild()
    first = load_or_build(KEY, build, "toy")
    assert build.calls == 1 and cache_path(KEY, "toy").is_file()
    second = load_or_build(KEY, build, "toy")
    assert build.calls == 1
    assert second.keys() == first.keys()
    assert all(torch.equal(first[k], second[k]) and first[k].dtype == second[k].dtype for k in first)


def test_corrupted_file_is_rebuilt() -> None:
    build = CountingBuild()
    load_or_build(KEY, build, "toy")
    cache_path(KEY, "toy").write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="unreadable"):
        record = load_or_build(KEY, build, "toy")
    assert build.calls == 2 and torch.equal(record["y"], torch.tensor([0, 1]))
    load_or_build(KEY, build, "toy")
    assert build.calls == 2  # the rebuilt file is read back


def test_file_with_another_key_is_rebuilt() -> None:
    build = CountingBuild()
    other = {"dataset": "other"}
    load_or_build(other, build, "toy")
    cache_path(KEY, "toy").write_bytes(cache_path(other, "toy").read_bytes())
    with pytest.warns(UserWarning, match="holds another key"):
        load_or_build(KEY, build, "toy")
    assert build.calls == 2


def test_record_missing_a_tensor_is_rebuilt_naming_the_file_and_the_tensor() -> None:
    build = CountingBuild()
    load_or_build(KEY, build, "toy", ("x", "y"))
    path = cache_path(KEY, "toy")
    stored = load_tensors(path)
    save_tensors(path, {"key": stored["key"], "record": {"x": stored["record"]["x"]}})  # "y" lost
    with pytest.warns(UserWarning, match=rf"cache file '{re.escape(str(path))}' has no tensor 'y' \(it holds 'x'\); "
                                         r"rebuilding it"):
        record = load_or_build(KEY, build, "toy", ("x", "y"))
    assert build.calls == 2 and torch.equal(record["y"], torch.tensor([0, 1]))
    load_or_build(KEY, build, "toy", ("x", "y"))
    assert build.calls == 2  # the rebuilt file is complete


def test_unwritable_cache_dir_warns_and_still_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("FEDAUG_CACHE", str(blocker))  # a file, so no directory can be made there
    with pytest.warns(UserWarning, match="could not write cache file"):
        record = load_or_build(KEY, CountingBuild(), "toy")
    assert torch.equal(record["y"], torch.tensor([0, 1]))


def test_package_versions() -> None:
    versions = package_versions(["numpy", "surely-not-an-installed-package"])
    assert versions["numpy"] == __import__("numpy").__version__
    assert versions["surely-not-an-installed-package"] is None
    assert cache.package_versions([]) == {}


def test_network_is_blocked_in_data_tests() -> None:
    with pytest.raises(OSError, match="network access attempted"):
        socket.create_connection(("127.0.0.1", 9))
    with pytest.raises(OSError, match="network access attempted"), socket.socket() as s:
        s.connect(("127.0.0.1", 9))
