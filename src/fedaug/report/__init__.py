"""Reports: result tables (Markdown) from run summaries."""

from fedaug.report.table import results_table

__all__ = ["results_table"]
