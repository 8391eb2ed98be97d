"""Local-directory loaders on tiny fixtures written in the published layouts (network blocked)."""

from __future__ import annotations

import csv
import pickle
import re
import struct
import wave
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError, DataError
from fedaug.data import load_dataset
from tests.data.test_fashion_mnist import write_idx


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path / "cache"))


def test_cifar10(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}", 40) for i in range(1, 6)), ("test_batch", 50)]:
        d = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(np.arange(n) % 10)}
        (tmp_path / name).write_bytes(pickle.dumps(d))
    fd = load_dataset("cifar10", seed=0, root=str(tmp_path), partition="quantity", num_clients=4, q=3)
    assert fd.input_shape == (3, 32, 32) and fd.num_clients == 4
    assert len(fd.pooled("train")) + len(fd.pooled("val")) == 200 and len(fd.pooled("test")) == 50
    assert all(len(torch.cat([c.train.y, c.val.y]).unique()) == 3 for c in fd.clients)
    (tmp_path / "test_batch").write_bytes(b"junk")
    with pytest.raises(DataError, match=r"(?s)test_batch' is missing or malformed.*Expected layout.*data_batch_1"):
        load_dataset("cifar10", seed=0, root=str(tmp_path))


def test_emnist_idx_and_mat(tmp_path: Path) -> None:
    from scipy.io import savemat

    img = np.zeros((62 * 2, 28, 28), np.uint8)
    img[:, 0, 5] = 255  # stored transposed: becomes row 5, column 0
    for s in ("train", "test"):
        write_idx(tmp_path / f"emnist-byclass-{s}-images-idx3-ubyte.gz", img)
        write_idx(tmp_path / f"emnist-byclass-{s}-labels-idx1-ubyte.gz", (np.arange(124) % 62).astype(np.uint8))
    fd = load_dataset("emnist", seed=0, root=str(tmp_path), partition="iid", num_clients=2)
    x = fd.pooled("train").x
    assert fd.num_classes == 62 and x.shape[1:] == (1, 28, 28) and float(x[0, 0, 5, 0]) == 1.0
    mat = tmp_path / "mat"
    mat.mkdir()
    flat = img.transpose(0, 2, 1).reshape(len(img), -1, order="F")  # the .mat's row-major-of-transposed layout
    part = {"images": flat, "labels": (np.arange(124) % 62)[:, None]}
    savemat(mat / "emnist-byclass.mat", {"dataset": {"train": part, "test": part}})
    fd2 = load_dataset("emnist", seed=0, root=str(mat), partition="iid", num_clients=2)
    assert torch.equal(fd2.pooled("test").x.sum(0), fd.pooled("test").x.sum(0))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"(?s)no EMNIST byclass files.*emnist-byclass.mat"):
        load_dataset("emnist", seed=0, root=str(empty))


def test_out_of_range_labels_in_a_local_directory_are_a_data_error(tmp_path: Path) -> None:
    labels = (np.arange(124) % 62).astype(np.uint8)
    labels[[5, 9]] = [70, 99]  # not EMNIST byclass classes
    for s in ("train", "test"):
        write_idx(tmp_path / f"emnist-byclass-{s}-images-idx3-ubyte.gz", np.zeros((124, 28, 28), np.uint8))
        write_idx(tmp_path / f"emnist-byclass-{s}-labels-idx1-ubyte.gz", labels)
    with pytest.raises(DataError, match=r"^emnist: labels must be integer class indices in 0\.\.61 \(num_classes=62\); "
                                        r"client 'client-\d' (train|val) has label\(s\) (70|99).*client 'client-\d' test "
                                        r"has label\(s\) (70|99)"):
        load_dataset("emnist", seed=0, root=str(tmp_path), partition="iid", num_clients=2)


def write_fedbn(root: Path, prefix: str, sites: tuple[str, ...], classes: tuple[str, ...]) -> None:
    from PIL import Image

    for site in sites:
        for split, n in (("train", 20), ("test", 6)):
            paths, labels = [], []
            for i in range(n):
                cls = classes[i % len(classes)]
                rel = f"{prefix}/{site}/{cls}/{split}{i}.jpg"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.full((40, 30, 3), 10 * i, np.uint8)).save(root / rel)
                paths.append(rel)
                labels.append(cls)
            (root / prefix / f"{site}_{split}.pkl").write_bytes(pickle.dumps((np.array(paths), np.array(labels))))


