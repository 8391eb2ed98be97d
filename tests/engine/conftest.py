"""Fixtures of the engine's tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Every IP connection of this process fails (tracking tests must not need one); tracking stores
    live under tmp_path, the working directory."""
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network disabled in this test (connect to {address})")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts in ./mlruns
