"""Perf cases as plain, JSON-ready parameters.

A perf test takes one dataclass (`perf_case`); pytest-benchmark would save it as
"UNSERIALIZABLE[...]". Its fields, flattened, are what `--benchmark-group-by=param:NAME`
and `pytest-benchmark compare --group-by param:NAME` need.
"""

from __future__ import annotations

import dataclasses
import enum

Plain = None | bool | int | float | str | list["Plain"]


def plain_value(value: object) -> Plain:
    """JSON-ready form: tuples and lists become lists, enums their value, anything else
    that is not a number, bool, string or None its str() (e.g. torch.float32)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [plain_value(v) for v in value]
    if isinstance(value, enum.Enum):
        return plain_value(value.value)
    return str(value)


def flatten_case(case: object) -> dict[str, Plain]:
    """A dataclass case's fields; nested dataclasses are flattened into the same dict, with
    the outer field's name as prefix only where a name would repeat."""
    if not dataclasses.is_dataclass(case) or isinstance(case, type):
        raise TypeError(f"a perf case must be a dataclass instance, got {type(case).__name__}")
    flat: dict[str, Plain] = {}
    nested: list[tuple[str, object]] = []
    for field in dataclasses.fields(case):
        value = getattr(case, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            nested.append((field.name, value))
        else:
            flat[field.name] = plain_value(value)
    for outer, value in nested:
        for name, inner in flatten_case(value).items():
            flat[f"{outer}_{name}" if name in flat else name] = inner
    return flat
