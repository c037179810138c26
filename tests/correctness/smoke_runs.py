"""Real, saved smoke runs of the end-to-end perf suite, for tests of history tools."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def save_smoke_runs(storage: Path, runs: list[tuple[str, str]],
                    module: str = "tests/perf/test_end_to_end.py") -> None:
    """For each (save name, -k selection), run the module's smoke perf cases, save to storage."""
    # pytest-benchmark disables itself when it sees xdist's variables: don't pass them on.
    # The runs are CPU runs wherever the tests run, so their device and storage are known.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    for name, selection in runs:
        subprocess.run(
            [sys.executable, "-m", "pytest", str(ROOT / module), "-q",
             "-p", "no:cacheprovider", "--perf-profile=smoke", "-k", selection,
             f"--benchmark-storage=file://{storage}", f"--benchmark-save={name}"],
            check=True, capture_output=True, cwd=ROOT, env=env,
        )
