"""The LP file read back by SCIP's and HiGHS's readers, compared term by term with the model it
was written from.

The `lp_scip` / `lp_highs` checks of `verify` used to re-solve the LP file with each solver and
compare the outcome with the verified one. `read_back_differences` proves more and costs less: it
asks each reader what it read (variables with their kind and bounds, the objective's sense and
coefficients, every row's coefficients, sense and right-hand side) and requires it to be the
`LinearModel` exactly. The file writes every number as Python's shortest round-tripping repr
(`lp_format.format_number`) and both readers parse numbers with `strtod`, so exact equality is the
right test, not a tolerance.

Why this verifies at least as much as re-solving the file:

- The outcome of a model (status, optimal objective) is a property of the mathematical model. A
  file that reads back as exactly the verified model has the verified model's outcome, so the
  file's outcome needs no second solve of the same model to be known.
- The verified outcome does not rest on trusting one solver: an LP optimum carries a dual
  certificate, an infeasible instance a Farkas combination, an unbounded one a feasible point and
  an improving ray, each checked without any solver (`certificates`). A MIP optimum has no such
  certificate: for it HiGHS still solves what its reader read, at zero gap, as the independent
  second opinion (`verify`).
- An outcome comparison passes files that differ from the model in a row that does not bind at
  the optimum, a bound that does not bind, an objective coefficient of a variable at zero, or a
  variable's integrality where the relaxation happens to be integral; the structural comparison
  fails each (`tests/workloads/test_or_data_lp_structure.py`).

The readers are the solvers' own (SCIP `readProblem`, HiGHS `readModel`), on the file text the
sample shows, so a file one reader misreads still fails its check.
"""

from __future__ import annotations

import math

from trex.workloads.or_data.linear_model import LinearModel
from trex.workloads.or_data.scip_instances import empty_scip
from trex.workloads.or_data.solve import configured_highs, lp_file
from trex.workloads.sandbox.interruption import scip_without_ctrl_c

INFINITY = math.inf
_SHOWN = 3  # differences named in a failure's detail


def _expected(model: LinearModel) -> tuple[dict, dict, dict]:
    """(variables, objective, rows) of `model` in the form both readers are brought to:
    variables name -> (integral, lower, upper); objective name -> coefficient (zeros dropped);
    rows name -> (terms name -> coefficient, lower, upper), senses as bounds on the activity."""
    variables = {
        variable.name: (
            variable.integral,
            float(variable.lower),
            1.0 if variable.kind == "binary" else INFINITY if variable.upper is None else float(variable.upper),
        )
        for variable in model.variables
    }
    objective = _summed(model.objective)
    rows = {}
    for row in model.rows:
        rhs = float(row.rhs)
        lower = rhs if row.sense in (">=", "==") else -INFINITY
        upper = rhs if row.sense in ("<=", "==") else INFINITY
        rows[row.name] = (_summed(row.terms), lower, upper)
    return variables, objective, rows


def _summed(terms) -> dict[str, float]:
    summed: dict[str, float] = {}
    for name, coef in terms:
        summed[name] = summed.get(name, 0.0) + float(coef)
    return {name: coef for name, coef in summed.items() if coef != 0.0}


def _compare(model: LinearModel, sense: str, offset: float, variables: dict, objective: dict, rows: dict) -> list[str]:
    """Every difference between what a reader read and `model` (empty: the same model)."""
    want_variables, want_objective, want_rows = _expected(model)
    problems = []
    if sense != model.sense:
        problems.append(f"the objective sense reads as {sense}, the model's is {model.sense}")
    if offset != 0.0:
        problems.append(f"the objective reads with a constant {offset!r}, the model has none")
    # a variable written nowhere (no row, no objective term, default bounds) is absent from the
    # file and from what a reader reads; it is the reader's default variable: continuous, [0, inf)
    for name in variables.keys() - want_variables.keys():
        problems.append(f"the file declares a variable {name} the model does not have")
    for name, want in want_variables.items():
        got = variables.get(name, (False, 0.0, INFINITY))
        if got != want:
            problems.append(f"variable {name} reads as {_variable_text(got)}, the model's is {_variable_text(want)}")
    if objective != want_objective:
        problems.append(f"the objective reads differently: {_terms_difference(objective, want_objective)}")
    for name in rows.keys() - want_rows.keys():
        problems.append(f"the file has a row {name} the model does not have")
    for name, (want_terms, want_lower, want_upper) in want_rows.items():
        if name not in rows:
            problems.append(f"row {name} is missing from what the reader read")
            continue
        terms, lower, upper = rows[name]
        if terms != want_terms:
            problems.append(f"row {name} reads differently: {_terms_difference(terms, want_terms)}")
        if (lower, upper) != (want_lower, want_upper):
            problems.append(
                f"row {name} reads with bounds [{lower!r}, {upper!r}], the model's are [{want_lower!r}, {want_upper!r}]"
            )
    return problems


