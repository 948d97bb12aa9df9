"""Writing a `LinearModel` as a CPLEX LP file.

The subset written is the one SCIP, HiGHS, Gurobi and CPLEX all read: `Maximize`/`Minimize`,
`Subject To`, `Bounds`, `General`, `Binary`, `End`, with expressions wrapped onto continuation
lines below 200 characters (CPLEX's documented line limit is 560; some readers are stricter).
"""

from __future__ import annotations

from trex.workloads.or_data.linear_model import LinearModel

MAX_LINE = 200


def format_number(value: float) -> str:
    """`3.0` -> `3`, `0.1` -> `0.1`: integers without a decimal point, others as Python's
    shortest round-tripping repr, so the file reproduces the model's coefficients exactly."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _expression(terms: tuple[tuple[str, float], ...], fallback_variable: str) -> list[str]:
    if not terms:
        return [f"0 {fallback_variable}"]
    pieces = []
    for index, (name, coef) in enumerate(terms):
        sign = "-" if coef < 0 else "+"
        magnitude = abs(coef)
        text = name if magnitude == 1 else f"{format_number(magnitude)} {name}"
        if index == 0:
            pieces.append(text if sign == "+" else f"- {text}")
        else:
            pieces.append(f"{sign} {text}")
    return pieces


def _wrap(head: str, pieces: list[str], tail: str = "") -> list[str]:
    lines, current = [], head
    for piece in [*pieces, tail] if tail else pieces:
        if len(current) + 1 + len(piece) > MAX_LINE and current.strip():
            lines.append(current)
            current = "   " + piece
        else:
            current = f"{current} {piece}" if current else piece
    lines.append(current)
    return lines


def write_lp(model: LinearModel) -> str:
    """The LP file text of `model` (names verbatim; they are LP identifiers by construction)."""
    first = model.variables[0].name
    lines = [f"\\ {model.name}", "Maximize" if model.sense == "maximize" else "Minimize"]
    lines += _wrap(" obj:", _expression(model.objective, first))
    lines.append("Subject To")
    sense_text = {"<=": "<=", ">=": ">=", "==": "="}
    for row in model.rows:
        lines += _wrap(
            f" {row.name}:", _expression(row.terms, first), f"{sense_text[row.sense]} {format_number(row.rhs)}"
        )
    bounds = []
    for variable in model.variables:
        if variable.kind == "binary":
            continue
        if variable.upper is None:
            if variable.lower != 0:
                bounds.append(f" {variable.name} >= {format_number(variable.lower)}")
        else:
            bounds.append(f" {format_number(variable.lower)} <= {variable.name} <= {format_number(variable.upper)}")
    if bounds:
        lines += ["Bounds", *bounds]
    general = [variable.name for variable in model.variables if variable.kind == "integer"]
    binary = [variable.name for variable in model.variables if variable.kind == "binary"]
    if general:
        lines.append("General")
        lines += _wrap("", general)
    if binary:
        lines.append("Binary")
        lines += _wrap("", binary)
    lines.append("End")
    return "\n".join(lines) + "\n"
