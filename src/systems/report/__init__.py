"""Views of saved benchmark runs (`python -m systems.report`): the newest result of each case
for one GPU, two runs side by side."""

from systems.runs.history import latest_results, load_runs

__all__ = ["latest_results", "load_runs"]
