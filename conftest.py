"""Collection rules for the whole repository (``testpaths`` covers ``tests`` and ``src/fedaug``), and
the check that a test session leaves no new file in the checkout (:mod:`tests.checkout`)."""

from __future__ import annotations

import importlib.util
import os

import torch

from tests.checkout import pytest_sessionfinish, pytest_sessionstart  # noqa: F401  (hooks of this conftest)

# The Flower adapter's modules import Flower (the ``flower`` extra, which ``make test`` installs);
# without it their doctests cannot be imported, and its tests skip themselves, saying why. Likewise the
# FFA layer's Triton kernel and triton (the ``gpu`` extra).
collect_ignore_glob = ([] if importlib.util.find_spec("flwr") else ["src/fedaug/engine/flower/*"]) + (
    [] if importlib.util.find_spec("triton") else ["src/fedaug/layers/triton_ffa.py"])

# Without a CUDA device (CI), Triton kernels (the FFA layer's CUDA kernel, fedaug.layers.triton_ffa) run on
# CPU tensors under Triton's interpreter. Triton reads the variable when it is first imported, so it is set
# here, before any test imports it; with a GPU it stays unset and the same tests run the compiled kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
