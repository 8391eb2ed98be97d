"""retain_freed_memory: glibc keeps freed blocks, so a training loop stops faulting in fresh pages.

Each case runs in a fresh interpreter (malloc settings are per process and cannot be undone) and
counts minor page faults per step (the median step's: a one-off growth elsewhere in the process, which a
loaded machine makes likelier, leaves it alone), a property of the allocator, not a timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LOOP = """
import json, resource, sys
import torch
from fedaug.core.runtime import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "1" else False
torch.set_num_threads(1)
conv = torch.nn.Conv2d(32, 32, 3, padding=1)
x = torch.randn(32, 32, 28, 28)  # 3.2 MB activations: above glibc's default mmap threshold
def step():
    y = torch.relu(conv(x))
    y.sum().backward()
for _ in range(3):
    step()
counts = []
for _ in range(21):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": sorted(counts)[10]}))  # the median step's
"""


def faults(tuned: bool, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", LOOP, "1" if tuned else "0"], capture_output=True, text=True,
                         check=True, env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt thresholds are a glibc (Linux) feature")
def test_retained_memory_removes_page_faults_per_step():
    default, tuned = faults(False), faults(True)
    assert tuned["applied"] is True
    assert default["faults"] > 200  # every step maps fresh pages for its large tensors
    assert tuned["faults"] < default["faults"] / 10


def test_opt_out_keeps_the_defaults():
    assert faults(True, {"FEDAUG_MALLOC": "default"})["applied"] is False


def test_configure_process_sets_the_threads_and_torch_threads_restores_them():
    import torch

    from fedaug.core.errors import ConfigError
    from fedaug.core.runtime import configure_process, torch_threads

    before = torch.get_num_threads()
    try:
        configure_process(1)
        assert torch.get_num_threads() == 1
        configure_process()  # None: the thread count stays
        assert torch.get_num_threads() == 1
        with torch_threads(2):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        with pytest.raises(ConfigError, match=r"threads must be >= 1, got 0"):
            configure_process(0)
    finally:
        torch.set_num_threads(before)
