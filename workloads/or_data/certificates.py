"""Checking a solver's answer without trusting the solver.

- `check_solution`: every bound, integrality requirement and row re-evaluated on the values, and
  the objective recomputed from them (math.fsum), so a feasible, correctly-priced point is known
  independently of how SCIP found it.
- `dual_bound`: weak LP duality. For row multipliers `y` with the right signs, every feasible `x`
  of the LP relaxation satisfies `c·x >= y·b + Σ_j min_{l_j <= x_j <= u_j} (c - Aᵀy)_j x_j`. With
  `c = 0` and a positive bound this is a Farkas certificate (no feasible point exists; the MIP is
  infeasible too, since its relaxation is); for a pure LP whose bound meets the objective of a
  checked feasible point, it proves that point optimal.
- `check_ray`: an unbounded MIP has a feasible point and an integral direction that keeps every
  row satisfied and improves the objective; both are checked, the direction in exact rationals.

Solvers are still used to *find* multipliers and directions (`find_*`: small auxiliary LPs);
only the checks decide. Row tolerances are absolute-plus-relative to the row's scale,
`FEASIBILITY_TOL * (1 + max(|rhs|, |coef * value| over its terms))`, as solvers measure them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from math import lcm

from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder
from trex.workloads.or_data.solve import solve_model

FEASIBILITY_TOL = 1e-6
INTEGRALITY_TOL = 1e-6
OPTIMALITY_TOL = 1e-6
_ZERO = 1e-9  # multipliers and reduced costs below this are solver noise


@dataclass(frozen=True)
class SolutionCheck:
    """The outcome of re-evaluating a solution. `values` are polished: integer variables rounded
    to the nearest integer (the check runs on the polished values)."""

    violations: tuple[str, ...]
    objective: float
    values: dict[str, float]

    @property
    def feasible(self) -> bool:
        return not self.violations


def check_solution(model: LinearModel, values: Mapping[str, float]) -> SolutionCheck:
    """Re-evaluate every bound, integrality requirement and row; recompute the objective."""
    violations: list[str] = []
    polished: dict[str, float] = {}
    for variable in model.variables:
        if variable.name not in values:
            violations.append(f"variable {variable.name} has no value")
            polished[variable.name] = 0.0
            continue
        value = float(values[variable.name])
        if variable.integral:
            if abs(value - round(value)) > INTEGRALITY_TOL:
                violations.append(f"{variable.name} = {value!r} is not integral")
            value = float(round(value))
        if value < variable.lower - FEASIBILITY_TOL * (1 + abs(variable.lower)):
            violations.append(f"{variable.name} = {value!r} is below its lower bound {variable.lower!r}")
        if variable.upper is not None and value > variable.upper + FEASIBILITY_TOL * (1 + abs(variable.upper)):
            violations.append(f"{variable.name} = {value!r} is above its upper bound {variable.upper!r}")
        polished[variable.name] = value
    for row in model.rows:
        activity = row.activity(polished)
        # relative to the row's scale, as solvers measure it: a row 20 x - 20 y <= 0 may be off by 2e-5
        scale = max([abs(row.rhs), *(abs(coef * polished[name]) for name, coef in row.terms)], default=0.0)
        slack = FEASIBILITY_TOL * (1 + scale)
        broken = (
            (row.sense == "<=" and activity > row.rhs + slack)
            or (row.sense == ">=" and activity < row.rhs - slack)
            or (row.sense == "==" and abs(activity - row.rhs) > slack)
        )
        if broken:
            violations.append(f"row {row.name}: activity {activity!r} {row.sense} {row.rhs!r} does not hold")
    return SolutionCheck(tuple(violations), model.objective_value(polished), polished)


def _row_sign_ok(sense: str, multiplier: float) -> bool:
    # multipliers of >= rows are >= 0, of <= rows <= 0, of == rows free (minimization form)
    return (sense == ">=" and multiplier >= 0) or (sense == "<=" and multiplier <= 0) or sense == "=="


def dual_bound(model: LinearModel, multipliers: Mapping[str, float], costs: Mapping[str, float]) -> float | None:
    """The weak-duality lower bound on `costs·x` over the LP relaxation (see the module
    docstring), or None when the multipliers have a wrong sign or the bound is -infinity."""
    reduced = {variable.name: float(costs.get(variable.name, 0.0)) for variable in model.variables}
    constant = []
    for row in model.rows:
        y = float(multipliers.get(row.name, 0.0))
        if abs(y) <= _ZERO:
            continue
        if not _row_sign_ok(row.sense, y):
            return None
        constant.append(y * row.rhs)
        for name, coef in row.terms:
            reduced[name] -= y * coef
    for variable in model.variables:
        d = reduced[variable.name]
        if abs(d) <= _ZERO:
            continue
        if d > 0:
            constant.append(d * variable.lower)
        elif variable.upper is None:
            return None
        else:
            constant.append(d * variable.upper)
    return math.fsum(constant)


@dataclass(frozen=True)
class Certificate:
    """Why a status holds, checked. `rows` are the multipliers (Farkas, dual) of the rows that
    take part; `ray` the improving direction (unbounded)."""

    kind: str  # "dual" (LP optimality), "farkas" (infeasible), "ray" (unbounded)
    bound: float | None = None
    rows: dict[str, float] = field(default_factory=dict)
    ray: dict[str, int] = field(default_factory=dict)
    point: dict[str, float] = field(default_factory=dict)


def _dual_model(
    model: LinearModel, costs: Mapping[str, float], *, normalize: bool
) -> tuple[LinearModel, dict[str, tuple[str, float]]]:
    """The LP dual of min costs·x over the relaxation, with variables `y_<i>` per row (split
    into signed parts) and `p_/q_` per finite bound. With `normalize`, every dual variable is at
    most 1, which keeps a Farkas search bounded. Returns the model and, per dual variable that
    is a row multiplier, (row name, sign)."""
    builder = ModelBuilder(f"{model.name}_dual")
    upper = 1.0 if normalize else None
    columns: dict[str, dict[str, float]] = {variable.name: {} for variable in model.variables}
    objective: dict[str, float] = {}
    row_parts: dict[str, tuple[str, float]] = {}
    for index, row in enumerate(model.rows):
        signs = {">=": (1.0,), "<=": (-1.0,), "==": (1.0, -1.0)}[row.sense]
        for part, sign in enumerate(signs):
            name = builder.var(f"y{index}_{part}", upper=upper)
            row_parts[name] = (row.name, sign)
            objective[name] = sign * row.rhs
            for variable, coef in row.terms:
                columns[variable][name] = sign * coef
    for index, variable in enumerate(model.variables):
        p = builder.var(f"p{index}", upper=upper)
        columns[variable.name][p] = 1.0
        objective[p] = variable.lower
        if variable.upper is not None:
            q = builder.var(f"q{index}", upper=upper)
            columns[variable.name][q] = -1.0
            objective[q] = -variable.upper
    for index, variable in enumerate(model.variables):
        builder.row(f"col{index}", columns[variable.name], "==", float(costs.get(variable.name, 0.0)))
    builder.maximize(objective)
    return builder.build(), row_parts


def _multipliers(values: Mapping[str, float], row_parts: Mapping[str, tuple[str, float]]) -> dict[str, float]:
    multipliers: dict[str, float] = {}
    for name, (row, sign) in row_parts.items():
        multipliers[row] = multipliers.get(row, 0.0) + sign * values.get(name, 0.0)
    return {row: y for row, y in multipliers.items() if abs(y) > _ZERO}


def _minimization_costs(model: LinearModel) -> dict[str, float]:
    sign = 1.0 if model.sense == "minimize" else -1.0
    return {name: sign * coef for name, coef in model.objective}


def find_farkas(model: LinearModel) -> Certificate | None:
    """A checked proof that the LP relaxation (hence the model) has no feasible point, or None."""
    dual, row_parts = _dual_model(model, {}, normalize=True)
    result = solve_model(dual)
    if result.status != "optimal":
        return None
    multipliers = _multipliers(result.values, row_parts)
    bound = dual_bound(model, multipliers, {})
    scale = 1 + max((abs(row.rhs) for row in model.rows), default=0.0)
    if bound is None or bound <= FEASIBILITY_TOL * scale:
        return None
    return Certificate("farkas", bound=bound, rows=multipliers)


def find_dual(model: LinearModel, objective: float) -> Certificate | None:
    """For a pure LP: checked multipliers whose bound equals `objective` (proving optimality)."""
    if model.is_mip:
        return None
    costs = _minimization_costs(model)
    dual, row_parts = _dual_model(model, costs, normalize=False)
    result = solve_model(dual)
    if result.status != "optimal":
        return None
    multipliers = _multipliers(result.values, row_parts)
    bound = dual_bound(model, multipliers, costs)
    if bound is None:
        return None
    minimized = objective if model.sense == "minimize" else -objective
    if abs(bound - minimized) > OPTIMALITY_TOL * (1 + abs(minimized)):
        return None
    return Certificate("dual", bound=bound if model.sense == "minimize" else -bound, rows=multipliers)


def find_ray(model: LinearModel) -> Certificate | None:
    """A checked feasible point plus an integral improving direction, or None."""
    feasibility = ModelBuilder(
        f"{model.name}_point", "minimize", dict((v.name, v) for v in model.variables), list(model.rows)
    )
    point = solve_model(feasibility.build())
    if point.status != "optimal":
        return None
    checked = check_solution(model, point.values)
    if not checked.feasible:
        return None
    direction = _direction_model(model)
    result = solve_model(direction)
    if result.status != "optimal" or (result.objective or 0.0) <= FEASIBILITY_TOL:
        return None
    ray = _integral(result.values, [variable.name for variable in model.variables])
    if ray is None or not check_ray(model, ray):
        return None
    return Certificate("ray", ray={name: value for name, value in ray.items() if value}, point=checked.values)


def _direction_model(model: LinearModel) -> LinearModel:
    """max g·r over the recession cone, 0 <= r <= 1, where g is the improving direction."""
    builder = ModelBuilder(f"{model.name}_ray", "maximize")
    for variable in model.variables:
        # lower bounds are finite, so r >= 0; a finite upper bound also forces r <= 0, i.e. r = 0
        builder.var(variable.name, upper=0.0 if variable.upper is not None else 1.0)
    for row in model.rows:
        builder.row(row.name, row.terms, row.sense, 0.0)
    sign = 1.0 if model.sense == "maximize" else -1.0
    builder.maximize({name: sign * coef for name, coef in model.objective})
    return builder.build()


def _integral(values: Mapping[str, float], names: list[str]) -> dict[str, int] | None:
    fractions = {name: Fraction(values.get(name, 0.0)).limit_denominator(1000) for name in names}
    denominator = 1
    for value in fractions.values():
        denominator = lcm(denominator, value.denominator)
    scaled = {name: int(value * denominator) for name, value in fractions.items()}
    return scaled if any(scaled.values()) else None


def check_ray(model: LinearModel, ray: Mapping[str, int]) -> bool:
    """Exact check of an improving direction: integral, inside every bound's and row's
    recession cone, and strictly improving the objective."""
    if any(not isinstance(value, int) for value in ray.values()):
        return False
    for variable in model.variables:
        value = ray.get(variable.name, 0)
        if value < 0 or (variable.upper is not None and value != 0):
            return False
    for row in model.rows:
        activity = sum(Fraction(coef) * ray.get(name, 0) for name, coef in row.terms)
        if (
            (row.sense == "<=" and activity > 0)
            or (row.sense == ">=" and activity < 0)
            or (row.sense == "==" and activity != 0)
        ):
            return False
    gain = sum(Fraction(coef) * ray.get(name, 0) for name, coef in model.objective)
    return gain > 0 if model.sense == "maximize" else gain < 0
