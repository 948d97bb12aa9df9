"""What one more unit of a binding limit is worth in a mixed-integer program, measured by re-solving.

An LP's dual values price a binding row; a MIP has none, and the sentence the answers used to
close with ("the optimum moves in steps: loosening a binding row helps only when a whole unit
more fits") was said under every MIP, including under a binding row of continuous flows that
carries exactly the demand, where loosening can never help (the Seventh review's #19), and under
symmetry rows (#24). Here the claim is measured instead: each of a few binding resource rows is
loosened by one unit of its right-hand side and the model re-solved, and the answer states what
happened to the optimum. Only rows with all terms on one side (a capacity, a budget, a minimum)
are loosened: moving the limit of a linking or big-M row (`x - Q y <= 0`) by one unit would let a
closed option serve a unit, which changes what the row means rather than how much it allows.
"""

from __future__ import annotations

import math as _math
from dataclasses import replace

from trex.workloads.or_data.linear_model import LinearModel, Row
from trex.workloads.or_data.phrasing import number
from trex.workloads.or_data.solve import solve_model

# Binding rows loosened and re-solved per answer: each is one MIP solve of the instance.
MAX_LOOSENED = 2


def resource_row(row: Row, model: LinearModel) -> bool:
    """All coefficients of one sign and a nonzero limit: a row whose right-hand side is an amount.
    A count of yes/no decisions ("at most one of a conflicting pair", "cover each zone") is a rule,
    not an amount: one more unit of it would change the rule, so it is not loosened."""
    signs = {coef > 0 for _, coef in row.terms}
    if row.sense == "==" or len(signs) != 1 or abs(row.rhs) <= 1e-9:
        return False
    return not all(abs(abs(coef) - 1) <= 1e-9 and model.variable(name).integral for name, coef in row.terms)


def loosened_optimum(model: LinearModel, row: Row, step: float = 1.0) -> float | None:
    """The optimum with `row`'s limit moved by `step` in the direction that relaxes it; None when
    the re-solve does not end optimal."""
    rhs = row.rhs + step if row.sense == "<=" else row.rhs - step
    loosened = replace(model, rows=tuple(replace(r, rhs=rhs) if r.name == row.name else r for r in model.rows))
    result = solve_model(loosened)
    return result.objective if result.status == "optimal" else None


def loosening_sentences(model: LinearModel, values: dict[str, float], binding: list[str], label) -> list[str]:
    """One sentence per loosened binding resource row ("Loosening capacity for sewing by one unit,
    to 47, raises the optimum from 60 to 62."), for up to `MAX_LOOSENED` rows of `binding` at the
    plan `values`; `label(name)` gives the row's words. Empty when no binding row is a resource row."""
    rows = {row.name: row for row in model.rows}
    optimum = model.objective_value(values)
    sentences = []
    for name in [name for name in binding if resource_row(rows[name], model)][:MAX_LOOSENED]:
        row = rows[name]
        moved = loosened_optimum(model, row)
        if moved is None:
            continue
        limit = number(round(row.rhs + (1.0 if row.sense == "<=" else -1.0), 6))
        head = f"Loosening {label(name)} by one unit, to {limit},"
        gain = moved - optimum if model.sense == "maximize" else optimum - moved
        if _math.isclose(moved, optimum, rel_tol=1e-7, abs_tol=1e-6):
            sentences.append(
                f"{head} leaves the optimum at {number(round(optimum, 4))}: the row binds, but one more unit of it "
                "alone does not let the plan improve."
            )
        elif gain > 0:  # a loosened row can only help; a worse re-solve (a node limit) is not reported
            verb = "raises" if moved > optimum else "lowers"
            sentences.append(
                f"{head} {verb} the optimum from {number(round(optimum, 4))} to {number(round(moved, 4))}: this "
                "limit is what holds the plan back."
            )
    return sentences
