"""The README's Python quickstart runs as written, and its main-job figures are those of the record of the current
code's main job (``results/main_digits4.json``, written by ``experiments/main_job.py``; issues 50 and 61)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.experiments.scripts import load_script

README = Path(__file__).parents[2] / "README.md"


def test_readme_python_quickstart_runs(tmp_path):
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    script = tmp_path / "quickstart.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "'test_acc'" in out.stdout


# --- the main job's figures (issues 50, 61): the record of the current code's run ---------------------

def test_the_readme_figures_are_the_main_job_record():
    """The README's block of figures is what experiments/main_job.py writes from the record: the table of the
    entry the record names, where (commit, CPU, capability, threads) and how long it ran, the other entries."""
    main_job = load_script("main_job")
    record = json.loads(main_job.RECORD.read_text())
    text = README.read_text()
    assert main_job.with_block(text, main_job.readme_block(record)) == text
    table = main_job.table(record["machines"][record["readme"]])
    assert table[0] == "| test accuracy, final round (%) | mnist | usps_like | mnistm_like | synth_like | mean | worst client |"


def test_the_record_is_of_make_runs_cells_and_names_its_code(tmp_path):
    """Every entry of the record is of the cells `make run` computes today (the same resolved configs), names its
    commit and date, and is filed under its CPU model, capability and thread count."""
    from fedaug.report.runner import config_key

    main_job = load_script("main_job")
    cells = main_job.main_cells(tmp_path)
    record = json.loads(main_job.RECORD.read_text())
    assert record["grid"] == main_job.GRID and record["readme"] in record["machines"]
    for key, entry in record["machines"].items():
        assert key == main_job.machine_key(entry["cpu"], entry["cpu_capability"], entry["threads"])
        assert entry["cells"].keys() == cells.keys()
        for label, cell in entry["cells"].items():
            assert cell["config_key"] == config_key(cells[label].raw), (key, label)
            assert len(cell["records"]) == main_job.ROUNDS
        assert re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"]) and re.fullmatch(r"\d{4}-\d\d-\d\d", entry["date"])


def test_the_readme_table_renders_differences_to_the_first_row():
    """Golden values: two cells of two clients; the second row's mean and worst carry their difference to the
    first's in percentage points."""
    main_job = load_script("main_job")
    entry = {"cells": {"A": {"test_acc": {"x": 0.5, "y": 0.25}, "mean_test_acc": 0.375},
                       "B": {"test_acc": {"x": 0.40, "y": 0.35}, "mean_test_acc": 0.375 + 0.0001}}}
    assert main_job.table(entry) == [
        "| test accuracy, final round (%) | x | y | mean | worst client |",
        "|---|---:|---:|---:|---:|",
        "| A | 50.00 | 25.00 | 37.50 | 25.00 |",
        "| B | 40.00 | 35.00 | 37.51 (+0.01) | 35.00 (+10.00) |",
    ]
