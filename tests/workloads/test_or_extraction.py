"""Programs out of model output; answers out of program output."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_helpers import ORLM_DIR, requires_data

from trex.workloads.or_eval.extraction import (
    extract_code,
    extract_final_answer,
    extract_lp,
    labelled_numbers,
    prediction_from_run,
)
from trex.workloads.sandbox import SolveRecord

PROGRAM = "import pyscipopt\nm = pyscipopt.Model()\nm.optimize()\n"


def test_code_is_taken_from_the_python_fence():
    output = f"## Model\nminimize cost\n\n```python\n{PROGRAM}```\n\nThe code solves it."
    assert extract_code(output) == PROGRAM


def test_the_last_solver_block_wins_over_drafts_and_helpers():
    draft = "import coptpy\nprint('draft')\n"
    final = "import coptpy\nprint('final')\n"
    usage = "print(solve())\n"
    output = f"```python\n{draft}```\nFixed:\n```python\n{final}```\nUsage:\n```python\n{usage}```"
    assert extract_code(output) == final


def test_reasoning_sections_are_ignored():
    output = f"<think>maybe\n```python\nimport pulp\nprint('thinking')\n```\n</think>\n```python\n{PROGRAM}```"
    assert extract_code(output) == PROGRAM


def test_a_block_cut_off_at_the_token_limit_runs_to_the_end():
    assert extract_code(f"Here:\n```python\n{PROGRAM}") == PROGRAM


def test_an_unlabeled_fence_counts_when_it_is_python():
    assert extract_code(f"```\n{PROGRAM}```") == PROGRAM
    assert extract_code("```\nMaximize\n obj: x\nEnd\n```") is None


def test_no_code_means_none():
    assert extract_code("The optimal cost is 42.") is None


@given(prefix=st.text(max_size=200), suffix=st.text(max_size=200))
def test_code_is_recovered_from_any_surrounding_prose(prefix, suffix):
    prefix = prefix.replace("`", "'")
    suffix = suffix.replace("`", "'")
    assert extract_code(f"{prefix}\n```python\n{PROGRAM}```\n{suffix}") == PROGRAM


@given(text=st.text(max_size=500))
def test_extraction_never_raises_on_arbitrary_text(text):
    extract_code(text)
    extract_lp(text)
    extract_final_answer(text, quantities=True)
    prediction_from_run(text, [], quantities=True)


def test_lp_model_from_a_fence_or_from_bare_text():
    model = "Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + 2 y <= 12\nBounds\n 0 <= x <= 10\nEnd\n"
    assert extract_lp(f"```lp\n{model}```") == model
    assert extract_lp(f"The model:\n{model}That is all.") == model
    assert extract_lp("no model here") is None


@pytest.mark.parametrize(
    "text, objective, no_solution",
    [
        ("so the answer is \\boxed{1,160}.", 1160.0, False),
        ("\\boxed{12} then revised \\boxed{\\$13.5}", 13.5, False),
        ("\\boxed{infeasible}", None, True),
        ("Optimal objective value: 7", 7.0, False),
        ("The answer is: -2.5e3 dollars", -2500.0, False),
        ("I cannot solve this.", None, False),
    ],
)
def test_final_answers(text, objective, no_solution):
    prediction = extract_final_answer(text)
    assert (prediction.objective, prediction.no_solution) == (objective, no_solution)


def test_marker_line_beats_the_solver_record():
    stdout = "Minimum cost: $29.0\nOptimal objective value: 29.5\n"
    prediction = prediction_from_run(stdout, [SolveRecord("coptpy", "optimal", 30.0)])
    assert (prediction.objective, prediction.source) == (29.5, "marker")


def test_orlm_markers_are_read():
    assert prediction_from_run("Just print the best solution: 1160.0\n", []).objective == 1160.0
    no_best = prediction_from_run(
        "No optimal solution found.\nNo Best Solution\n", [SolveRecord("coptpy", "optimal", 3.0)]
    )
    assert no_best.no_solution and no_best.objective is None


def test_the_last_marker_printed_counts():
    assert prediction_from_run("Optimal objective value: 1\nOptimal objective value: 2\n", []).objective == 2.0


def test_solver_record_is_used_when_nothing_is_marked():
    prediction = prediction_from_run("Minimum cost: $29.0\n", [SolveRecord("pyscipopt", "optimal", 29.25)])
    assert (prediction.objective, prediction.source) == (29.25, "solver:pyscipopt")
    infeasible = prediction_from_run("", [SolveRecord("gurobipy", "infeasible", None)])
    assert infeasible.no_solution and infeasible.source == "solver:gurobipy"


def test_printed_objective_is_the_last_resort():
    stdout = "x = 3\nTotal cost: $1,234.50\nDone\n"
    prediction = prediction_from_run(stdout, [SolveRecord("pulp", "not solved", None)])
    assert (prediction.objective, prediction.source) == (1234.5, "printed")
    assert prediction_from_run("x = 3\ny = 4\n", []).empty


def test_labelled_numbers_keep_the_last_value_of_each_label():
    assert labelled_numbers("Total profit: 5\nx: y\nTotal profit: 655.0\nCars = 3\n") == {
        "Total profit": 655.0,
        "Cars": 3.0,
    }


@requires_data
def test_orlm_outputs_yield_the_program_orlm_extracted():
    """Our extraction finds the same program ORLM's own extraction did (before its appended
    ADD_SCRIPT), on every record of the released NL4OPT file."""
    appended = "\nif model.status == COPT.OPTIMAL:"
    with open(ORLM_DIR / "NL4OPT.executed.jsonl", encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines]
    for record in records:
        orlm_program = record["to_run_script"][: record["to_run_script"].rindex(appended)]
        assert extract_code(record["en_math_model_coptpy_code"]).strip() == orlm_program.strip()
