"""A minimal TOML writer for profile files (the standard library reads TOML but cannot write it).

Handles what profiles hold: nested tables of strings, numbers, booleans, lists of scalars or inline tables, and lists
of tables (`[[cluster.tiers]]`). `tomllib.loads(dumps(d)) == d` for such dicts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for everything we write
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table (inside a list of a [[table]] entry)
        return "{" + ", ".join(f"{_key(k)} = {_scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    """A bare key when TOML allows one, else a quoted key (e.g. "trex.moe_dispatch")."""
    return key if _BARE.match(key) else json.dumps(key)


def _is_table_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _emit(table: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping) and not _is_table_list(v)]
    if path and (scalars or not table):
        lines.append(f"[{'.'.join(_key(p) for p in path)}]")
    for key, value in scalars:
        lines.append(f"{_key(key)} = {_scalar(value)}")
    if scalars:
        lines.append("")
    for key, value in table.items():
        if isinstance(value, Mapping):
            _emit(value, [*path, key], lines)
        elif _is_table_list(value):
            for item in value:
                lines.append(f"[[{'.'.join(_key(p) for p in [*path, key])}]]")
                for k, v in item.items():
                    lines.append(f"{_key(k)} = {_scalar(v)}")
                lines.append("")


def dumps(data: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _emit(data, [], lines)
    return "\n".join(lines).rstrip() + "\n"
