"""``image_folder``: your own images, ``<root>/<site>/<class>/<image>``, as a federation."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError, DataError
from fedaug.data import image_folder as module
from fedaug.data.registry import load_dataset
from tests.data.image_folders import CLASSES, SITES, grey, image_of, write_image_folder


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def root(tmp_path) -> Path:
    return write_image_folder(tmp_path / "images")


def images(split) -> list[tuple[int, int, int]]:
    """``(site, label, i)`` of every image of a split (from its pixels), checked against its label."""
    out = [image_of(x.numpy()) for x in split.x]
    assert [label for _, label, _ in out] == split.y.tolist()
    return out


def test_one_client_per_site_classes_from_folder_names_every_image_once(root):
    data = load_dataset("image_folder", 0, root=str(root), size=16)
    assert (data.task, data.num_classes, data.input_shape) == ("classification", 2, (3, 16, 16))
    assert data.info["classes"] == list(CLASSES) and [c.name for c in data.clients] == list(SITES)
    for s, client in enumerate(data.clients):
        assert client.group == SITES[s]
        splits = [images(getattr(client, name)) for name in ("train", "val", "test")]
        # 10 images per class: stratified 0.7/0.1/0.2 gives 7/1/2 of each class
        assert [Counter(label for _, label, _ in part) for part in splits] == [{0: 7, 1: 7}, {0: 1, 1: 1}, {0: 2, 1: 2}]
        every = sorted(img for part in splits for img in part)
        assert every == [(s, label, i) for label in (0, 1) for i in range(10)]  # each file once, at its own site
    x = data.clients[0].train.x
    assert x.dtype == torch.float32 and torch.allclose(x, x[:, :1, :1, :1].expand_as(x), atol=1e-6)  # constant grey


def test_the_same_seed_splits_the_same_another_seed_differently(root):
    def train(seed: int) -> list[tuple[int, int, int]]:
        return images(load_dataset("image_folder", seed, root=str(root), size=8).clients[0].train)

    assert train(0) == train(0) and sorted(train(0)) != sorted(train(1))


def test_grey_levels_survive_the_resize(root):
    data = load_dataset("image_folder", 0, root=str(root), size=8, channels=1)
    x, y = data.clients[1].test.x, data.clients[1].test.y
    assert x.shape[1:] == (1, 8, 8)
    site, label, i = image_of(x[0].numpy())
    assert (site, label) == (1, int(y[0])) and x[0].mean().item() == pytest.approx(grey(site, label, i) / 255, abs=1e-6)


def test_clients_per_site_deal_each_split_stratified(root):
    data = load_dataset("image_folder", 3, root=str(root), size=8, clients_per_site=2)
    assert [(c.name, c.group) for c in data.clients] == [
        ("Site A#0", "Site A"), ("Site A#1", "Site A"), ("hôpital-2#0", "hôpital-2"), ("hôpital-2#1", "hôpital-2")]
    whole = {c.name: c for c in load_dataset("image_folder", 3, root=str(root), size=8).clients}
    for a, b in (data.clients[:2], data.clients[2:]):
        for split in ("train", "val", "test"):
            x, y = images(getattr(a, split)), images(getattr(b, split))
            assert not set(x) & set(y) and sorted(x + y) == sorted(images(getattr(whole[a.group], split)))
            counts = [Counter(label for _, label, _ in part) for part in (x, y)]
            assert all(abs(counts[0][k] - counts[1][k]) <= 1 for k in (0, 1))  # stratified: each class halved


def test_a_subset_of_sites_and_classes_in_the_order_given(root):
    def labels(split) -> tuple[list[int], list[int]]:
        """(the labels, the class folder index each image came from)"""
        return split.y.tolist(), [image_of(x.numpy())[1] for x in split.x]

    data = load_dataset("image_folder", 0, root=str(root), size=8, sites=["hôpital-2"], classes=["dög"])
    assert data.num_classes == 1 and data.info["classes"] == ["dög"] and [c.name for c in data.clients] == ["hôpital-2"]
    y, folder = labels(data.clients[0].train)
    assert set(y) == {0} and set(folder) == {1}  # only dög's images, labelled 0
    swapped = load_dataset("image_folder", 0, root=str(root), size=8, classes=["dög", "cat (x)"])
    assert swapped.info["classes"] == ["dög", "cat (x)"]
    y, folder = labels(swapped.clients[0].train)
    assert y == [1 - f for f in folder] and set(y) == {0, 1}


def test_the_cache_is_used_and_an_edited_image_is_read_again(root, cache, monkeypatch):
    reads = []
    original = module.read_image
    monkeypatch.setattr(module, "read_image", lambda *a: reads.append(a[0]) or original(*a))
    first = load_dataset("image_folder", 0, root=str(root), size=8)
    assert len(reads) == 40 and len(list(cache.glob("image_folder-*.pt"))) == 2
    again = load_dataset("image_folder", 0, root=str(root), size=8)
    assert len(reads) == 40 and torch.equal(again.clients[0].train.x, first.clients[0].train.x)
    from PIL import Image

    edited = root / "Site A" / "dög" / "img 3.png"
    Image.fromarray(np.full((20, 24, 3), 7, np.uint8)).save(edited)
    os.utime(edited, ns=(1, 1))  # another modification time, whatever the clock's resolution
    changed = load_dataset("image_folder", 0, root=str(root), size=8)
    assert len(reads) == 60  # the site with the edited file, read again; the other site from the cache
    pooled = torch.cat([changed.clients[0].train.x, changed.clients[0].val.x, changed.clients[0].test.x])
    assert pooled.mean((1, 2, 3)).mul(255).round().eq(7).sum() == 1


def test_a_split_file_assigns_every_image(root):
    lines = ["path,split", "# every image of both sites"]
    wanted: dict[str, set[tuple[int, int, int]]] = {"train": set(), "val": set(), "test": set()}
    for s, site in enumerate(SITES):
        for label, cls in enumerate(CLASSES):
            for i in range(10):
                split = "test" if i < 3 else "val" if i == 3 else "train"
                lines.append(f"{site}/{cls}/img {i}.png,{split}")
                wanted[split].add((s, label, i))
    (root / "splits.csv").write_text("\n".join(lines) + "\n")
    data = load_dataset("image_folder", 0, root=str(root), size=8, split="splits.csv")
    for name, expected in wanted.items():
        assert {img for c in data.clients for img in images(getattr(c, name))} == expected
    with pytest.warns(UserWarning, match="val_fraction and test_fraction do nothing with a split file"):
        load_dataset("image_folder", 0, root=str(root), size=8, split="splits.csv", val_fraction=0.3)
    (root / "partial.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(DataError, match=r"does not list 1 image\(s\) of site 'hôpital-2', e.g. 'hôpital-2/dög/img 9.png'"):
        load_dataset("image_folder", 0, root=str(root), split="partial.csv")
    (root / "typo.csv").write_text("\n".join([*lines, "Site A/dög/img 10.png,train"]) + "\n")
    with pytest.raises(DataError, match=r"lists 'Site A/dög/img 10.png', which is not an image under the root"):
        load_dataset("image_folder", 0, root=str(root), split="typo.csv")
    (root / "bad.csv").write_text("Site A/dög/img 1.png,holdout\n")
    with pytest.raises(DataError, match=r"line 1 of split file .* is 'Site A/dög/img 1.png,holdout'; each line is"):
        load_dataset("image_folder", 0, root=str(root), split="bad.csv")


@pytest.mark.parametrize("options, error, match", [
    ({"sites": ["Site B"]}, ConfigError,
     r"sites: 'Site B' is not a site folder under '.*'; found: Site A, hôpital-2 \(did you mean 'Site A'\?\)"),
    ({"classes": ["dog"]}, ConfigError, r"classes: 'dog' is not a class folder .* \(did you mean 'dög'\?\)"),
    ({"channels": 2, "size": 4}, ConfigError,
     r"^image_folder: size must be an integer >= 8, got 4; channels must be 1 or 3, got 2$"),
    ({"sites": []}, ConfigError, r"sites must be a non-empty list of distinct folder names, got \[\]"),
])
def test_bad_options_name_the_option_and_the_choices(root, options, error, match):
    with pytest.raises(error, match=match):
        load_dataset("image_folder", 0, root=str(root), **options)


def test_a_bad_layout_says_what_is_wrong_and_shows_the_layout(root, tmp_path):
    with pytest.raises(DataError, match=r"(?s)no such directory \(set the root option\).*<root>/<site>/<class>/<image>"):
        load_dataset("image_folder", 0, root=str(tmp_path / "missing"))
    (root / "Site A" / "stray.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"'Site A/stray.png' is not in a class folder .* move it to 'Site A/<class>/'"):
        load_dataset("image_folder", 0, root=str(root))
    (root / "Site A" / "stray.png").unlink()
    (root / "Site A" / "dög" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match=r"image '.*Site A/dög/broken.png' cannot be read .*; remove or replace it"):
        load_dataset("image_folder", 0, root=str(root))
    empty = tmp_path / "empty"
    (empty / "site" / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match=r"site 'site' has no images in the class folders cls"):
        load_dataset("image_folder", 0, root=str(empty))
