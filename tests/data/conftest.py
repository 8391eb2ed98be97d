"""Data tests run offline: any outbound connection fails, so a hidden download cannot pass."""

from __future__ import annotations

import socket

import pytest


class NetworkBlocked(OSError):
    """Raised by every attempt to open a network connection during data tests."""


def _refuse(*args: object, **kwargs: object) -> None:
    raise NetworkBlocked(f"network access attempted during a data test ({args!r}, {kwargs!r})")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse)
    monkeypatch.setattr(socket, "create_connection", _refuse)
