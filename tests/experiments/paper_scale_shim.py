"""``python paper_scale_shim.py SCRIPT ARGS...`` runs SCRIPT as ``python SCRIPT ARGS...`` would, for
tests/experiments/test_paper_scale.py's calls of benchmarks/paper_scale_gpu.sh (its ``PYTHON``), with one
thing fixed: time is counted in readings of :class:`~tests.report.conftest.TickClock`, :data:`STEP` seconds a
reading, so that where a time limit stops the grid does not depend on the machine's speed (a call keeps 20 s for
its tarball and starts no grid with less than 30 s left: in readings of 4 s, a limit of about 30 s stops a pack
after two or three rounds).
"""

from __future__ import annotations

import runpy
import sys
from types import SimpleNamespace

#: seconds a reading of the clock
STEP = 4.0


if __name__ == "__main__":
    from fedaug.report import deadline
    from tests.report.conftest import TickClock

    deadline.time = SimpleNamespace(time=TickClock(STEP))  # type: ignore[attr-defined]
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
