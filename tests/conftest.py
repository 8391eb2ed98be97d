"""Shared fixtures: a tiny synthetic config that trains in well under a second per round, and the
tiny grid of tests/report/conftest.py finished once per session."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fedaug.config.schema import RunConfig, validate
from fedaug.core import plugins
from fedaug.core.typecheck import fits, is_numeric
from fedaug.data.registry import DATASETS, option_types
from fedaug.layers import kernel
from fedaug.methods.recipe import METHODS
from fedaug.models.registry import MODELS
from fedaug.report.runner import run_grid


#: the config's default ``threads``
DEFAULT_THREADS = validate({"data": {"name": "synthetic"}, "model": {"name": "small_cnn"}}).threads


@pytest.fixture(autouse=True)
def default_threads() -> None:
    """Every test starts at the config's default thread count (``threads = 2``), whatever cores pytest
    was given: runs a test starts in-process (``run_experiment``, ``sim.run``) then compute as the CLI
    runs (which set ``cfg.threads``) do, also under ``taskset -c 0`` (torch's default there is one
    thread, and float results depend on the thread count)."""
    torch.set_num_threads(DEFAULT_THREADS)


def tiny_raw(**train: Any) -> dict[str, Any]:
    """A nested config dict for a 3-client synthetic run with a narrow small CNN."""
    return {
        "seed": 7,
        "data": {"name": "synthetic", "options": {"num_clients": 3, "samples_per_client": 48,
                                                   "num_classes": 4, "size": 8}},
        "model": {"name": "small_cnn", "options": {"width": 8}},
        "train": {"rounds": 3, "local_steps": 3, "batch_size": 16, "lr": 0.05, **train},
        "eval": {"every": 1},
        "checkpoint_every": 1,
    }


#: values no number option accepts
NON_FINITE = (math.nan, math.inf, -math.inf)


def imports_torch_dynamo(code: str) -> bool:
    """Whether ``code``, run in a fresh Python process from the repository root, leaves ``torch._dynamo``
    imported (which torch's optimisers do, 4-6 CPU-seconds of a process: docs/engine.md)."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print('torch._dynamo' in sys.modules)"],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1]).stdout.split()
    return out[-1] == "True"


def numeric_options(fn: Callable[..., Any], *, fractional: bool) -> list[str]:
    """The options of ``fn`` (a registered builder or component ``__init__``) that take numbers, read
    from its annotations: with ``fractional`` those that accept 0.5, else the counts (integers only)."""
    return [k for k, tp in option_types(fn).items() if is_numeric(tp) and fits(1, tp) and fits(0.5, tp) == fractional]


@pytest.fixture
def tiny_cfg(tmp_path) -> RunConfig:
    raw = tiny_raw()
    raw["out_dir"] = str(tmp_path / "runs")
    return validate(raw)


@pytest.fixture(scope="session")
def tiny_grid(tmp_path_factory) -> Path:
    """The output directory of the finished tiny grid (read-only for tests: copy before changing it)."""
    from tests.report.conftest import tiny_spec

    out = tmp_path_factory.mktemp("grid") / "tiny"
    run_grid(tiny_spec(), out)
    return out


@pytest.fixture
def needs_kernel() -> None:
    """Build or load the FFA layer's compiled kernel; skip the test, saying why, where that fails
    (no C++ compiler): only ``kernel = "on"`` needs it."""
    try:
        kernel.restyle_op()
    except kernel.KernelBuildError as exc:
        pytest.skip(f"the compiled FFA kernel cannot be built here, so kernel='on' is untested: {exc}")


#: mark for the tests that run the compiled FFA kernel
requires_kernel = pytest.mark.usefixtures("needs_kernel")


@pytest.fixture
def server_library() -> None:
    """Build or load the compiled server library (fedaug.core.server_ops); skip the test, saying why,
    where that fails (no C++ compiler): runs then take its PyTorch path, which the other tests cover."""
    from fedaug.core import native, server_ops

    try:
        server_ops.build()
    except native.KernelBuildError as exc:
        pytest.skip(f"the compiled server library cannot be built here, so its path is untested: {exc}")
    server_ops._STATE.clear()  # looked up again, now that it is built
    assert server_ops.loaded() is not None


@pytest.fixture
def local_sgd_library() -> None:
    """Build or load the compiled SGD step (fedaug.core.local_sgd); skip the test, saying why, where that
    fails (no C compiler): clients then step with torch.optim.SGD, which the other tests cover."""
    from fedaug.core import local_sgd, native

    try:
        local_sgd.build()
    except native.KernelBuildError as exc:
        pytest.skip(f"the compiled SGD step cannot be built here, so its path is untested: {exc}")
    local_sgd._STATE.clear()  # looked up (and probed) again, now that it is built
    assert local_sgd.loaded() is not None, "the compiled SGD step was built but does not give torch's bits"


@pytest.fixture
def no_server_library(monkeypatch) -> None:
    """Runs the server's PyTorch path, as where the compiled library is not built."""
    from fedaug.core import server_ops

    monkeypatch.setitem(server_ops._STATE, "ops", None)


@pytest.fixture(params=["compiled", "pytorch"])
def server_path(request) -> str:
    """Each test using it runs on both of the server's paths (the compiled library, PyTorch)."""
    request.getfixturevalue("server_library" if request.param == "compiled" else "no_server_library")
    return request.param


@pytest.fixture
def own_registries(monkeypatch, tmp_path) -> Iterator[None]:
    """For a test whose own module (written under ``tmp_path``) registers datasets, models or methods in
    this process: the registries, the installed plugins' state and ``sys.modules`` as they were, after
    the test, so that the other tests never see what it registered."""
    for registry in (METHODS, DATASETS, MODELS):
        monkeypatch.setattr(registry, "_items", dict(registry._items))
        monkeypatch.setattr(registry, "_help", dict(registry._help))
    monkeypatch.setitem(plugins._STATE, "group_loaded", False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def uses_ray(item: pytest.Item | None) -> bool:
    """Whether ``item`` is a test on the loopback Ray cluster (it uses :func:`ray_cluster`)."""
    return item is not None and "ray_cluster" in getattr(item, "fixturenames", ())


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the runs the tests start: a suite started in the background by a non-interactive shell
    (``make test &`` in a script) ignores SIGINT, and its child processes would inherit that, so the tests
    that interrupt a run would see it finish instead; this process takes Python's own handler back (an
    ignored signal stays ignored across ``exec``, a handled one is reset to the default)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the loopback Ray cluster run first, together, in their order, those that kill its worker
    node (:func:`breakable_ray`) last of them: the cluster runs for them alone (:func:`pytest_runtest_teardown`
    stops it after the last), and under ``pytest -n`` (``make test``) they head the first process's share,
    where work stealing, which takes from the end of a process's queue, leaves them together. The ``slow``
    tests (a minute or more each) come next, so that under ``pytest -n`` none of them is left to end the run
    on one process while the others wait."""
    def rank(item: pytest.Item) -> int:
        if uses_ray(item):
            return 1 if "breakable_ray" in item.fixturenames else 0
        return 2 if item.get_closest_marker("slow") is not None else 3

    items.sort(key=rank)  # stable: the collection's order within each rank


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the loopback Ray cluster after a test on it that this process follows with none (it would idle,
    about 3 CPU-seconds a minute, under the rest of the suite); a later one starts it again."""
    cluster = item.funcargs.get("ray_cluster") if uses_ray(item) and not uses_ray(nextitem) else None
    if cluster is not None:  # None: the test was skipped before the fixture (no Ray), or is not on the cluster
        cluster.down()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The loopback Ray cluster (a head and a worker node: tests/ray_cluster.py), started by :func:`on_ray`
    and stopped by :func:`pytest_runtest_teardown`, or at the latest when the session ends."""
    pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install 'fedaug[ray]' (make setup "
                                      "installs it)")
    from tests.ray_cluster import LoopbackCluster

    cluster = LoopbackCluster()
    yield cluster
    cluster.down()


@pytest.fixture
def on_ray(ray_cluster) -> Any:
    """The loopback Ray cluster running, with a worker node, this process connected to it."""
    return ray_cluster.up()


@pytest.fixture
def breakable_ray(on_ray) -> Any:
    """:func:`on_ray` for a test that kills the worker node: it runs after the other Ray tests
    (:func:`pytest_collection_modifyitems`), so that no node is started again unless a later test needs it."""
    return on_ray
