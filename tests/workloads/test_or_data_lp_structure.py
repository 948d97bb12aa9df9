"""The LP-file checks compare what SCIP's and HiGHS's readers read with the model, term by term
(`lp_structure`): every family's files read back exactly; files whose outcome is the model's but
whose content is not are caught (the old outcome comparison passed them); MIP optima are still
re-solved by HiGHS, and nothing else is."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_or_data_support import generated, runner  # noqa: F401 - runner is a fixture

from trex.workloads.or_data import verify
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.linear_model import LinearModel
from trex.workloads.or_data.lp_format import write_lp
from trex.workloads.or_data.lp_structure import highs_read, highs_read_back, scip_read_back
from trex.workloads.or_data.outcome import Outcome
from trex.workloads.or_data.solve import solve_lp_text_highs, solve_lp_text_scip, solve_model


def _differences(lp: str, model: LinearModel) -> tuple[list[str], list[str]]:
    highs = highs_read(lp)
    return scip_read_back(lp, model), [highs] if isinstance(highs, str) else highs_read_back(highs, model)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_s_lp_file_reads_back_as_exactly_its_model(name):
    family = FAMILIES[name]
    for seed in range(2):
        for status in ("optimal", *family.statuses):
            model = family.linear_model(generated(name, seed, status).data)
            assert _differences(write_lp(model), model) == ([], [])


def _slack_row(model: LinearModel):
    """A `<=` or `>=` row that does not bind at the optimum, with its slack."""
    values = solve_model(model).values
    for row in model.rows:
        slack = row.rhs - row.activity(values) if row.sense == "<=" else row.activity(values) - row.rhs
        if row.sense != "==" and slack > 1e-3:
            return row, slack
    raise AssertionError("no row with slack")


def _same_outcome(lp: str, model: LinearModel) -> bool:
    truth = solve_model(model)
    return all(
        Outcome(read.status, read.objective).matches(Outcome(truth.status, truth.objective))
        for read in (solve_lp_text_scip(lp), solve_lp_text_highs(lp))
    )


@pytest.mark.parametrize("name", ["production_planning", "knapsack", "blending"])
def test_a_file_with_the_model_s_outcome_but_another_row_is_caught(name):
    """Tighten a row that does not bind by half its slack: both readers' solves still reach the
    model's outcome (the old check passed the file), the structural comparison names the row."""
    model = FAMILIES[name].linear_model(generated(name, 0).data)
    row, slack = _slack_row(model)
    changed_row = replace(row, rhs=row.rhs - slack / 2 if row.sense == "<=" else row.rhs + slack / 2)
    changed = replace(model, rows=tuple(changed_row if r is row else r for r in model.rows))
    lp = write_lp(changed)
    assert _same_outcome(lp, model)
    scip, highs = _differences(lp, model)
    assert scip and highs
    assert all(row.name in problems[0] for problems in (scip, highs))


def test_a_changed_bound_and_a_dropped_integrality_are_caught():
    model = FAMILIES["knapsack"].linear_model(generated("knapsack", 0).data)
    # a binary written as an integer in [0, 3]; written as an integer in [0, 1] it is the same
    # variable, which the comparison accepts
    variable = next(v for v in model.variables if v.kind == "binary")
    same = replace(variable, kind="integer", lower=0.0, upper=1.0)
    assert _differences(
        write_lp(replace(model, variables=tuple(same if v is variable else v for v in model.variables))), model
    ) == ([], [])
    relaxed = replace(variable, kind="integer", lower=0.0, upper=3.0)
    changed = replace(model, variables=tuple(relaxed if v is variable else v for v in model.variables))
    scip, highs = _differences(write_lp(changed), model)
    assert scip and highs and all(variable.name in problems[0] for problems in (scip, highs))

    continuous = replace(model, variables=tuple(replace(v, kind="continuous", upper=1.0) for v in model.variables))
    scip, highs = _differences(write_lp(continuous), model)
    assert scip and highs


def test_an_unreadable_file_is_a_failure_of_each_reader():
    model = FAMILIES["knapsack"].linear_model(generated("knapsack", 0).data)
    scip, highs = _differences("Maximize\n obj: 3 x +\nSubject To\n c: x <=\nEnd\n", model)
    assert scip and highs


class _Counted:
    def __init__(self, monkeypatch):
        self.solved: list[str] = []
        original = verify.solve_read_highs
        monkeypatch.setattr(verify, "solve_read_highs", lambda highs, lp: self.solved.append(lp) or original(highs, lp))


def test_only_a_mip_optimum_is_re_solved_from_the_file(monkeypatch, runner):  # noqa: F811 - pytest fixture
    counted = _Counted(monkeypatch)
    for name, status, mip_optimum in (
        ("knapsack", "optimal", True),
        ("knapsack", "infeasible", False),
        ("network_flow", "optimal", False),
        ("production_planning", "unbounded", False),
    ):
        made = generated(name, 1, status)
        problem = verify.verify_problem(FAMILIES[name], made.data, made.status, made.note, runner, run_program=False)
        assert {"lp_scip", "lp_highs"} <= set(problem.checks)
        assert counted.solved == ([problem.lp] if mip_optimum else []), (name, status)
        counted.solved.clear()


def test_a_wrong_writer_fails_verification_at_lp_scip(monkeypatch, runner):  # noqa: F811 - pytest fixture
    """A writer that drops a row that does not bind writes a file with the right outcome; the
    verification rejects it at `lp_scip`, naming the row."""
    model = FAMILIES["production_planning"].linear_model(generated("production_planning", 0).data)
    row, _ = _slack_row(model)
    real_write = verify.write_lp

    def dropping(model_: LinearModel) -> str:
        return real_write(replace(model_, rows=tuple(r for r in model_.rows if r.name != row.name)))

    monkeypatch.setattr(verify, "write_lp", dropping)
    made = generated("production_planning", 0)
    with pytest.raises(verify.VerificationFailed) as failure:
        verify.verify_problem(
            FAMILIES["production_planning"], made.data, made.status, made.note, runner, run_program=False
        )
    assert failure.value.check == "lp_scip"
    assert row.name in failure.value.detail
