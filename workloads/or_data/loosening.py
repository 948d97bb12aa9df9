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

from trex.workloads.or_data.linear_model import LinearModel, Row, family_of
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


def count_row(row: Row, model: LinearModel) -> bool:
    """A count of yes/no decisions ("at most one of a conflicting pair", "cover each zone at least
    once"): every coefficient 1 (or every one -1) on a binary decision, a nonzero limit, not an
    equation. One more unit of such a limit would change the rule, so the rule is priced by
    dropping it instead."""
    if row.sense == "==" or not row.terms:
        return False
    if not all(abs(abs(coef) - 1) <= 1e-9 and _binary(model.variable(name)) for name, coef in row.terms):
        return False
    if abs(row.rhs) <= 1e-9:  # "x_a - x_b <= 0": a prerequisite (a only with b) is a rule too
        return _implication(row)
    return len({coef > 0 for _, coef in row.terms}) == 1


def _implication(row: Row) -> bool:
    """`x_a - x_b <= 0` (or `x_b - x_a >= 0`) between two decisions of one kind: one item only together
    with another (a prerequisite). A row tying two kinds (`covered_z - build_s <= 0`) defines one by
    the other; dropping it would count a zone as covered for free, which prices nothing."""
    if len(row.terms) != 2 or sorted(coef for _, coef in row.terms) != [-1.0, 1.0]:
        return False
    return len({family_of(name) for name, _ in row.terms}) == 1


def _binary(variable) -> bool:
    return variable.kind == "binary" or (variable.integral and variable.upper is not None and variable.upper <= 1)


def dropped_optimum(model: LinearModel, row: Row) -> float | None:
    """The optimum of `model` without `row`; None when the re-solve does not end optimal."""
    dropped = replace(model, rows=tuple(r for r in model.rows if r.name != row.name))
    result = solve_model(dropped)
    return result.objective if result.status == "optimal" else None


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
    plan `values`; `label(name)` gives the row's words. The budget left over goes to binding counts
    of yes/no decisions, each priced by re-solving without it (`rule_sentence`: what the rule costs).
    Empty when no binding row is either."""
    rows = {row.name: row for row in model.rows}
    optimum = model.objective_value(values)
    sentences = []
    resources = [name for name in binding if resource_row(rows[name], model)][:MAX_LOOSENED]
    rules = [name for name in binding if count_row(rows[name], model)][: MAX_LOOSENED - len(resources)]
    for name in rules:
        sentence = rule_sentence(model, rows[name], optimum, label(name))
        if sentence:
            sentences.append(sentence)
    for name in resources:
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


def rule_sentence(model: LinearModel, row: Row, optimum: float, words: str) -> str:
    """What a binding count of yes/no decisions costs, measured by re-solving without it: "Dropping
    the rule on conflicts for data center and safety audit (at most 1 of its 2 yes/no decisions)
    raises the optimum from 1,080 to 1,140: the rule costs 60." ("" when the re-solve fails)."""
    moved = dropped_optimum(model, row)
    if moved is None:
        return ""
    limit = number(round(abs(row.rhs), 6))
    count = len(row.terms)
    bound = "at most" if (row.sense == "<=") == (row.rhs > 0) else "at least"
    if _implication(row):
        rule = "one yes/no decision only together with the other"
        keys = row.name.split("__")[1:]
        first = next(name for name, coef in row.terms if (coef > 0) == (row.sense == "<="))  # the one that needs
        second = next(name for name, _ in row.terms if name != first)
        if keys == first.split("__")[1:] + second.split("__")[1:]:  # the row names them in that order
            rule = "the first only together with the second"
    elif count == 1:
        rule = f"its only yes/no decision must be {limit}" if bound == "at least" else f"at most {limit}"
    else:
        rule = f"{bound} {limit} of its {count} yes/no decisions"
    head = f"Dropping the rule on {words} ({rule})"
    if _math.isclose(moved, optimum, rel_tol=1e-7, abs_tol=1e-6):
        return (
            f"{head} leaves the optimum at {number(round(optimum, 4))}: the plan meets the rule exactly, but the rule "
            "costs nothing here."
        )
    gain = moved - optimum if model.sense == "maximize" else optimum - moved
    if gain <= 0:  # dropping a row can only help; a worse re-solve (a node limit) is not reported
        return ""
    verb = "raises" if moved > optimum else "lowers"
    return (
        f"{head} {verb} the optimum from {number(round(optimum, 4))} to {number(round(moved, 4))}: the rule costs "
        f"{number(round(gain, 4))}."
    )
