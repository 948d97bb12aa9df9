"""Verifying one generated instance in all its representations.

`verify_problem` runs these checks, in this order, and stops at the first that fails:

| check | what holds afterwards |
| --- | --- |
| structure | the mathematical model's variable and constraint families, expanded over their sets, have the LP model's counts |
| solve | SCIP (in-process) reaches the status the instance was built to have |
| solution | optimal: every bound, integrality and row re-evaluated on SCIP's values (for a MIP, integers rounded and the continuous part re-solved onto an exact vertex, `solve.polish`), the objective recomputed from them and equal to SCIP's |
| dual / farkas / ray | a certificate checked without the solver: LP duality proves an LP optimum (pure LPs), a Farkas combination proves infeasibility, a feasible point plus an integral improving direction proves unboundedness |
| lp_scip, lp_highs | the LP file, read back by SCIP's and by HiGHS's reader, is exactly the model (`lp_structure`), so it has the model's proven outcome; a MIP optimum is also re-solved by HiGHS from what it read |
| program | the program (pyscipopt, or PuLP / Pyomo / coptpy: `solver_libraries`), run in the sandbox, prints the same outcome |

A program in another library that cannot be written or does not reach the outcome (a solver that
reports "infeasible or unbounded" without saying which) is replaced by the pyscipopt program,
checked the same way; `Problem.library` says which one the answer shows.

MIP optima are proven by SCIP (zero gap) and confirmed by HiGHS at zero gap on the LP file it read;
they carry no independent optimality certificate. Every other outcome is proven by its certificate,
so the LP file needs no second solve once both readers read it as exactly the model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from trex.workloads.or_data.certificates import (
    OPTIMALITY_TOL,
    Certificate,
    check_solution,
    find_dual,
    find_farkas,
    find_ray,
)
from trex.workloads.or_data.code_style import restyle, style_for
from trex.workloads.or_data.families.base import Family
from trex.workloads.or_data.linear_model import LinearModel
from trex.workloads.or_data.lp_format import write_lp
from trex.workloads.or_data.lp_structure import highs_read, highs_read_back, scip_read_back
from trex.workloads.or_data.math_model import MathModel, check_structure
from trex.workloads.or_data.outcome import Outcome, tidy_objective
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.prose import agree
from trex.workloads.or_data.solve import SolveResult, polish, solve_model, solve_read_highs
from trex.workloads.or_data.solver_libraries import TranslationError, usable_for

CHECKS = ("structure", "solve", "solution", "certificate", "lp_scip", "lp_highs", "program")


class VerificationFailed(Exception):
    """An instance failed a check; `check` names it (one of `CHECKS`)."""

    def __init__(self, check: str, detail: str):
        super().__init__(f"{check}: {detail}")
        self.check, self.detail = check, detail


@dataclass(frozen=True)
class Problem:
    """A generated instance with its verified representations and answer."""

    family: Family
    data: Any
    status: str
    note: str
    model: LinearModel
    math: MathModel
    lp: str
    program: str
    outcome: Outcome
    values: dict[str, float] = field(default_factory=dict)
    certificate: Certificate | None = None
    checks: tuple[str, ...] = ()
    library: str = "pyscipopt"  # the solver library the program uses

    def statement(self, rng: random.Random) -> str:
        return self.family.statement(self.data, rng)

    def decisions(self) -> list[str]:
        if self.status != "optimal":
            return []
        return [agree(line) for line in self.family.decisions(self.data, self.values)]  # "Build an ambulance base ..."


def _same(result: SolveResult, truth: Outcome) -> bool:
    return Outcome(result.status, result.objective).matches(truth)


def verify_problem(
    family: Family,
    data: Any,
    status: str,
    note: str,
    runner: ProgramRunner,
    library: str = "pyscipopt",
    *,
    run_program: bool = True,
) -> Problem:
    """Run every check of the module docstring; raise `VerificationFailed` at the first failure.
    `library` is the solver library the program should use (pyscipopt when it cannot).
    `run_program=False` leaves out the program check, for an instance whose program is never shown
    (a CPT document without code): the pyscipopt program is written but not run, and `checks`
    does not list "program"."""
    model = family.linear_model(data)
    math = family.math_model(data)
    structure = check_structure(math, model)
    if not structure.ok:
        raise VerificationFailed("structure", "; ".join(structure.problems))

    result = solve_model(model)
    if result.status != status:
        raise VerificationFailed("solve", f"built to be {status}, SCIP says {result.status} ({result.solver_status})")

    values: dict[str, float] = {}
    if status == "optimal":
        found = result.values
        if model.is_mip and not all(variable.integral for variable in model.variables):
            polished = polish(model, found)
            if polished.status == "optimal":
                found = polished.values
        solution = check_solution(model, found)
        if not solution.feasible:
            raise VerificationFailed("solution", "; ".join(solution.violations[:3]))
        assert result.objective is not None
        if abs(solution.objective - result.objective) > OPTIMALITY_TOL * (1 + abs(result.objective)):
            raise VerificationFailed(
                "solution",
                f"objective recomputed from the values is {solution.objective!r}, SCIP reports {result.objective!r}",
            )
        values = solution.values
        outcome = Outcome("optimal", tidy_objective(solution.objective))
        certificate = find_dual(model, solution.objective) if not model.is_mip else None
        if not model.is_mip and certificate is None:
            raise VerificationFailed("certificate", "no LP dual solution proves the optimum")
    else:
        outcome = Outcome(status)
        certificate = find_farkas(model) if status == "infeasible" else find_ray(model)
        if certificate is None:
            what = (
                "Farkas combination proving infeasibility"
                if status == "infeasible"
                else "feasible point and improving ray"
            )
            raise VerificationFailed("certificate", f"no checked {what}")

    lp = write_lp(model)
    _check_lp_file(lp, model, outcome)

    base_program = family.program(data)
    if not run_program:
        return _problem(
            family, data, status, note, model, math, lp, restyle(base_program), outcome, values, certificate
        )
    program, run = "", None
    if library != "pyscipopt" and usable_for(library, status):
        try:
            program = restyle(base_program, style_for(base_program, library))
        except TranslationError:
            program = ""
        if program:
            run = runner.run(program, clock_verdict=False)
            if run.outcome is None or not run.outcome.matches(outcome):
                program, run = "", None  # this library cannot show it: the pyscipopt program below
    if run is None:
        library = "pyscipopt"
        program = restyle(base_program)
        run = runner.run(program, clock_verdict=False)
    if run.outcome is None or not run.outcome.matches(outcome):
        said = run.outcome.text() if run.outcome is not None else f"{run.failure}: {run.detail}"
        raise VerificationFailed(
            "program", f"the program reports {said}, expected {outcome.text()}; stdout tail: {run.stdout[-300:]!r}"
        )

    return _problem(
        family, data, status, note, model, math, lp, program, outcome, values, certificate, library=library, ran=True
    )


def _check_lp_file(lp: str, model: LinearModel, outcome: Outcome) -> None:
    """`lp_scip`, `lp_highs`: each solver's reader reads the file as exactly `model`
    (`lp_structure`: the file then has the model's outcome, proven by the certificate above), and
    a MIP optimum, which has no certificate, is re-solved by HiGHS from what its reader read
    (the same read: `solve.solve_read_highs`)."""
    differences = scip_read_back(lp, model)
    if differences:
        raise VerificationFailed("lp_scip", "SCIP reads the LP file differently: " + "; ".join(differences[:3]))
    highs = highs_read(lp)
    differences = [highs] if isinstance(highs, str) else highs_read_back(highs, model)
    if differences:
        raise VerificationFailed("lp_highs", "HiGHS reads the LP file differently: " + "; ".join(differences[:3]))
    if model.is_mip and outcome.status == "optimal":
        read_back = solve_read_highs(highs, lp)
        if not _same(read_back, outcome):
            raise VerificationFailed(
                "lp_highs",
                f"the LP file re-solves to {read_back.status} {read_back.objective!r} ({read_back.solver_status}), expected {outcome.text()}",
            )


def _problem(
    family: Family,
    data: Any,
    status: str,
    note: str,
    model: LinearModel,
    math: MathModel,
    lp: str,
    program: str,
    outcome: Outcome,
    values: dict[str, float],
    certificate: Certificate | None,
    *,
    library: str = "pyscipopt",
    ran: bool = False,
) -> Problem:
    checks = (
        "structure",
        "solve",
        "solution" if status == "optimal" else "",
        certificate.kind if certificate else "",
        "lp_scip",
        "lp_highs",
        "program" if ran else "",
    )
    return Problem(
        family,
        data,
        status,
        note,
        model,
        math,
        lp,
        program,
        outcome,
        values,
        certificate,
        tuple(c for c in checks if c),
        library,
    )
