"""Device-time rounds a case took in turn with its rivals (`keys.INTERLEAVED_DEVICE_MS`), as
a saved run holds them: each round's two times were taken moments apart, so a ratio of ours
and a rival is formed per round. The claims of the results page and the docs' attention
blocks read them here."""

from __future__ import annotations

from systems.runs import keys
from systems.runs.history import Result


def rounds_in_turn(r: Result) -> dict[str, list[float]] | None:
    """{implementation: ms per round} of a case that took device-time rounds in turn with
    its own implementation among them (`keys.INTERLEAVED_DEVICE_MS`); None otherwise."""
    rounds = r.get(keys.INTERLEAVED_DEVICE_MS)
    if not isinstance(rounds, dict) or str(r.get(keys.IMPLEMENTATION)) not in rounds:
        return None
    return {str(name): [float(ms) for ms in per_round] for name, per_round in rounds.items()}


def round_ratios(rounds: dict[str, list[float]], ours: str, rival: str) -> list[float]:
    """Ours / rival in each round taken in turn."""
    return [o / t for o, t in zip(rounds[ours], rounds[rival], strict=True)]
