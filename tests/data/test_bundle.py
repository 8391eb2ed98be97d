"""Data bundles (fedaug.data.bundle, ``fedaug data export``): a federation read from a bundle equals the one built
bit for bit (8-bit images pooled as uint8, other tensors as they are); federations that share samples share rows;
``FEDAUG_DATA_BUNDLE`` is read before the builder, a federation it lacks is built with a warning, and a directory
that is no bundle is a clear error."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedaug.cli.main import main
from fedaug.core.errors import DataError
from fedaug.data import registry
from fedaug.data.base import Split
from fedaug.data.bundle import ENV, INDEX, decode, encode, export_bundle, federation_differences
from fedaug.data.registry import build_dataset, load_dataset

DIGITS = {"samples_per_domain": 40, "usps_style": "v2"}
#: two seeds of Digits-4 and its variants that hold the same images (a held-out domain, a smaller train split),
#: and a federation of float data (synthetic: not 8-bit)
WANTED = [("digits4", seed, {**DIGITS, **extra}) for seed in (0, 1)
          for extra in ({}, {"held_out": "mnist"}, {"train_fraction": 0.5})] + [
    ("synthetic", 3, {"num_clients": 3, "samples_per_client": 24, "size": 8})]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDAUG_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def bundle(cache: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle")
    export_bundle(WANTED, out, build_dataset)
    return out


def distinct_rows(x: torch.Tensor) -> set[str]:
    return {hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in x.reshape(len(x), -1)}


def test_every_bundled_federation_equals_the_built_one_bit_for_bit(bundle, monkeypatch):
    built = {repr(w): build_dataset(w[0], w[1], **w[2]) for w in WANTED}

    def refuse(*args, **kwargs):
        raise AssertionError("built, not read from the bundle")

    monkeypatch.setenv(ENV, str(bundle))
    monkeypatch.setattr(registry, "build_dataset", refuse)
    for name, seed, options in WANTED:
        got = load_dataset(name, seed, **options)
        assert federation_differences(got, built[repr((name, seed, options))]) == [], (name, seed, options)
        assert all(s.x.dtype == torch.float32 and s.y.dtype == torch.int64 for c in got.clients
                   for s in (c.train, c.val, c.test))


def test_federations_that_share_images_share_rows_and_8_bit_images_are_pooled_as_uint8(bundle, cache):
    index = json.loads((bundle / INDEX).read_text())
    assert [(f["dataset"], f["seed"]) for f in index["federations"]] == [(w[0], w[1]) for w in WANTED]
    images = set().union(*(distinct_rows(c.train.x) | distinct_rows(c.val.x) | distinct_rows(c.test.x)
                           for seed in (0, 1) for c in build_dataset("digits4", seed, **DIGITS).clients))
    pools = index["pools"]
    assert pools["u8/255:float32:3x28x28"]["rows"] == len(images)  # the variants add no image
    assert pools["u8:int64:"]["rows"] == 10  # the labels 0-9 (classification targets are rows of shape ())
    floats = build_dataset(*WANTED[-1][:2], **WANTED[-1][2])
    assert pools["raw:float32:1x8x8"]["rows"] == sum(len(getattr(c, s)) for c in floats.clients
                                                     for s in ("train", "val", "test"))  # not 8-bit: as they are


@pytest.mark.parametrize(("t", "encoding"), [
    (torch.tensor([[0.0, 1.0], [2 / 255, 254 / 255]]), "u8/255"),  # 8-bit images as the builders make them
    (torch.tensor([0.5 / 255]), "raw"),                             # between two 8-bit levels
    (torch.tensor([1.5]), "raw"),                                   # beyond 1
    (torch.tensor([0, 7, 255]), "u8"),                              # class indices, masks
    (torch.tensor([-1, 3]), "raw"),
    (torch.tensor([True, False]), "raw"),
    (torch.zeros(0, 3, 2, 2), "u8/255"),                            # an empty split
])
def test_encode_then_decode_gives_back_the_tensor(t, encoding):
    got, rows = encode(t)
    assert got == encoding and (rows.dtype == torch.uint8) == encoding.startswith("u8")
    back = decode(got, rows, t.dtype)
    assert back.dtype == t.dtype and torch.equal(back, t)


def test_differences_are_named_down_to_one_changed_bit(cache):
    a = build_dataset("synthetic", 0, num_clients=2, samples_per_client=8, size=8)
    x = a.clients[1].test.x.clone()
    x.view(-1)[5] = torch.nextafter(x.view(-1)[5], torch.tensor(2.0))
    b = replace(a, clients=[a.clients[0], replace(a.clients[1], test=replace(a.clients[1].test, x=x))],
                info={**a.info, "note": 1})
    assert federation_differences(a, a) == []
    assert federation_differences(a, b) == [f"info: {a.info!r} != {b.info!r}",
                                            "client 'client1' test.x: 1 value(s) differ"]
    val = a.clients[1].val
    c = replace(a, clients=[a.clients[0], replace(a.clients[1], val=Split(val.x[:1], val.y[:1]))])
    assert federation_differences(a, c) == [
        "client 'client1' val.x: torch.float32 (2, 1, 8, 8) against torch.float32 (1, 1, 8, 8)",
        "client 'client1' val.y: torch.int64 (2,) against torch.int64 (1,)"]


def test_a_federation_the_bundle_lacks_is_built_with_a_warning(bundle, monkeypatch):
    monkeypatch.setenv(ENV, str(bundle))
    with pytest.warns(UserWarning, match=r"FEDAUG_DATA_BUNDLE='.*' holds no federation "
                                         r'\{"dataset":"synthetic","options":\{"num_clients":2\},"seed":0\}; building'):
        got = load_dataset("synthetic", 0, num_clients=2)
    assert federation_differences(got, build_dataset("synthetic", 0, num_clients=2)) == []


def test_a_directory_that_is_no_bundle_is_an_error_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(DataError, match=rf"'{tmp_path}' is not a data bundle \(no bundle.json\); write one with "
                                        rf"fedaug data export GRID... --out {tmp_path}, or unset FEDAUG_DATA_BUNDLE"):
        load_dataset("synthetic", 0)


def test_data_export_bundles_what_a_grids_cells_load(tmp_path, capsys, cache):
    grid = tmp_path / "g.toml"
    grid.write_text('seeds = [0, 1]\n[common]\ndata = {name = "synthetic", options = {num_clients = 2, '
                    'samples_per_client = 8, size = 8}}\n[methods.A]\n[methods.B]\ntrain.lr = 0.1\n')
    assert main(["data", "export", str(grid), "--out", str(tmp_path / "b")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'b'}: 2 federation(s) of 1 grid(s), ")  # a seed's A and B: the same
    assert lines[1:] == ["  raw:float32:1x8x8: 48 distinct rows, 0.0 MiB compressed",  # 2 seeds x 2 x (8 + 2 + 2)
                         "  u8:int64:: 10 distinct rows, 0.0 MiB compressed",
                         "  indices: 96 row indices, 0.0 MiB compressed"]  # an x and a y for each of the 48
    assert main(["data", "export", str(grid), "--scale", "paper", "--out", str(tmp_path / "c")]) == 2
    assert "grid 'g' has no paper scale" in capsys.readouterr().err and not (tmp_path / "c").exists()
