"""retain_freed_memory: glibc keeps freed blocks, so a training loop stops faulting in fresh pages.

Each case runs in a fresh interpreter (malloc settings are per process and cannot be undone) and counts the
minor page faults of a conv step whose activations (3.2 MB, 784 pages of 4 KiB) lie above glibc's default
mmap threshold: a property of the allocator, not a timing. With glibc's defaults a step maps such blocks
afresh and faults in each of their pages (on the 2-core Xeon, under load: 752 to 4,640 faults a step,
medians 1,536-2,320, whole activations); with the thresholds raised the blocks are reused and the median
step faults in none (0, with one step in 21 growing the heap by an activation). So the test bounds each
setting on its own scale, an activation's pages, where it compared the two counts before (retained below a
tenth of the default, which a loaded CI run missed at 9.8x): the default median step faults in at least half
an activation, the retained one less than a quarter, a margin of ~200 faults a step for whatever else a
step touches (small allocations, the kernel's bookkeeping). Each setting's figure is the median over three
processes of their median step, the processes run alternately: neither a one-off growth nor a burst of
load on one process moves it.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
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


#: pages of one activation of LOOP's step: (32, 32, 28, 28) float32
ACTIVATION_PAGES = 32 * 32 * 28 * 28 * 4 // mmap.PAGESIZE
#: processes per setting whose median steps' median the test compares
PROCESSES = 3


def faults(tuned: bool, env: dict[str, str] | None = None) -> dict:
    """One fresh process's loop: whether the thresholds were applied, and its median step's minor faults."""
    out = subprocess.run([sys.executable, "-c", LOOP, "1" if tuned else "0"], capture_output=True, text=True,
                         check=True, env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt thresholds are a glibc (Linux) feature")
def test_retained_memory_removes_page_faults_per_step():
    runs = [faults(tuned) for _ in range(PROCESSES) for tuned in (False, True)]  # alternately: load hits both
    default = statistics.median(r["faults"] for r in runs[0::2])
    tuned = statistics.median(r["faults"] for r in runs[1::2])
    assert [r["applied"] for r in runs] == [False, True] * PROCESSES
    assert default >= ACTIVATION_PAGES / 2, runs  # the median step maps an activation-sized block afresh
    assert tuned < ACTIVATION_PAGES / 4, runs  # ... and, retained, none


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
