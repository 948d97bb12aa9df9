"""One completion -> one sample result, for each answer form."""

from __future__ import annotations

import pytest

from trex.workloads.llm_clients import Completion
from trex.workloads.or_eval import Item, NoSolution, Objective, Quantities, Rule, is_correct
from trex.workloads.or_eval.execute import MISSING_PREDICTION, NO_ANSWER, NO_OBJECTIVE, NO_PROGRAM, evaluate_completion
from trex.workloads.or_eval.prompts import FORMS, build_prompt

ITEM = Item(
    id="1",
    question="Maximize 3x + 2y subject to x + 2y <= 12, x <= 10 integer, y <= 4.5.",
    answer=Objective(32.0),
    category="c",
    line=1,
)
LP_OUTPUT = """Here is the model.
```lp
Maximize
 obj: 3 x + 2 y
Subject To
 c1: x + 2 y <= 12
Bounds
 0 <= x <= 10
 0 <= y <= 4.5
General
 x
End
```
"""


def run(sandboxes, completion: Completion, form: str, item: Item = ITEM):
    return evaluate_completion(item, 0, completion, form, sandboxes("process"))


def test_lp_form_solves_the_extracted_model_with_scip(sandboxes):
    result = run(sandboxes, Completion(key="1#0", text=LP_OUTPUT), "lp")
    assert result.failure is None, result.detail + result.stderr_tail
    assert (result.prediction.objective, result.prediction.source) == (32.0, "marker")
    assert result.executed


def test_code_form_runs_the_extracted_program(sandboxes):
    output = "```python\nimport pyscipopt\nm = pyscipopt.Model(); m.hideOutput()\nx = m.addVar(ub=32)\nm.setObjective(x, 'maximize'); m.optimize()\n```"
    result = run(sandboxes, Completion(key="1#0", text=output), "pyscipopt")
    assert result.failure is None
    assert (result.prediction.objective, result.prediction.source) == (32.0, "solver:pyscipopt")
    assert is_correct(result.prediction, ITEM.answer, Rule.STRICT)


def test_answer_form_reads_the_boxed_value_without_running_anything(sandboxes):
    result = run(sandboxes, Completion(key="1#0", text="... so the optimum is \\boxed{32}."), "answer")
    assert (result.prediction.objective, result.executed) == (32.0, False)
    assert run(sandboxes, Completion(key="1#0", text="I am not sure."), "answer").failure == NO_ANSWER


def test_outputs_without_a_program_or_objective_fail_with_their_own_kinds(sandboxes):
    assert run(sandboxes, Completion(key="1#0", text="The answer is 32."), "coptpy").failure == NO_PROGRAM
    assert run(sandboxes, Completion(key="1#0", text="no model"), "lp").failure == NO_PROGRAM
    assert run(sandboxes, Completion(key="1#0", text="```python\nx = 1\n```"), "pulp").failure == NO_OBJECTIVE
    assert run(sandboxes, Completion(key="1#0", text=None), "coptpy").failure == MISSING_PREDICTION


def test_a_stored_program_takes_precedence_over_the_output_text(sandboxes):
    completion = Completion(
        key="1#0",
        text="```python\nprint('Optimal objective value: 1')\n```",
        program="print('Optimal objective value: 32')",
    )
    assert run(sandboxes, completion, "coptpy").prediction.objective == 32.0


def test_named_quantities_are_read_from_printed_lines(sandboxes):
    item = Item(
        id="q",
        question="q",
        answer=Quantities((("Total profit", 655.0), ("Number of cars", 3.0))),
        category="c",
        line=1,
    )
    program = "print('Number of cars: 3')\nprint('Total profit: 655.00')\nprint('Optimal objective value: 655')"
    result = run(sandboxes, Completion(key="q#0", text=None, program=program), "pyscipopt", item)
    assert is_correct(result.prediction, item.answer, Rule.STRICT)


def test_infeasible_programs_answer_no_best_solution(sandboxes):
    program = (
        "import pyscipopt\nm = pyscipopt.Model(); m.hideOutput()\nx = m.addVar(lb=0); m.addCons(x <= -1); m.optimize()"
    )
    item = Item(id="n", question="q", answer=NoSolution(), category="c", line=1)
    result = run(sandboxes, Completion(key="n#0", text=None, program=program), "pyscipopt", item)
    assert result.prediction.no_solution
    assert is_correct(result.prediction, item.answer, Rule.STRICT)


@pytest.mark.parametrize("form", FORMS)
def test_every_form_has_a_prompt_that_carries_the_question(form):
    prompt = build_prompt(ITEM, form)
    assert ITEM.question in prompt


def test_quantity_prompts_list_the_names_to_print():
    item = Item(id="q", question="q", answer=Quantities((("Total profit", 1.0), ("Cars", 2.0))), category="c", line=1)
    prompt = build_prompt(item, "gurobipy")
    assert "  - Total profit\n  - Cars" in prompt
    assert "`gurobipy`" in prompt


def test_orlm_form_is_orlms_template_verbatim():
    assert build_prompt(ITEM, "orlm") == (
        "Below is an operations research question. Build a mathematical model and corresponding python code using "
        f"`coptpy` that appropriately addresses the question.\n\n# Question:\n{ITEM.question}\n\n# Response:"
    )
