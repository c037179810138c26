"""The perf harness (profiles, saving, baselines, the gate) is a module of the package."""

pytest_plugins = ["systems.bench.pytest_plugin"]
