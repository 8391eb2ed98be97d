"""Fixtures of the engine's tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Every IP connection of this process fails (tracking tests must not need one); tracking stores live
    under tmp_path. The test runs in an empty working directory, which must stay empty: tracking writes only
    into the run directory and the store (MLflow's default would put a sqlite store's artifacts in ./mlruns)."""
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network disabled in this test (connect to {address})")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield
    assert sorted(p.name for p in cwd.iterdir()) == []
