"""The CUDA suite: every test here is marked ``gpu`` and skipped, with the reason, without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

from fedaug.core.runtime import CUBLAS_WORKSPACE

# cuBLAS reads its workspace setting when CUDA starts: set before any test starts it, so that a deterministic test
# is deterministic whichever test ran first in its process (fedaug's entry points do the same, configure_process)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
