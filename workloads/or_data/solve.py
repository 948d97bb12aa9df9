"""Solving a `LinearModel` with SCIP (pyscipopt) in-process, and an LP file with SCIP or HiGHS.

Statuses are normalized to `optimal`, `infeasible`, `unbounded` or `other` (node limit, numerical
trouble). SCIP sometimes proves only "infeasible or unbounded" (presolve sees an unbounded ray
before it has a feasible point); `solve_model` then re-solves with a zero objective, which
settles it: feasible means unbounded.

HiGHS is the second opinion: a different solver with its own LP-file parser, so an LP file both
read to the same optimum is unlikely to be wrong in a way one reader forgives.

**No clock decides a verdict.** Every solve is bounded by work, not time: SCIP by
`limits/totalnodes`, HiGHS by `mip_max_nodes` (`NODE_LIMIT`), and neither gets a time limit. A
wall-clock limit (SCIP's `limits/time` counts elapsed seconds) turned a verdict into a time-out
on a machine loaded enough, so the same seed wrote different samples (bench/RESULTS.md section 6);
a node count is the same on every machine, so an instance that needs more nodes is rejected on
every machine. Both solvers are otherwise deterministic here (one thread, fixed seeds), which
`tests/workloads/test_or_data_determinism.py` checks.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from trex.workloads.or_data.linear_model import LinearModel
from trex.workloads.or_data.scip_instances import empty_scip
from trex.workloads.sandbox.interruption import scip_without_ctrl_c

STATUSES = ("optimal", "infeasible", "unbounded")

# SCIP's defaults prove optimality to a zero gap; the limit only stops pathological instances.
# The pipeline's instances need few nodes: at most 233 over the 4,570 SCIP solves of seed 0's
# indices 0-499 (bench/RESULTS.md section 6, sixth session). 5,000 is about 20 times that; at the
# 1-11 CPU ms a node costs on these models and on a hard market-split instance, a runaway branch
# and bound stops after seconds to about a minute of one core, as the 20 s wall-clock limit it
# replaces did, but at the same node on every machine.
NODE_LIMIT = 5_000


@dataclass(frozen=True)
class SolveResult:
    """A solver's verdict. `values` and `objective` are set when `status == "optimal"`."""

    status: str  # optimal | infeasible | unbounded | other
    objective: float | None = None
    values: dict[str, float] = field(default_factory=dict)
    solver_status: str = ""  # the solver's own word, for reports


def solve_model(model: LinearModel, *, node_limit: int = NODE_LIMIT) -> SolveResult:
    """Solve `model` with SCIP; see the module docstring for the status rules."""
    result = _scip_solve(model, node_limit, with_objective=True)
    if result.status == "infeasible_or_unbounded":
        feasibility = _scip_solve(model, node_limit, with_objective=False)
        status = {"optimal": "unbounded", "infeasible": "infeasible"}.get(feasibility.status, "other")
        return SolveResult(status, solver_status=f"inforunbd; feasibility: {feasibility.solver_status}")
    return result


def polish(model: LinearModel, values: dict[str, float], *, node_limit: int = NODE_LIMIT) -> SolveResult:
    """Re-solve the continuous part of a MIP with every integer variable fixed at its rounded
    value. A MIP solution is feasible only within SCIP's tolerances (a makespan of 19.99999394
    for an integral load of 20); the LP over the remaining continuous variables puts them on
    an exact vertex for the chosen integer decisions."""
    from dataclasses import replace

    fixed = []
    for variable in model.variables:
        if variable.integral:
            level = float(round(values[variable.name]))
            fixed.append(replace(variable, kind="continuous", lower=level, upper=level))
        else:
            fixed.append(variable)
    return solve_model(replace(model, variables=tuple(fixed)), node_limit=node_limit)


def _model_solve_settings(scip) -> None:
    scip_without_ctrl_c(scip)
    scip.setParam("parallel/maxnthreads", 1)


def _scip_solve(model: LinearModel, node_limit: int, *, with_objective: bool) -> SolveResult:
    with empty_scip("model", model.name, _model_solve_settings) as scip:
        scip.setParam("limits/totalnodes", node_limit)
        return _build_and_solve(scip, model, with_objective=with_objective)


def _build_and_solve(scip, model: LinearModel, *, with_objective: bool) -> SolveResult:
    from pyscipopt import quicksum

    kinds = {"continuous": "C", "integer": "I", "binary": "B"}
    handles = {
        variable.name: scip.addVar(name=variable.name, vtype=kinds[variable.kind], lb=variable.lower, ub=variable.upper)
        for variable in model.variables
    }
    for row in model.rows:
        expression = quicksum(coef * handles[name] for name, coef in row.terms)
        if row.sense == "<=":
            scip.addCons(expression <= row.rhs, name=row.name)
        elif row.sense == ">=":
            scip.addCons(expression >= row.rhs, name=row.name)
        else:
            scip.addCons(expression == row.rhs, name=row.name)
    objective = quicksum(coef * handles[name] for name, coef in model.objective) if with_objective else 0
    scip.setObjective(objective, sense=model.sense)
    scip.optimize()
    return _scip_result(scip, handles)


