"""An irreducible infeasible subset read as one sentence of arithmetic: what its requirements ask
for against what its capacities allow.

The deletion filter (`iis.deletion_filter`) returns the clashing rows, and the answers listed them
without saying why they clash; the Seventh review's #15 gave the instance's stated reason (205 t
out of Port Gdansk against 190) next to an IIS that is another cut (205 t into Prague against
Hub Berlin → Prague 70 + Cross-Dock Leipzig → Prague 85 = 155), never read, with one capacity
line printing no bound. When the subset has the shape of a cut (requirement rows of one family
whose unit flows must pass capacity rows of one family), the sum is computed and written out;
otherwise nothing is claimed.
"""

from __future__ import annotations

from trex.workloads.or_data.iis import IIS
from trex.workloads.or_data.linear_model import LinearModel, Row, family_of
from trex.workloads.or_data.phrasing import join, number


def row_capacity(row: Row, model: LinearModel) -> float | None:
    """What a `<=` row with unit terms lets through at most: its right-hand side plus each
    whole-number decision's big-M at that decision's upper bound ("flow − 70 build <= 0" lets 70
    through once built). None when the row has another shape."""
    if row.sense != "<=" or row.rhs < 0:
        return None
    capacity = row.rhs
    for name, coef in row.terms:
        if coef > 0:
            if abs(coef - 1) > 1e-9:
                return None
            continue
        variable = model.variable(name)
        if not variable.integral or variable.upper is None:
            return None
        capacity += -coef * variable.upper
    return capacity


def _need(row: Row) -> float | None:
    """What a requirement row asks for: a balance or demand row with unit terms and a nonzero
    right-hand side (a negative supply at a node is a demand)."""
    if any(abs(abs(coef) - 1) > 1e-9 for _, coef in row.terms) or abs(row.rhs) <= 1e-9:
        return None
    if row.sense == "==" or (row.sense == ">=" and row.rhs > 0):
        return abs(row.rhs)
    return None


def cut_reading(found: IIS, model: LinearModel, describe) -> str:
    """ "Read together: flow balance for machinery, Prague asks for 205, but the capacities in the
    list allow at most 70 + 85 = 155 (Hub Berlin → Prague, once built; Cross-Dock Leipzig → Prague),
    50 short." for an IIS of requirement rows of one family and capacity rows of another; "" for
    any other shape, or when the sums do not show the clash. `describe(name)` gives a row's words."""
    rows = {row.name: row for row in model.rows}
    needs, caps = [], []
    for element in found.elements:
        if element.kind != "row":
            return ""
        row = rows[element.name]
        need = _need(row)
        if need is not None:
            needs.append((row, need))
            continue
        capacity = row_capacity(row, model)
        if capacity is None:
            return ""
        caps.append((row, capacity))
    if not needs or not caps or len({family_of(row.name) for row, _ in needs}) != 1:
        return ""
    if len({family_of(row.name) for row, _ in caps}) != 1:
        return ""
    total_need = sum(need for _, need in needs)
    total_cap = sum(capacity for _, capacity in caps)
    if total_cap >= total_need - 1e-9:
        return ""
    asked = (
        f"{describe(needs[0][0].name)} asks for {number(round(total_need, 4))}"
        if len(needs) == 1
        else f"the {len(needs)} requirements ask for {' + '.join(number(round(n, 4)) for _, n in needs)} = "
        f"{number(round(total_need, 4))}"
    )
    # a big-M term: the capacity counts only once its yes/no decision is 1
    switched = any(coef < 0 for row, _ in caps for _, coef in row.terms)
    allowed = " + ".join(number(round(capacity, 4)) for _, capacity in caps)
    if len(caps) > 1:
        allowed += f" = {number(round(total_cap, 4))}"
    which = join([describe(row.name) for row, _ in caps])
    return (
        f"Read together: {asked}, but the capacities in the list ({which}) allow at most {allowed}"
        + (", even with every candidate among them built or opened" if switched else "")
        + ", "
        f"{number(round(total_need - total_cap, 4))} short. No plan can close that gap, which is why the set cannot "
        "hold."
    )
