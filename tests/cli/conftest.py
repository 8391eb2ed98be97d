"""The command-line tests see a clean environment: nothing ambient changes what they check."""

from __future__ import annotations

import pytest

from fedaug.core.version import RETIRED_ENV


@pytest.fixture(autouse=True)
def no_ambient_kernel_env(monkeypatch):
    """``FEDAUG_FFA_KERNEL`` is no longer read, but the CLI warns when it is set: unset it here
    (the tests that need it set it themselves)."""
    monkeypatch.delenv(RETIRED_ENV, raising=False)
