"""benchmarks/bench_pack.py (issue 62): both sides run the same cells (each side's grid directory holds every
cell, their clients counted from the records), the sides alternate, and the table gives the medians and the ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cli.test_compare_cmd import write_grid

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pack_measures_both_sides_on_the_same_cells(tmp_path):
    grid = write_grid(tmp_path, seeds=(0, 1))
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_pack.py"), "--grid", str(grid),
                           "--seeds", "0", "1", "--rounds", "2", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    alone, packed = result["runs"]["one at a time"][0], result["runs"]["packed"][0]
    assert alone["clients"] == packed["clients"] == 2 * 2 * 2 * 3  # methods x seeds x rounds x clients
    assert result["wall_ratio"] == packed["wall_s"] / alone["wall_s"]
    assert "| packed |" in proc.stdout and "packed / one at a time, wall time:" in proc.stdout
    assert proc.stderr.index("one at a time #1") < proc.stderr.index("packed #1")
