"""Reports: result tables, comparison grids (``fedaug compare``) and HTML/Markdown reports
(``fedaug report``); see docs/compare_and_report.md."""

from fedaug.report.grid import GridSpec, grid_from_args, load_grid, parse_grid
from fedaug.report.page import write_report
from fedaug.report.results import load_results, summarize
from fedaug.report.runner import run_grid
from fedaug.report.table import results_table, write_tables

__all__ = ["GridSpec", "grid_from_args", "load_grid", "load_results", "parse_grid", "results_table", "run_grid",
           "summarize", "write_report", "write_tables"]