def _variable_text(entry: tuple[bool, float, float]) -> str:
    integral, lower, upper = entry
    return f"{'integer' if integral else 'continuous'} in [{lower!r}, {upper!r}]"


def _terms_difference(got: dict[str, float], want: dict[str, float]) -> str:
    names = sorted(got.keys() | want.keys())
    differing = [name for name in names if got.get(name) != want.get(name)]
    return ", ".join(
        f"{name}: {got.get(name, 0.0)!r} instead of {want.get(name, 0.0)!r}" for name in differing[:_SHOWN]
    )


def _finite(value: float, infinity: float) -> float:
    return INFINITY if value >= infinity else -INFINITY if value <= -infinity else float(value)


def scip_read_back(lp_text: str, model: LinearModel) -> list[str]:
    """The differences between `model` and what SCIP's LP reader reads from `lp_text`."""
    with lp_file(lp_text) as path, empty_scip("lp_structure", "lp", scip_without_ctrl_c) as scip:
        try:
            scip.readProblem(path)
        except Exception as error:  # noqa: BLE001 - SCIP raises a bare Exception for unreadable files
            return [f"SCIP cannot read the LP file ({error})"]
        infinity = scip.infinity()
        variables, objective = {}, {}
        for variable in scip.getVars():
            name = variable.name
            variables[name] = (
                variable.vtype() != "CONTINUOUS",
                _finite(variable.getLbOriginal(), infinity),
                _finite(variable.getUbOriginal(), infinity),
            )
            coef = variable.getObj()
            if coef != 0.0:
                objective[name] = float(coef)
        rows = {}
        for constraint in scip.getConss():
            if constraint.getConshdlrName() != "linear":
                return [f"SCIP reads row {constraint.name} as a {constraint.getConshdlrName()} constraint"]
            terms = {name: float(coef) for name, coef in scip.getValsLinear(constraint).items() if coef != 0.0}
            rows[constraint.name] = (
                terms,
                _finite(scip.getLhs(constraint), infinity),
                _finite(scip.getRhs(constraint), infinity),
            )
        return _compare(model, scip.getObjectiveSense(), float(scip.getObjoffset()), variables, objective, rows)


def highs_read(lp_text: str):
    """A quiet HiGHS instance holding what its LP reader read from `lp_text`, or the reason it
    could not read it (a string)."""
    import highspy

    highs = configured_highs()
    with lp_file(lp_text) as path:
        status = highs.readModel(path)
    if status != highspy.HighsStatus.kOk:
        return f"HiGHS could not read the LP file ({status})"
    return highs


def highs_read_back(highs, model: LinearModel) -> list[str]:
    """The differences between `model` and the model `highs` read (`highs_read`)."""
    import highspy

    lp = highs.getLp()
    infinity = highs.getInfinity()
    names = list(lp.col_names_)
    integrality = list(lp.integrality_) or [highspy.HighsVarType.kContinuous] * lp.num_col_
    lower, upper, cost = list(lp.col_lower_), list(lp.col_upper_), list(lp.col_cost_)
    variables = {
        name: (
            integrality[j] != highspy.HighsVarType.kContinuous,
            _finite(lower[j], infinity),
            _finite(upper[j], infinity),
        )
        for j, name in enumerate(names)
    }
    objective = {name: float(cost[j]) for j, name in enumerate(names) if cost[j] != 0.0}
    row_names = list(lp.row_names_)
    row_terms: list[dict[str, float]] = [{} for _ in row_names]
    matrix = lp.a_matrix_
    start, index, value = list(matrix.start_), list(matrix.index_), list(matrix.value_)
    if matrix.format_ == highspy.MatrixFormat.kColwise:
        for j, name in enumerate(names):
            for k in range(start[j], start[j + 1]):
                if value[k] != 0.0:
                    row_terms[index[k]][name] = float(value[k])
    else:
        for i in range(len(row_names)):
            for k in range(start[i], start[i + 1]):
                if value[k] != 0.0:
                    row_terms[i][names[index[k]]] = float(value[k])
    row_lower, row_upper = list(lp.row_lower_), list(lp.row_upper_)
    rows = {
        name: (row_terms[i], _finite(row_lower[i], infinity), _finite(row_upper[i], infinity))
        for i, name in enumerate(row_names)
    }
    sense = "maximize" if lp.sense_ == highspy.ObjSense.kMaximize else "minimize"
    return _compare(model, sense, float(lp.offset_), variables, objective, rows)
