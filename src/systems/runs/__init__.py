"""Saved runs: the schema and keys, reading and combining runs, baselines, drift and the gate."""