def _scip_result(scip, handles: dict) -> SolveResult:
    status = scip.getStatus()
    if status == "optimal":
        solution = scip.getBestSol()
        values = {name: float(scip.getSolVal(solution, handle)) for name, handle in handles.items()}
        return SolveResult("optimal", float(scip.getObjVal()), values, status)
    if status in ("infeasible", "unbounded"):
        return SolveResult(status, solver_status=status)
    if status == "inforunbd":
        return SolveResult("infeasible_or_unbounded", solver_status=status)
    return SolveResult("other", solver_status=status)


# LP-file verdicts by (reader, SHA-256 of the text, node limit): both solvers are deterministic here
# (single thread, no clock limit), and the pipeline reads the same file more than once (the verifier,
# then the judge of the answer that shows it): each file is read and solved once per process.
_LP_MEMO: OrderedDict[tuple[str, str, int], tuple[SolveResult, tuple[int, int]]] = OrderedDict()
_LP_MEMO_SIZE = 256


def _memoized(reader: str) -> Callable:
    def decorate(solve: Callable[[str, int], tuple[SolveResult, tuple[int, int]]]) -> Callable:
        @functools.wraps(solve)
        def solve_lp_text(lp_text: str, *, node_limit: int = NODE_LIMIT) -> SolveResult:
            return _lp_memo(reader, solve, lp_text, node_limit)[0]

        return solve_lp_text

    return decorate


def _lp_memo(reader: str, solve: Callable, lp_text: str, node_limit: int) -> tuple[SolveResult, tuple[int, int]]:
    key = (reader, hashlib.sha256(lp_text.encode("utf-8")).hexdigest(), node_limit)
    found = _LP_MEMO.get(key)
    if found is None:
        found = solve(lp_text, node_limit)
        _memo_put(key, found)
    else:
        _LP_MEMO.move_to_end(key)
    result, counts = found
    return replace(result, values=dict(result.values)), counts  # the caller may change its copy


def _memo_put(key: tuple[str, str, int], found: tuple[SolveResult, tuple[int, int]]) -> None:
    _LP_MEMO[key] = found
    _LP_MEMO.move_to_end(key)
    if len(_LP_MEMO) > _LP_MEMO_SIZE:
        _LP_MEMO.popitem(last=False)


def lp_counts_scip(lp_text: str) -> tuple[int, int] | None:
    """Variables and integer (incl. binary) variables of an LP file as SCIP's reader sees it, None
    when SCIP cannot read it; from the memo when SCIP already read this file."""
    wanted = hashlib.sha256(lp_text.encode("utf-8")).hexdigest()
    for (reader, digest, _), (_, counts) in reversed(_LP_MEMO.items()):
        if reader == "scip" and digest == wanted:
            return counts
    with lp_file(lp_text) as path, empty_scip("lp_file", "lp", _lp_file_settings) as scip:
        try:
            scip.readProblem(path)
        except Exception:  # noqa: BLE001 - SCIP raises a bare Exception for unreadable files
            return None
        return scip.getNVars(), scip.getNIntVars() + scip.getNBinVars()


@_memoized("scip")
def solve_lp_text_scip(lp_text: str, node_limit: int = NODE_LIMIT) -> tuple[SolveResult, tuple[int, int]]:
    """Read an LP file with SCIP's reader and solve it (values keyed by the file's names).

    A check, not where an answer's values come from (the verified values are `solve_model`'s;
    only this verdict's status and objective are compared): SCIP solves the file with presolving,
    primal heuristics and cutting planes off (`plain_branch_and_bound`). Branch and bound still
    proves the optimum to SCIP's zero gap, and infeasibility or unboundedness, on what the reader
    read; on the pipeline's small models the three only cost time (7.2 against 14.4 CPU ms per
    file, the same verdict on all 1000 files of a 1000-sample run: bench/RESULTS.md section 6)."""
    with lp_file(lp_text) as path, empty_scip("lp_file", "lp", _lp_file_settings) as scip:
        scip.setParam("limits/totalnodes", node_limit)
        scip.readProblem(path)
        counts = (scip.getNVars(), scip.getNIntVars() + scip.getNBinVars())
        return _solve_read_scip(scip), counts


def _lp_file_settings(scip) -> None:
    scip_without_ctrl_c(scip)
    plain_branch_and_bound(scip)


def plain_branch_and_bound(scip) -> None:
    """SCIP without presolving, primal heuristics and separation: LP-based branch and bound alone,
    exact to the same tolerances (see `solve_lp_text_scip`)."""
    from pyscipopt import SCIP_PARAMSETTING

    scip.setPresolve(SCIP_PARAMSETTING.OFF)
    scip.setHeuristics(SCIP_PARAMSETTING.OFF)
    scip.setSeparating(SCIP_PARAMSETTING.OFF)


def _solve_read_scip(scip) -> SolveResult:
    scip.optimize()
    handles = {variable.name: variable for variable in scip.getVars()}
    result = _scip_result(scip, handles)
    if result.status == "infeasible_or_unbounded":
        scip.freeTransform()
        scip.setObjective(0, sense="minimize")
        scip.optimize()
        settled = {"optimal": "unbounded", "infeasible": "infeasible"}.get(scip.getStatus(), "other")
        return SolveResult(settled, solver_status="inforunbd")
    return result


