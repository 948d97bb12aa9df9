"""Pieces of the pyscipopt programs the families write: data literals and the common ending.

Every program follows one layout, which the bug injector (`bugs`) and the judge rely on:

    from pyscipopt import Model, quicksum

    # Data
    <name> = <literal>                       one assignment per set or parameter

    model = Model("<family>")

    # <what the variables are>
    <var> = {<key>: model.addVar(vtype="C", lb=0, name=...) for ...}

    # <label>: <what the constraint says>    one commented block per constraint family
    for ...:
        model.addCons(<lhs> <= <rhs>, name=...)

    # Objective: <what it is>
    model.setObjective(<expression>, sense="minimize")

    <the ending: optimize, print the objective marker or the status, print nonzero decisions>

The objective line `Optimal objective value: <value>` is the marker the OR evaluator's
extraction reads (`trex.workloads.or_eval.extraction`); infeasible and unbounded programs print
the status word in its place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

OBJECTIVE_MARKER = "Optimal objective value"
HEADER = "from pyscipopt import Model, quicksum\n"
_WIDTH = 96


def identifier(words: str) -> str:
    """A Python name for a noun phrase: "distribution centers" -> "distribution_centers"."""
    return "_".join(words.lower().replace("-", " ").split())


def literal(value: object, indent: int = 0) -> str:
    """A Python literal for lists, dicts (tuple keys too) and numbers, one entry per line when
    it does not fit on one line."""
    flat = _flat(value)
    if len(flat) + indent <= _WIDTH or not isinstance(value, (dict, list, tuple)):
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        entries = [f"{pad}{_flat(key)}: {literal(item, indent + 4)}," for key, item in value.items()]
        return "{\n" + "\n".join(entries) + "\n" + " " * indent + "}"
    entries = [f"{pad}{literal(item, indent + 4)}," for item in value]
    return "[\n" + "\n".join(entries) + "\n" + " " * indent + "]"


def _flat(value: object) -> str:
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flat(key)}: {_flat(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(item) for item in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_flat(item) for item in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def data_block(assignments: Sequence[tuple[str, object]] | Mapping[str, object]) -> str:
    items = assignments.items() if isinstance(assignments, Mapping) else assignments
    lines = ["# Data"]
    for name, value in items:
        lines.append(f"{name} = {literal(value, 0)}")
    return "\n".join(lines) + "\n"


def ending(report: Sequence[str]) -> str:
    """Solve, then print the objective marker (or the status) and the nonzero decisions.
    `report` are lines of the optimal branch, indented by four spaces, that may call `show`."""
    body = "\n".join(f"    {line}" for line in report)
    return f'''model.hideOutput()
model.optimize()


def show(label, var):
    level = model.getVal(var)
    if abs(level) > 1e-6:
        print(f"{{label}} = {{level:.10g}}")


status = model.getStatus()
if status == "optimal":
    print(f"{OBJECTIVE_MARKER}: {{model.getObjVal():.10g}}")
{body}
else:
    print(f"{OBJECTIVE_MARKER}: {{status}}")
'''


def assemble(
    name: str, data: Sequence[tuple[str, object]] | Mapping[str, object], body: str, report: Sequence[str]
) -> str:
    """A whole program: header, data, `model = Model(name)`, the family's body, the ending."""
    return "\n".join([HEADER, data_block(data), f'model = Model("{name}")\n', body.strip("\n") + "\n", ending(report)])
