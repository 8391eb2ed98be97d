"""Collection rules for the whole repository (``testpaths`` covers ``tests`` and ``src/fedaug``), and
two checks of the session: it leaves no new file in the checkout (:mod:`tests.checkout`), and every test it
collected reported an outcome (:mod:`tests.completeness`)."""

from __future__ import annotations

import importlib.util
import os

# Two pytest-xdist processes of two torch threads each (tests/conftest.py: the recorded numbers are at two) share
# CI's two cores; at libgomp's default a waiting thread spins on the core another needs. PASSIVE sleeps instead:
# when a thread waits changes, not how work is split, so every number stays bit for bit (docs/engine.md, "Sharing
# the cores", has the figures). libgomp reads it as torch loads: set before the session's first `import torch`;
# the xdist processes and every process a test starts inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

pytest_plugins = ("tests.checkout", "tests.completeness")

# The Flower adapter's modules import Flower (the ``flower`` extra, which ``make test`` installs);
# without it their doctests cannot be imported, and its tests skip themselves, saying why. Likewise the
# FFA layer's Triton kernel and triton (the ``gpu`` extra).
collect_ignore_glob = ([] if importlib.util.find_spec("flwr") else ["src/fedaug/engine/flower/*"]) + (
    [] if importlib.util.find_spec("triton") else ["src/fedaug/layers/triton_ffa.py"])

# Ray (the loopback cluster of tests/ray_cluster.py, Flower's simulation runtime) stays on this machine's
# loopback address and sends nothing anywhere: Ray otherwise names a node by the address of the interface that
# routes to the internet (and connects a driver to it even when given 127.0.0.1), and reports usage statistics.
# Ray reads both when it is first imported; the CLI runs the tests start inherit them.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 0: Ray's single-host mode, nodes on 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray starts its worker processes (actors, tasks) at niceness 15, below everything else on the machine; beside
# the other pytest-xdist process, whose torch threads fill both cores of CI, they got a few per cent of a core and
# the Ray tests ran 15-20x slower than alone (459 s against 26 s for one of them): here they run at the tests' own.
os.environ.setdefault("RAY_worker_niceness", "0")

# Without a CUDA device (CI), Triton kernels (the FFA layer's CUDA kernel, fedaug.layers.triton_ffa) run on
# CPU tensors under Triton's interpreter. Triton reads the variable when it is first imported, so it is set
# here, before any test imports it; with a GPU it stays unset and the same tests run the compiled kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
