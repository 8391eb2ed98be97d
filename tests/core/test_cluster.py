"""Reaching a Ray cluster (fedaug.core.cluster): what is refused, before anything waits on Ray, and how."""

from __future__ import annotations

import socket

import pytest

from fedaug.core import cluster
from fedaug.core.errors import ConfigError


def test_a_node_with_other_software_is_refused_naming_each_version():
    ours = {"python": "3.11.7", "fedaug": "0.1.0", "torch": "2.13.0+cpu"}
    theirs = {"python": "3.11.7", "fedaug": "0.0.9", "torch": "2.12.0+cpu"}
    with pytest.raises(ConfigError, match=r"^Ray node abc at 127\.0\.0\.1 runs other software than the driver \(fedaug "
                                          r"0\.0\.9 there, 0\.1\.0 here; torch 2\.12\.0\+cpu there, 2\.13\.0\+cpu here\): "
                                          r"the numbers would differ; install the same versions on every node, or run "
                                          r"with a Ray runtime environment that does \(docs/cluster\.md\)$"):
        cluster.check_software("abc at 127.0.0.1", theirs, ours)
    cluster.check_software("abc", dict(ours), ours)  # equal: nothing raised
    assert set(cluster.software()) == {"python", "fedaug", "torch"}


def test_without_ray_the_extra_to_install_is_named(monkeypatch):
    monkeypatch.setattr(cluster, "ray_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"fleet = 'ray' and fedaug compare --ray need Ray, which is not installed: "
                                          r"pip install 'fedaug\[ray\]'"):
        cluster.connect("127.0.0.1:6379")


@pytest.fixture
def not_connected(monkeypatch):
    """This process as one that has not connected to Ray yet (whatever the session's tests did)."""
    ray = pytest.importorskip("ray", reason="needs the ray extra: pip install 'fedaug[ray]'")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init must not be reached"))


def test_an_address_where_nothing_answers_is_refused_at_once(not_connected):
    with socket.socket() as s:  # a loopback port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=rf"^no Ray cluster answers at '127\.0\.0\.1:{port}' \(.*\); start one \(ray "
                                          r"start --head\) and give its address \(ray\.address, --ray ADDRESS or "
                                          r"RAY_ADDRESS\), or use 'local' for a Ray on this machine$"):
        cluster.connect(f"127.0.0.1:{port}")


def test_an_address_that_is_not_one_is_refused(not_connected):
    with pytest.raises(ConfigError, match=r"^Ray address 'head' is not host:port, ray://host:port, auto or local; "):
        cluster.connect("head")