@pytest.mark.parametrize(("name", "prefix", "sites", "classes"), [
    ("office_caltech10", "office_caltech_10", ("amazon", "caltech", "dslr", "webcam"), ("back_pack", "bike", "mug")),
    ("domainnet", "DomainNet", ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"), ("bird", "zebra")),
])
def test_fedbn_layouts(tmp_path: Path, name: str, prefix: str, sites: tuple, classes: tuple) -> None:
    write_fedbn(tmp_path, prefix, sites, classes)
    fd = load_dataset(name, seed=0, root=str(tmp_path), size=16)
    assert [c.name for c in fd.clients] == list(sites) and fd.input_shape == (3, 16, 16) and fd.num_classes == 10
    c = fd.clients[0]
    assert len(c.train) + len(c.val) == 20 and len(c.test) == 6 and c.train.x.shape[1:] == (3, 16, 16)
    assert int(c.train.y.max()) < 10
    (tmp_path / prefix / f"{sites[1]}_test.pkl").unlink()
    with pytest.raises(DataError, match=rf"(?s){sites[1]}_test.pkl' is missing.*Expected layout.*_train.pkl"):
        load_dataset(name, seed=0, root=str(tmp_path), size=16)


def png_bomb(path: Path, side: int = 20_000) -> None:
    """A real decompression bomb: a 1-bit PNG of ``side`` x ``side`` zero pixels (400 M pixels for the
    default, over twice Pillow's ``MAX_IMAGE_PIXELS``), a few tens of kB on disk."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z = zlib.compressobj(9)
    row = bytes(1 + side // 8)  # filter byte 0, then the row's bits
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_a_decompression_bomb_in_a_local_image_directory_is_a_data_error_naming_the_file(tmp_path: Path) -> None:
    classes = ("back_pack", "bike", "mug")
    write_fedbn(tmp_path, "office_caltech_10", ("amazon",), classes)
    bomb = tmp_path / "office_caltech_10" / "amazon" / "bike" / "train1.jpg"  # listed in amazon_train.pkl
    png_bomb(bomb)
    assert bomb.stat().st_size < 200_000
    with pytest.raises(DataError, match=rf"office_caltech10: image '{re.escape(str(bomb))}' listed in "
                                        r"'amazon_train.pkl' was refused as a possible decompression bomb \(Image "
                                        r"size \(400000000 pixels\) exceeds limit"):
        load_dataset("office_caltech10", seed=0, root=str(tmp_path), sites=["amazon"], size=16)


def test_uci_har(tmp_path: Path) -> None:
    from fedaug.data.local_signals import HAR_SIGNALS

    for split, subjects in (("train", (1, 3)), ("test", (2,))):
        d = tmp_path / split / "Inertial Signals"
        d.mkdir(parents=True)
        n = 12 * len(subjects)
        np.savetxt(tmp_path / split / f"y_{split}.txt", np.arange(n) % 6 + 1, fmt="%d")
        np.savetxt(tmp_path / split / f"subject_{split}.txt", np.repeat(subjects, 12), fmt="%d")
        for s in HAR_SIGNALS:
            np.savetxt(d / f"{s}_{split}.txt", np.random.default_rng(0).normal(size=(n, 128)), fmt="%.6e")
    fd = load_dataset("uci_har", seed=0, root=str(tmp_path))
    assert [c.name for c in fd.clients] == ["subject-01", "subject-02", "subject-03"] and fd.input_shape == (9, 128)
    assert all(len(c.train) + len(c.val) + len(c.test) == 12 for c in fd.clients)
    fd = load_dataset("uci_har", seed=0, root=str(tmp_path), partition="iid", num_clients=2, min_size=1)
    assert fd.num_clients == 2 and len(fd.pooled("test")) == 12
    (tmp_path / "test" / "Inertial Signals" / "body_acc_x_test.txt").unlink()
    with pytest.raises(DataError, match=r"(?s)test files are missing.*Inertial Signals/<signal>_\{split\}.txt"):
        load_dataset("uci_har", seed=0, root=str(tmp_path))


def test_urbansound8k(tmp_path: Path) -> None:
    (tmp_path / "metadata").mkdir()
    rows = []
    for i in range(30):
        fold, cls = i % 3 + 1, i % 10
        (tmp_path / "audio" / f"fold{fold}").mkdir(parents=True, exist_ok=True)
        with wave.open(str(tmp_path / "audio" / f"fold{fold}" / f"{i}.wav"), "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(44100)
            w.writeframes((np.random.default_rng(i).normal(0, 3000, (44100 // 2, 2))).astype("<i2").tobytes())
        rows.append([f"{i}.wav", i, 0, 0.5, 1, fold, cls, f"class{cls}"])
    with open(tmp_path / "metadata" / "UrbanSound8K.csv", "w", newline="") as f:
        csv.writer(f).writerows([["slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class"],
                                 *rows])
    fd = load_dataset("urbansound8k", seed=0, root=str(tmp_path), test_folds=[3], partition="iid", num_clients=2,
                      duration=1.0, n_mels=16)
    assert fd.input_shape == (1, 16, 44) and len(fd.pooled("test")) == 10 and fd.num_clients == 2
    assert torch.isfinite(fd.pooled("train").x).all()
    (tmp_path / "audio" / "fold1" / "0.wav").unlink()
    (tmp_path / "metadata" / "UrbanSound8K.csv").touch()  # new mtime: the cache key changes
    with pytest.raises(DataError, match=r"(?s)audio/fold1/0.wav' listed in the CSV is missing.*metadata/UrbanSound8K.csv"):
        load_dataset("urbansound8k", seed=0, root=str(tmp_path), duration=1.0, n_mels=16)


def test_prostate_mri(tmp_path: Path) -> None:
    import nibabel as nib

    for site in ("BIDMC", "HK"):
        (tmp_path / site).mkdir()
        for case in range(2):
            vol = np.random.default_rng(case).random((24, 24, 10)).astype(np.float32)
            seg = np.zeros_like(vol)
            seg[8:16, 8:16, 2:8] = 1
            nib.save(nib.Nifti1Image(vol, np.eye(4)), tmp_path / site / f"Case0{case}.nii.gz")
            nib.save(nib.Nifti1Image(seg, np.eye(4)), tmp_path / site / f"Case0{case}_segmentation.nii.gz")
    fd = load_dataset("prostate_mri", seed=0, root=str(tmp_path), sites=["BIDMC", "HK"], size=16)
    assert fd.task == "segmentation" and fd.num_classes == 2 and [c.name for c in fd.clients] == ["BIDMC", "HK"]
    c = fd.clients[0]
    assert len(c.train) + len(c.val) + len(c.test) == 12 and c.train.y.shape[1:] == (16, 16)  # 6 slices x 2 cases
    assert set(c.train.y.unique().tolist()) == {0, 1} and c.train.y.dtype == torch.int64
    with pytest.raises(DataError, match=r"(?s)no volumes in 'UCL/'.*CaseNN_segmentation"):
        load_dataset("prostate_mri", seed=0, root=str(tmp_path), sites=["UCL"])


@pytest.mark.parametrize("name", ["cifar10", "emnist", "office_caltech10", "domainnet", "uci_har", "urbansound8k",
                                  "prostate_mri"])
def test_missing_root_shows_layout(name: str, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"(?s)no such directory \(set the root option\).*Expected layout"):
        load_dataset(name, seed=0, root=str(tmp_path / "absent"))


def test_fedbn_option_errors_are_collected() -> None:
    with pytest.raises(ConfigError, match=r"^office_caltech10: sites must be a non-empty list from amazon, caltech, dslr, "
                                          r"webcam, got \['x'\]; size must be an integer >= 8, got 4; "
                                          r"val_fraction must be in \[0, 1\), got 1.0$"):
        load_dataset("office_caltech10", seed=0, sites=["x"], size=4, val_fraction=1.0)
