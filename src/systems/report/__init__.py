"""Tables, plots and pages from saved benchmark runs (`python -m systems.report`)."""

from systems.report.tables import end_to_end_table
from systems.runs.history import latest_results, load_runs

__all__ = ["end_to_end_table", "latest_results", "load_runs"]
