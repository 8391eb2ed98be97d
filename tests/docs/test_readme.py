"""The README's Python quickstart runs as written, and its main-job table and times are those of the
archived run it quotes, on the CPU it names (issue 50)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_readme_python_quickstart_runs(tmp_path):
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    script = tmp_path / "quickstart.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "'test_acc'" in out.stdout


# --- the main job's table (issue 50): numbers the README can stand behind ---------------------------

RESULTS = README.parent / "results" / "fedrdn_table1_digits4"
#: the README's rows -> the archived cells they quote: (setting, method) of grid fedrdn_table1_digits4, seed 0
QUOTED = {"FedAvg": ("FedAvg", "none"), "FedAvg + FedRDN": ("FedAvg", "+ FedRDN")}


def main_job_table() -> tuple[list[str], dict[str, list[str]]]:
    """The README's table of the main job: its client columns and each row's cells."""
    text = README.read_text()
    header = re.search(r"^\| test accuracy, final round \(%\) \|(.*)\|$", text, flags=re.M)
    assert header, "the README has no main-job table"
    columns = [c.strip() for c in header.group(1).split("|")]
    rows = {m.group(1): [c.strip() for c in m.group(2).split("|")]
            for m in re.finditer(r"^\| (FedAvg(?: \+ FedRDN)?) \|(.*)\|$", text, flags=re.M)}
    return columns, rows


def archived(label: str) -> Path:
    from fedaug.report.runner import cell_dir, find_run

    setting, method = QUOTED[label]
    run = find_run(cell_dir(RESULTS, setting, method, 0))
    assert run is not None and (run / "summary.json").is_file(), f"no finished archived run for {label}"
    return run


def test_the_readme_table_is_the_archived_run_it_quotes():
    columns, rows = main_job_table()
    assert columns[-2:] == ["mean", "worst client"] and set(rows) == set(QUOTED)
    clients = columns[:-2]
    base: tuple[float, float] | None = None
    for label in ("FedAvg", "FedAvg + FedRDN"):
        final = json.loads((archived(label) / "summary.json").read_text())["final"]["eval"]
        accs = [100 * final["clients"][c]["test"]["acc"] for c in clients]
        mean, worst = 100 * final["mean"]["test_acc"], min(accs)
        expected = [f"{a:.2f}" for a in accs] + [f"{mean:.2f}", f"{worst:.2f}"]
        if base is not None:
            expected[-2] += f" ({mean - base[0]:+.2f})"
            expected[-1] += f" ({worst - base[1]:+.2f})"
        assert rows[label] == expected, label
        base = (mean, worst)


def test_the_readme_names_the_cpu_and_times_of_the_archived_run_and_make_run_computes_that_run(tmp_path):
    from fedaug.config.load import read_toml
    from fedaug.engine.records.rundir import read_records
    from fedaug.report.grid import load_grid
    from fedaug.report.runner import config_mismatch, plan

    text = " ".join(README.read_text().split())
    cells = {c.method: c for c in plan(load_grid("main_digits4"), tmp_path, jobs=1)}
    seconds = []
    for label in QUOTED:
        run = archived(label)
        env = json.loads((run / "summary.json").read_text())["environment"]
        assert (f"measured on an {env['cpu']} (torch's CPU capability {env['cpu_capability']}, torch "
                f"{env['torch']}, {env['threads']} thread per run)") in text
        assert config_mismatch(read_toml(run / "config.toml"), cells[label].raw) == []  # `make run`'s own cells
        records, _ = read_records(run / "metrics.jsonl")
        seconds.append(round(sum(r["time"]["train_s"] + r["time"].get("eval_s", 0.0) for r in records)))
    assert f"train in {seconds[0]} s and {seconds[1]} s side by side on that {env['cpu']}" in text
