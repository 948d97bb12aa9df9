"""The instance's own reasons for a what-if's outcome, read from both plans: which rows the original
plan breaks after the change, and which limits the new plan meets that the original one did not.

The Seventh review found 5 of 8 what-if reasons generic: "the variable ... is at its bound, so
moving the bound moves the plan with it" when the optimum gains 6 of the 17 units the bound moved
(#8: the plan stops at another arc's capacity), "the original plan no longer satisfies them" with
no word on which rows or by how much (#32), "another limit takes over" without naming it (#5).
Both plans are known, so the reasons can name rows and amounts instead.
"""

from __future__ import annotations

from trex.workloads.or_data.explain import element_words, ordered_pair, variable_phrase
from trex.workloads.or_data.linear_model import LinearModel, Row
from trex.workloads.or_data.loosening import resource_row
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.phrasing import join, number

# Rows or bounds named in one reason; more are counted.
MAX_NAMED = 3


def _tight(row: Row, values: dict[str, float]) -> bool:
    activity = row.activity(values)
    return row.sense != "==" and abs(activity - row.rhs) <= 1e-6 * (1 + abs(row.rhs))


def _at(value: float, bound: float) -> bool:
    return abs(value - bound) <= 1e-6 * (1 + abs(bound))


def _used(row: Row, values: dict[str, float]) -> bool:
    return any(abs(values.get(name, 0.0)) > 1e-9 for name, _ in row.terms)


def row_words(name: str, math: MathModel) -> str:
    """ "capacity for Yard 1 → Yard 2", "load for truck 3": a row or bound by its label and elements."""
    what, whom = element_words(name, math)
    whom = ordered_pair(name, math) or whom
    return what.lower() + (f" for {whom}" if whom else "")


def broken_rows(model: LinearModel, values: dict[str, float], names: list[str], math: MathModel) -> str:
    """ "truck 1 by 75, truck 2 by 250 and truck 3 by 295": the rows of `names` in `model` that the
    plan `values` breaks, and by how much; "" when it breaks none of them."""
    rows = {row.name: row for row in model.rows}
    broken = []
    for name in names:
        row = rows.get(name)
        if row is None:
            continue
        activity = row.activity(values)
        excess = activity - row.rhs if row.sense == "<=" else row.rhs - activity if row.sense == ">=" else 0.0
        if row.sense == "==":
            excess = abs(activity - row.rhs)
        if excess > 1e-6 * (1 + abs(row.rhs)):
            _, whom = element_words(name, math)
            broken.append((excess, ordered_pair(name, math) or whom or row_words(name, math)))
    if not broken:
        return ""
    shown = [f"{who} by {number(round(excess, 4))}" for excess, who in broken[:MAX_NAMED]]
    more = len(broken) - len(shown)
    return join(shown) + (f" and {more} more" if more else "")


def limits_taking_over(
    base_model: LinearModel,
    changed_model: LinearModel,
    before: dict[str, float],
    after: dict[str, float],
    math: MathModel,
    skip: set[str] = frozenset(),
) -> str:
    """The limits the new plan meets that the original plan did not: inequality rows of the changed
    model, with a nonzero term at the new plan, binding at `after` and with room at `before`, and
    variable bounds the new plan sits at and the old one did not ("capacity for Yard 1 → Yard 2
    (92)"); "" when there are none. `skip` leaves out what the change itself moved."""
    found: list[str] = []
    old_rows = {row.name: row for row in base_model.rows}
    for row in changed_model.rows:
        if row.name in skip or not _used(row, after) or not _tight(row, after):
            continue
        if not resource_row(row, changed_model):
            continue  # a linking row ("at its limit of 0") or a count of yes/no decisions ("conflicts ... of 1")
        old = old_rows.get(row.name)
        if old is not None and _tight(old, before):
            continue
        found.append(f"{row_words(row.name, math)} at its limit of {number(round(row.rhs, 4))}")
    old_variables = {variable.name: variable for variable in base_model.variables}
    for variable in changed_model.variables:
        old = old_variables.get(variable.name)
        if variable.name in skip or old is None:
            continue
        if variable.integral and variable.upper == 1:  # a yes/no decision at 1 is a choice, not a limit reached
            continue
        now, then = after.get(variable.name, 0.0), before.get(variable.name, 0.0)
        if variable.upper is not None and abs(variable.upper) > 1e-9 and _at(now, variable.upper):
            if old.upper is None or not _at(then, old.upper):
                found.append(
                    f"{variable_phrase(variable.name, math)} at its bound of {number(round(variable.upper, 4))}"
                )
            continue
        if variable.lower > 1e-9 and _at(now, variable.lower) and not _at(then, old.lower):
            # a minimum the new plan falls back to ("the parks minimum of 7", the Seventh review's #5)
            found.append(f"{variable_phrase(variable.name, math)} at its minimum of {number(round(variable.lower, 4))}")
    if not found:
        return ""
    more = len(found) - MAX_NAMED
    return join(found[:MAX_NAMED]) + (f" and {more} more" if more > 0 else "")
