"""Fashion-MNIST: the idx parser on tiny written files, the federated split, and the real files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError, DataError
from fedaug.data import FederatedData, load_dataset
from fedaug.data.fashion_mnist import DEFAULT_ROOT, FILES, fashion_mnist, read_idx

IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write ``array`` as a gzipped idx file (header: 0, 0, dtype code, ndim; big-endian dims)."""
    header = struct.pack(">HBB", 0, IDX_CODES[array.dtype], array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Fashion-MNIST layout with 400 train (40 per class) and 200 test (20 per class) random images."""
    root = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("test", 200)):
        images, labels = FILES[split]
        write_idx(root / images, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(root / labels, (np.arange(n) % 10).astype(np.uint8))
    return root


def hashes(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.reshape(len(x), -1)}


def test_read_idx_round_trips(tmp_path: Path) -> None:
    for array in (np.arange(24, dtype=np.uint8).reshape(2, 3, 4), np.array([-1, 7, 2**30], dtype=">i4")):
        write_idx(tmp_path / "a.gz", array)
        out = read_idx(tmp_path / "a.gz")
        assert np.array_equal(out, array) and out.shape == array.shape and out.dtype.isnative


@pytest.mark.parametrize("payload", [b"junk", gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05abc", mtime=0)],
                         ids=["junk", "gzipped-short-header"])
def test_read_idx_rejects_malformed_files(tmp_path: Path, payload: bytes) -> None:
    (tmp_path / "bad.gz").write_bytes(payload)
    with pytest.raises(DataError, match=r"bad.gz' is not a gzipped idx file"):
        read_idx(tmp_path / "bad.gz")


def test_missing_directory_says_how_to_fix(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(
        DataError, match=r"nowhere.*train-images-idx3-ubyte.gz.*apt-get install dataset-fashion-mnist.*root="
    ):
        fashion_mnist(seed=0, root=root)


def test_balanced_dirichlet_clients_on_fake_files(fake_root: Path) -> None:
    """400 fake images, 4 clients: each holds < 100 + 40 (the cap N / K plus one class of 40)."""
    fd = fashion_mnist(seed=0, root=fake_root, num_clients=4, partition="dirichlet_balanced", alpha=0.5, min_size=20)
    sizes = [len(c.train) + len(c.val) for c in fd.clients]
    assert sum(sizes) == 400 and min(len(c.train) for c in fd.clients) >= 20 and max(sizes) < 140
    assert fd.info["params"]["partition"] == "dirichlet_balanced"


def test_dirichlet_clients_on_fake_files(fake_root: Path) -> None:
    fd = fashion_mnist(seed=0, root=fake_root, num_clients=4, alpha=0.5, min_size=20)
    assert fd.name == "fashion_mnist" and fd.num_classes == 10 and fd.input_shape == (1, 28, 28)
    assert [c.name for c in fd.clients] == [f"client-{k}" for k in range(4)] == [c.group for c in fd.clients]
    seen: set[bytes] = set()
    for c in fd.clients:
        assert len(c.train) >= 20
        for s in (c.train, c.val, c.test):
            assert s.x.shape[1:] == (1, 28, 28) and s.x.dtype == torch.float32 and s.y.dtype == torch.int64
            assert float(s.x.min()) >= 0 and float(s.x.max()) <= 1 and 0 <= int(s.y.min()) <= int(s.y.max()) <= 9
        assert len(c.val) == int(0.1 * (len(c.train) + len(c.val)))
        train_val = hashes(c.train.x) | hashes(c.val.x)
        assert len(train_val) == len(c.train) + len(c.val) and not train_val & seen  # disjoint clients
        seen |= train_val
    assert len(seen) == 400
    test_hashes = [hashes(c.test.x) for c in fd.clients]
    assert sum(map(len, test_hashes)) == len(set().union(*test_hashes))  # supply suffices: no sharing


def test_test_split_follows_train_label_distribution(fake_root: Path) -> None:
    fd = fashion_mnist(seed=3, root=fake_root, num_clients=3, alpha=0.3, min_size=5)
    rate = fd.info["test_rate"]
    totals = np.bincount(fd.pooled("train").y.numpy(), minlength=10)
    assert rate == pytest.approx(min(200 / (400 * 0.9), (20 / totals).min()))  # file rate, capped by supply
    for c in fd.clients:
        train = np.bincount(c.train.y.numpy(), minlength=10)
        test = np.bincount(c.test.y.numpy(), minlength=10)
        assert np.array_equal(test, np.round(train * rate).astype(int))


def test_alpha_with_iid_warns(fake_root: Path) -> None:
    with pytest.warns(UserWarning, match=r"alpha=0.1 has no effect with partition='iid'"):
        fashion_mnist(seed=0, root=fake_root, num_clients=2, partition="iid", alpha=0.1)


def test_iid_clients_are_balanced(fake_root: Path) -> None:
    fd = fashion_mnist(seed=0, root=fake_root, num_clients=5, partition="iid", val_fraction=0.0)
    assert [len(c.train) for c in fd.clients] == [80] * 5 and all(len(c.val) == 0 for c in fd.clients)
    assert all(np.bincount(c.train.y.numpy(), minlength=10).tolist() == [8] * 10 for c in fd.clients)


def test_seeds(fake_root: Path) -> None:
    def build(seed: int) -> FederatedData:
        return fashion_mnist(seed=seed, root=fake_root, num_clients=3, samples=300)

    a, b, c = build(0), build(0), build(1)
    assert len(a.pooled("train")) + len(a.pooled("val")) == 300
    for split in ("train", "val", "test"):
        assert all(
            torch.equal(getattr(x, split).x, getattr(y, split).x) for x, y in zip(a.clients, b.clients, strict=True)
        )
    assert hashes(a.clients[0].train.x) != hashes(c.clients[0].train.x)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_clients": 0}, r"num_clients must be an integer >= 1, got 0"),
        (
            {"partition": "pathological"},
            r"partition must be one of dirichlet, dirichlet_balanced, iid, quantity, shards, scarcity, "
            r"got 'pathological'",
        ),
        ({"alpha": -1.0}, r"alpha must be > 0, got -1.0"),
        ({"min_size": -2}, r"min_size must be an integer >= 0, got -2"),
        ({"samples": 0}, r"samples must be None \(all\) or an integer >= 1, got 0"),
        ({"val_fraction": 1.0}, r"val_fraction must be in \[0, 1\), got 1.0"),
        ({"samples": 1000}, r"samples must be <= 400"),
        ({"num_clients": 50}, r"cannot give num_clients=50 clients min_size=10 train samples each"),
        ({"alpha": 1e-4, "min_size": 35}, r"no Dirichlet\(alpha=0.0001\) split"),
    ],
)
def test_option_errors(fake_root: Path, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fashion_mnist(seed=0, root=fake_root, **options)


@pytest.fixture
def real_root() -> Path:
    if not DEFAULT_ROOT.is_dir():
        pytest.skip("dataset-fashion-mnist Debian package not installed (apt-get install dataset-fashion-mnist)")
    return DEFAULT_ROOT


def test_real_files(real_root: Path) -> None:
    fd: FederatedData = load_dataset("fashion_mnist", seed=0, samples=2000, num_clients=5)
    assert fd.info["params"]["root"] == str(real_root)
    train = fd.pooled("train")
    assert len(train) + len(fd.pooled("val")) == 2000
    assert sorted(train.y.unique().tolist()) == list(range(10))
    assert float(train.x.min()) >= 0 and float(train.x.max()) == 1.0 and train.x.shape[1:] == (1, 28, 28)
    assert 300 < len(fd.pooled("test")) < 400  # about 2000 * 0.9 * 10000 / 54000


@pytest.mark.parametrize(
    ("options", "check"),
    [
        ({"partition": "quantity", "num_clients": 6, "q": 3}, lambda fd: len(fd.clients) == 6),
        ({"partition": "shards", "num_clients": 5, "shards_per_client": 2}, lambda fd: len(fd.clients) == 5),
        ({"partition": "scarcity", "mean_size": 50}, lambda fd: len(fd.clients) == 8),  # 400 / 50
    ],
)
def test_other_partitions(fake_root: Path, options: dict, check) -> None:
    fd = fashion_mnist(seed=0, root=fake_root, val_fraction=0.0, **options)
    assert check(fd) and len(fd.pooled("train")) == 400
    if options["partition"] == "quantity":
        assert all(len(c.train.y.unique()) == 3 for c in fd.clients)
    if options["partition"] == "shards":
        assert all(len(c.train.y.unique()) <= 2 for c in fd.clients)  # 40 per class = 1 shard of 40


def test_partition_option_errors_are_collected(fake_root: Path) -> None:
    with pytest.raises(ConfigError, match=r"partition must be one of .*; q must be an integer >= 1, got 0"):
        fashion_mnist(seed=0, root=fake_root, partition="qua", q=0)
    with pytest.raises(ConfigError, match=r"q must be an integer in \[1, 10\]"):
        fashion_mnist(seed=0, root=fake_root, partition="quantity", q=11)
    with pytest.warns(UserWarning, match=r"q=5 has no effect with partition='dirichlet'"):
        fashion_mnist(seed=0, root=fake_root, num_clients=2, q=5)
