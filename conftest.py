"""Collection rules for the whole repository (``testpaths`` covers ``tests`` and ``src/fedaug``), and
two checks of the session: it leaves no new file in the checkout (:mod:`tests.checkout`), and every test it
collected reported an outcome (:mod:`tests.completeness`)."""

from __future__ import annotations

import importlib.util
import os

# Every test runs at the config's default of two torch threads (tests/conftest.py: the recorded numbers depend on the
# thread count), and `make test` runs two pytest-xdist processes on CI's two cores: four OpenMP threads on two cores.
# At libgomp's default wait policy a thread that reaches a barrier first spins for up to 300,000 iterations before it
# sleeps, spinning on the core its partner (or the other process's thread) needs: tests/engine took 776 s on two
# cores, 387 s with waiting threads asleep at once (PASSIVE; docs/engine.md, "Sharing the cores"). The policy changes
# when a thread waits, never how work is split, so every number stays bit for bit. libgomp reads it when torch loads
# it: here, before the first `import torch` of the session and of each xdist process (which inherit this environment),
# and of every process a test starts.
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
