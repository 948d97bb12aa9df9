"""Real layouts of a program's data block, so the programs do not all hold their data one way.

The families write every parameter as one literal (`usage = {('malt', 'IPA'): 6, ...}`). People
keep the same data in other shapes and build the lookup the model uses from them; `relayout`
rewrites the data block in one of these layouts, leaving the model code untouched (every name the
model reads keeps its value, key order included):

| layout | a two-key table (`usage[r, p]`) | a value per element of a listed set (`profit[p]`) |
| --- | --- | --- |
| literal | one dict literal with tuple keys | one dict literal |
| rows | a nested dict, one row per first key, flattened by a comprehension | `dict(zip(products, [...]))` |
| records | a list of `(first, second, value)` records, turned into a dict | one dict literal |

A table whose first keys are not contiguous keeps its literal under `rows` (regrouping would
change the key order, and with it the order the model adds its rows and variables). The
restyled program is what verification runs in the sandbox, so each layout is checked like the
original.
"""

from __future__ import annotations

import ast
import functools
import re

from trex.workloads.or_data.program import literal

LAYOUTS = ("literal", "rows", "records")
_BLOCK = re.compile(r"^# Data\n(.*?)\n\n", re.S | re.M)


def _scalar(value: object) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _table(value: object) -> bool:
    """A non-empty dict keyed by pairs of plain keys, with numbers as values."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(key, tuple) and len(key) == 2 and all(_scalar(k) for k in key) for key in value)
        and all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in value.values())
    )


def _contiguous(table: dict) -> bool:
    """Whether each first key's entries come together (so grouping by it keeps the key order)."""
    seen: list[object] = []
    for first, _ in table:
        if not seen or seen[-1] != first:
            if first in seen:
                return False
            seen.append(first)
    return True


def _rows(name: str, table: dict) -> str:
    nested: dict[object, dict[object, object]] = {}
    for (first, second), item in table.items():
        nested.setdefault(first, {})[second] = item
    return (
        f"{name}_rows = {literal(nested)}\n"
        f"{name} = {{(a, b): value for a, row in {name}_rows.items() for b, value in row.items()}}"
    )


def _records(name: str, table: dict) -> str:
    records = [(first, second, item) for (first, second), item in table.items()]
    return f"{name}_records = {literal(records)}\n{name} = {{(a, b): value for a, b, value in {name}_records}}"


@functools.lru_cache(maxsize=64)  # verification lays out the same program once per library it tries
def relayout(program: str, layout: str) -> str:
    """`program` with its data block in `layout` (see the module docstring); unchanged for
    "literal" or when the block is not a sequence of literal assignments."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown data layout {layout!r}; valid: {', '.join(LAYOUTS)}")
    match = _BLOCK.search(program)
    if layout == "literal" or match is None:
        return program
    try:
        tree = ast.parse(match.group(1))
    except SyntaxError:
        return program
    lines = match.group(1).split("\n")
    lists: dict[str, list] = {}
    statements = []
    changed = False
    for statement in tree.body:
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and statement.col_offset == 0
        ):
            return program
        name = statement.targets[0].id
        text = "\n".join(lines[statement.lineno - 1 : statement.end_lineno])  # the statement's own lines
        if not isinstance(statement.value, (ast.Dict, ast.List)):  # scalars and strings stay as written
            statements.append(text)
            continue
        try:
            value = ast.literal_eval(statement.value)
        except ValueError:
            return program
        if isinstance(value, list):
            lists[name] = value
        if _table(value) and layout == "records":
            text, changed = _records(name, value), True
        elif _table(value) and layout == "rows" and _contiguous(value):
            text, changed = _rows(name, value), True
        elif layout == "rows" and isinstance(value, dict) and value:
            keys = list(value)
            source = next((list_name for list_name, items in lists.items() if items == keys), None)
            numbers = all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in value.values())
            if source is not None and numbers:
                text, changed = f"{name} = dict(zip({source}, {literal(list(value.values()))}))", True
        statements.append(text)
    if not changed:
        return program
    block = "\n".join(statements)
    return program[: match.start(1)] + block + program[match.end(1) :]
