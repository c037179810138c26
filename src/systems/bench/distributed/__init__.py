"""Benchmarks of data-parallel training and all-reduce (`systems dist`), run on every rank."""
