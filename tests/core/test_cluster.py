"""Reaching a Ray cluster (fedaug.core.cluster): what is refused, before anything waits on Ray, and how."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedaug.core import cluster
from fedaug.core.errors import ConfigError
from tests.ray_cluster import free_port


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
    port = free_port()
    with pytest.raises(ConfigError, match=rf"^no Ray cluster answers at '127\.0\.0\.1:{port}' \(.*\); start one \(ray "
                                          r"start --head\) and give its address \(ray\.address, --ray ADDRESS or "
                                          r"RAY_ADDRESS\), or use 'local' for a Ray on this machine$"):
        cluster.connect(f"127.0.0.1:{port}")


def test_an_address_that_is_not_one_is_refused(not_connected):
    with pytest.raises(ConfigError, match=r"^Ray address 'head' is not host:port, ray://host:port, auto or local; "):
        cluster.connect("head")


class FakeRay:
    """Ray's calls that :func:`cluster.session` makes, recorded: a cluster of 4 CPUs at 10.0.0.5:6379."""

    def __init__(self, connected: bool) -> None:
        self.connected, self.calls = connected, []

    def is_initialized(self):
        return self.connected

    def init(self, **kwargs):
        self.calls.append(("init", kwargs["address"]))
        self.connected = True

    def shutdown(self):
        self.calls.append(("shutdown",))
        self.connected = False

    def cluster_resources(self):
        return {"CPU": 4.0}

    def get_runtime_context(self):
        return SimpleNamespace(gcs_address="10.0.0.5:6379")


@pytest.mark.parametrize(("address", "before", "calls", "text"), [
    # local: a Ray of the command's own, whatever RAY_ADDRESS names (and not ray.init() without an address, which
    # joins the cluster of RAY_ADDRESS or of 'ray start'); stopped after
    ("local", False, [("init", "local"), ("shutdown",)], "a Ray started for this command at 10.0.0.5:6379"),
    ("", False, [("init", "head:6379"), ("shutdown",)], "the Ray cluster at 10.0.0.5:6379"),  # RAY_ADDRESS
    ("local", True, [], "the Ray cluster at 10.0.0.5:6379"),  # connected before (a Ray task): kept as it is
])
def test_a_session_starts_a_ray_of_its_own_for_local_and_leaves_ray_as_it_found_it(monkeypatch, address, before,
                                                                                   calls, text):
    fake = FakeRay(before)
    monkeypatch.setattr(cluster, "import_ray", lambda: fake)
    monkeypatch.setattr(cluster, "_check_reachable", lambda *a: None)
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    with cluster.session(address) as (ray, where):
        assert ray is fake and fake.connected
        assert where == f"{text} (CPUs: 4, GPUs: 0)"
    assert fake.calls == calls and fake.connected == before
