"""Tables, plots and pages from saved benchmark runs (`python -m systems.report`)."""

from systems.runs.history import latest_results, load_runs

__all__ = ["latest_results", "load_runs"]
