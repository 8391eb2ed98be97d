"""Offline sources (network blocked by conftest): smartwatch IMU, brain MRI sites, spoken digits."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedaug.core.errors import ConfigError, DataError
from fedaug.data import load_dataset
from fedaug.data import spoken_digits as sd
from fedaug.data.brain_mri import MRICRON, label_by_intensity, patches
from fedaug.data.imu import read_watch, windows


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_imu_default_subject_clients() -> None:
    fd = load_dataset("smartwatch_imu", seed=0)
    assert fd.num_clients == 10 and fd.num_classes == 7 and fd.input_shape == (6, 100)
    assert [c.group for c in fd.clients] == [f"subject-{s:02d}" for s in range(1, 11)]
    for c in fd.clients:
        for s in (c.train, c.val, c.test):
            assert s.x.shape[1:] == (6, 100) and s.x.dtype == torch.float32 and s.y.dtype == torch.int64
        assert set(c.train.y.tolist()) == set(range(7)) == set(c.test.y.tolist())  # time split keeps all classes
    assert 3000 < len(fd.pooled("train")) < 4000


def test_imu_layout_clients_per_subject_and_recording_split() -> None:
    fd = load_dataset("smartwatch_imu", seed=1, layout="harnet", clients_per_subject=2, split_by="recording",
                      window=50, stride=50)
    assert fd.num_clients == 20 and fd.input_shape == (1, 50, 6) and fd.clients[0].train.x.shape[1:] == (1, 50, 6)
    assert fd.clients[0].name == "subject-01#0" and fd.clients[1].group == "subject-01"
    one = load_dataset("smartwatch_imu", seed=1, window=50, stride=50, split_by="recording")

    def total(data) -> int:  # whole recordings are windowed either way: the same windows in all
        return sum(len(s) for c in data.clients for s in (c.train, c.val, c.test))

    assert total(fd) == total(one)


def test_windows_and_watch_parser(tmp_path: Path) -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)  # (T=10, C=2)
    w = windows(x, 4, 3)  # starts 0, 3, 6
    assert w.shape == (3, 2, 4) and w[1, 0].tolist() == [6, 8, 10, 12]
    assert windows(x, 11, 1).shape == (0, 2, 11)
    d = {"X": [np.zeros((5, 6)), np.ones((7, 6))], "y": np.array([0, 3]), "subject": np.array([1, 2])}
    np.save(tmp_path / "w.npy", d, allow_pickle=True)
    xs, y, subj = read_watch(tmp_path / "w.npy")
    assert [len(a) for a in xs] == [5, 7] and y.tolist() == [0, 3] and subj.tolist() == [1, 2]
    np.save(tmp_path / "bad.npy", {"X": [np.zeros((5, 3))], "y": [0], "subject": [1]}, allow_pickle=True)
    with pytest.raises(DataError, match=r"not the seglearn watch dataset.*\(T, 6\)"):
        read_watch(tmp_path / "bad.npy")
    (tmp_path / "junk.npy").write_bytes(pickle.dumps([1]))
    with pytest.raises(DataError):
        read_watch(tmp_path / "junk.npy")


def test_imu_option_errors() -> None:
    with pytest.raises(ConfigError, match=r"window must be an integer >= 1, got 0; layout must be one of"):
        load_dataset("smartwatch_imu", seed=0, window=0, layout="nhwc")
    with pytest.raises(ConfigError, match=r"clients_per_subject must be an integer in \[1, 14\]"):
        load_dataset("smartwatch_imu", seed=0, clients_per_subject=15)
    with pytest.raises(ConfigError, match=r"^smartwatch_imu: val_fraction \+ test_fraction must be < 1 .*got 0.5 \+ 0.5"):
        load_dataset("smartwatch_imu", seed=0, val_fraction=0.5, test_fraction=0.5)


def test_brain_mri_2d_mni152() -> None:
    fd = load_dataset("brain_mri", seed=0, sites=["mni152"], size=32)
    assert fd.task == "segmentation" and fd.num_classes == 3 and fd.input_shape == (1, 32, 32)
    c = fd.clients[0]
    assert c.name == "mni152" and c.train.y.shape[1:] == (32, 32) and c.train.y.dtype == torch.int64
    assert set(c.train.y.unique().tolist()) == {0, 1, 2} and 0 <= float(c.train.x.min()) <= float(c.train.x.max()) <= 1
    assert "smoke test" in fd.info["smoke_test"]


def test_brain_mri_colin27_3d() -> None:
    if not (MRICRON / "ch2.nii.gz").is_file():
        pytest.skip("Debian package mricron-data not installed (apt-get install mricron-data)")
    fd = load_dataset("brain_mri", seed=0, sites=["colin27"], dims=3, patch=16, spacing=4)
    c = fd.clients[0]
    assert fd.input_shape == (1, 16, 16, 16) and c.train.x.shape[1:] == (1, 16, 16, 16)
    assert c.train.y.shape[1:] == (16, 16, 16) and int(c.train.y.max()) <= 2 and fd.info["derived_labels"] == ["colin27"]


def test_brain_label_derivation_and_patches_on_a_phantom() -> None:
    t1 = np.zeros((20, 20, 20), np.float32)
    t1[4:16, 4:16, 4:16] = 0.2  # CSF shell
    t1[6:14, 6:14, 6:14] = 0.5  # GM
    t1[8:12, 8:12, 8:12] = 0.9  # WM core
    t1 += (t1 > 0) * np.random.default_rng(0).normal(0, 0.02, t1.shape).astype(np.float32)
    labels = label_by_intensity(t1, t1 > 0)
    assert labels[10, 10, 10] == 2 and labels[7, 7, 7] == 1 and labels[5, 5, 5] == 0 and labels[0, 0, 0] == 0
    x, y = patches(t1, labels, patch=4, spacing=1, min_brain=0.0)
    assert x.shape[1:] == (1, 4, 4, 4) and y.shape[1:] == (4, 4, 4) and len(x) == 8  # 8^3 GM box / 4^3
    assert int((y > 0).sum()) == int((labels > 0).sum())


def test_brain_mri_errors() -> None:
    with pytest.raises(ConfigError, match=r"sites must be a non-empty list of distinct names from mni152, colin27"):
        load_dataset("brain_mri", seed=0, sites=["mni"])
    with pytest.raises(ConfigError, match=r"dims must be 2 or 3, got 4"):
        load_dataset("brain_mri", seed=0, dims=4)
    with pytest.raises(ConfigError, match=r"^brain_mri: size must be an integer >= 8, got 4; test_fraction must be in \[0, 1\), got 1.0$"):
        load_dataset("brain_mri", seed=0, size=4, test_fraction=1.0)


def test_spoken_digits_option_errors() -> None:
    with pytest.raises(ConfigError, match=r"^spoken_digits: n_mels must be an integer >= 8, got 4; val_fraction must be in"):
        load_dataset("spoken_digits", seed=0, n_mels=4, val_fraction=-0.1)


needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (apt-get install espeak-ng)")


@needs_espeak
def test_spoken_digits_voices_as_clients() -> None:
    fd = load_dataset("spoken_digits", seed=0, voices=["en-us", "en-gb-scotland"], samples_per_class=3, n_mels=16)
    assert [c.name for c in fd.clients] == ["en-us", "en-gb-scotland"] and fd.input_shape == (1, 16, 87)
    assert fd.info["synthetic"] == ["en-us", "en-gb-scotland"] and "SYNTHETIC" in fd.info["sources"]["spoken_digits"]
    for c in fd.clients:
        assert len(c.train) + len(c.val) + len(c.test) == 30 and c.train.x.shape[1:] == (1, 16, 87)
        assert torch.isfinite(c.train.x).all() and sorted(c.train.y.unique().tolist()) == list(range(10))
    again = load_dataset("spoken_digits", seed=0, voices=["en-us", "en-gb-scotland"], samples_per_class=3, n_mels=16)
    assert torch.equal(again.clients[0].train.x, fd.clients[0].train.x)  # cache hit, same data


@needs_espeak
def test_spoken_digits_unknown_voice() -> None:
    with pytest.raises(DataError, match=r"espeak-ng --voices=en"):
        load_dataset("spoken_digits", seed=0, voices=["xx-nowhere"], samples_per_class=3)


def test_spoken_digits_without_espeak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sd.shutil, "which", lambda name: None)
    with pytest.raises(DataError, match=r"apt-get install espeak-ng"):
        load_dataset("spoken_digits", seed=0)


def test_mel_filterbank_and_log_mel_on_a_tone() -> None:
    from fedaug.data.audio import fix_length, frames, log_mel, mel_filterbank

    fb = mel_filterbank(257, 20, 16000)  # (20, 257)
    assert fb.shape == (20, 257) and float(fb.max()) <= 1 and bool((fb.max(1).values > 0.5).all())
    t = torch.arange(16000) / 16000
    spec = log_mel(torch.sin(2 * torch.pi * 1000 * t)[None], 16000, n_mels=20)  # (1, 20, frames)
    assert spec.shape == (1, 20, frames(16000, 256))
    peak_band = int(spec[0].mean(1).argmax())
    assert 0.5 < float(fb[peak_band, 32]) <= 1  # bin 32 = 1000 Hz lies under the loudest band's filter
    assert fix_length(np.arange(5.0), 3).tolist() == [1, 2, 3] and fix_length(np.ones(2), 4).tolist() == [0, 1, 1, 0]
