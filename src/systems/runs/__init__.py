"""Saved runs: the schema and keys, reading and combining runs, baselines and the gate."""
