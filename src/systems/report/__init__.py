"""Tables, plots and pages from saved benchmark runs (`python -m systems.report`)."""

from systems.report.history import latest_results, load_runs
from systems.report.tables import end_to_end_table

__all__ = ["end_to_end_table", "latest_results", "load_runs"]
