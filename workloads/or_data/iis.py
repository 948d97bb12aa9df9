"""An irreducible infeasible subset (IIS) of an infeasible model, by the deletion filter.

A Farkas certificate proves that a model is infeasible; it does not tell a reader which
requirements clash. An IIS does: a set of constraints and bounds that cannot hold together, while
every proper subset can. The deletion filter (Chinneck & Dravnieks 1991, "Locating minimal
infeasible constraint sets in linear programs", ORSA J. Computing 3(2)) finds one: go through
the elements once, drop each for good if the rest stays infeasible, keep it otherwise. What
remains is irreducible because dropping any kept element made the model feasible when it was
tested, and later drops only removed more.

The elements are the rows and every bound beyond the structural ones (a lower bound above zero,
a finite upper bound on a non-binary variable); integrality stays, so for a MIP the subset is
irreducible for the MIP itself. Every test is a feasibility solve with SCIP (zero objective).
When a test ends on its node limit (`TEST_NODE_LIMIT`: a count of work, the same on every machine,
where a wall-clock limit made the result depend on the machine's load), the element is kept and the
result says `irreducible=False`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trex.workloads.or_data.linear_model import LinearModel, Row, Variable
from trex.workloads.or_data.solve import NODE_LIMIT, _scip_solve

# a quarter of a model solve's room (`solve.NODE_LIMIT`), as the 5 s test limit was of the 20 s one:
# the filter makes one test per element
TEST_NODE_LIMIT = NODE_LIMIT // 4


@dataclass(frozen=True)
class Element:
    """One member of an IIS: a row, or a variable's lower or upper bound."""

    kind: str  # "row" | "lower" | "upper"
    name: str  # row or variable name
    sense: str  # "<=", ">=", "=="
    value: float  # right-hand side or bound


@dataclass(frozen=True)
class IIS:
    elements: tuple[Element, ...]
    irreducible: bool
    tests: int  # feasibility solves made


def _elements(model: LinearModel) -> list[Element]:
    found = [Element("row", row.name, row.sense, row.rhs) for row in model.rows]
    for variable in model.variables:
        if variable.kind == "binary":
            continue
        if variable.lower > 0:
            found.append(Element("lower", variable.name, ">=", variable.lower))
        if variable.upper is not None:
            found.append(Element("upper", variable.name, "<=", variable.upper))
    return found


def _restricted(model: LinearModel, kept: set[Element]) -> LinearModel:
    rows: list[Row] = [row for row in model.rows if Element("row", row.name, row.sense, row.rhs) in kept]
    variables: list[Variable] = []
    for variable in model.variables:
        if variable.kind == "binary":
            variables.append(variable)
            continue
        lower = (
            variable.lower
            if Element("lower", variable.name, ">=", variable.lower) in kept or variable.lower <= 0
            else 0.0
        )
        upper = variable.upper
        if upper is not None and Element("upper", variable.name, "<=", upper) not in kept:
            upper = None
        variables.append(replace(variable, lower=lower, upper=upper))
    return replace(model, rows=tuple(rows), variables=tuple(variables), objective=())


def _feasibility(model: LinearModel) -> str:
    return _scip_solve(model, TEST_NODE_LIMIT, with_objective=False).status


def deletion_filter(model: LinearModel) -> IIS | None:
    """An IIS of `model`, or None when the model is not proven infeasible to begin with."""
    elements = _elements(model)
    kept = set(elements)
    tests = 1
    if _feasibility(_restricted(model, kept)) != "infeasible":
        return None
    irreducible = True
    for element in elements:
        trial = kept - {element}
        tests += 1
        status = _feasibility(_restricted(model, trial))
        if status == "infeasible":
            kept = trial
        elif status not in ("optimal", "unbounded"):
            irreducible = False  # undecided within the node limit: keep it, the set is no longer provably minimal
    ordered = tuple(element for element in elements if element in kept)
    return IIS(ordered, irreducible, tests)