@_memoized("highs")
def solve_lp_text_highs(lp_text: str, node_limit: int = NODE_LIMIT) -> tuple[SolveResult, tuple[int, int]]:
    """Read an LP file with HiGHS's reader and solve it: the independent second opinion."""
    return _solve_lp_text_highs(lp_text, node_limit), (-1, -1)


def configured_highs(node_limit: int = NODE_LIMIT):
    """A quiet HiGHS instance with the pipeline's settings: one thread, the node limit, no time
    limit, zero gaps."""
    highs = _quiet_highs()
    highs.setOptionValue("mip_max_nodes", node_limit)
    highs.setOptionValue("threads", 1)
    # HiGHS stops MIPs at a 0.01% gap by default; the comparison needs proven optima, as SCIP's
    highs.setOptionValue("mip_rel_gap", 0.0)
    highs.setOptionValue("mip_abs_gap", 0.0)
    return highs


def solve_read_highs(highs, lp_text: str) -> SolveResult:
    """`solve_lp_text_highs(lp_text)`'s verdict, from `highs`, which already holds what HiGHS's
    reader read from `lp_text` (`lp_structure.highs_read`, `configured_highs`' settings), and
    remembered as that call's: the verifier reads the file once for its read-back and its re-solve.

    Not given SCIP's optimum as a starting solution (`Highs.setSolution`): HiGHS proves these
    optima at or near the root, and with the incumbent it took more nodes and more time
    (1.4 nodes and 1.4 CPU ms more per MIP over 132 of the families' MIPs, bench/RESULTS.md
    section 6, eighth session)."""
    import highspy

    result = _run_highs(highs, highspy)
    key = ("highs", hashlib.sha256(lp_text.encode("utf-8")).hexdigest(), NODE_LIMIT)
    _memo_put(key, (result, (-1, -1)))
    return replace(result, values=dict(result.values))


def _solve_lp_text_highs(lp_text: str, node_limit: int) -> SolveResult:
    highs = configured_highs(node_limit)
    with lp_file(lp_text) as path:
        read = highs.readModel(path)
    import highspy

    if read != highspy.HighsStatus.kOk:
        return SolveResult("other", solver_status=f"HiGHS could not read the LP file ({read})")
    return _run_highs(highs, highspy)


def _run_highs(highs, highspy) -> SolveResult:
    highs.run()
    status = highs.getModelStatus()
    word = highs.modelStatusToString(status)
    if status == highspy.HighsModelStatus.kOptimal:
        names = list(highs.getLp().col_names_)
        values = dict(zip(names, (float(v) for v in highs.getSolution().col_value), strict=True))
        return SolveResult("optimal", float(highs.getInfo().objective_function_value), values, word)
    if status == highspy.HighsModelStatus.kInfeasible:
        return SolveResult("infeasible", solver_status=word)
    if status == highspy.HighsModelStatus.kUnbounded:
        return SolveResult("unbounded", solver_status=word)
    if status == highspy.HighsModelStatus.kUnboundedOrInfeasible:
        highs.changeObjectiveSense(highspy.ObjSense.kMinimize)
        lp = highs.getLp()
        highs.changeColsCost(lp.num_col_, list(range(lp.num_col_)), [0.0] * lp.num_col_)
        highs.run()
        settled = highs.getModelStatus()
        if settled == highspy.HighsModelStatus.kOptimal:
            return SolveResult("unbounded", solver_status=word)
        if settled == highspy.HighsModelStatus.kInfeasible:
            return SolveResult("infeasible", solver_status=word)
    return SolveResult("other", solver_status=word)


_HIGHS_BANNER_SHOWN = False


def _quiet_highs():
    """A HiGHS instance with its output off. HiGHS prints a banner to the process's stdout the
    first time one is created, which would land in the middle of a progress bar."""
    global _HIGHS_BANNER_SHOWN
    import highspy

    if _HIGHS_BANNER_SHOWN:
        highs = highspy.Highs()
    else:
        with _stdout_to_devnull():
            highs = highspy.Highs()
        _HIGHS_BANNER_SHOWN = True
    highs.setOptionValue("output_flag", False)
    return highs


@contextlib.contextmanager
def _stdout_to_devnull() -> Iterator[None]:
    with descriptor_to_devnull(1):
        yield


@contextlib.contextmanager
def descriptor_to_devnull(fd: int) -> Iterator[None]:
    """Send what C code writes to `fd` (1: stdout, 2: stderr) to /dev/null meanwhile."""
    import sys

    (sys.stdout if fd == 1 else sys.stderr).flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def lp_file(lp_text: str) -> Iterator[str]:
    """A temporary file holding `lp_text` (solvers read LP files only from paths)."""
    handle, path = tempfile.mkstemp(suffix=".lp", prefix="trex-or-data-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(lp_text)
        yield path
    finally:
        os.unlink(path)
