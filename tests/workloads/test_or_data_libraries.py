"""Programs in PuLP, Pyomo and coptpy: translated from the pyscipopt layout, verified in the sandbox
like the original, named in the prompt, and counted by the diversity report."""

from __future__ import annotations

import random
import re

import pytest
from test_or_data_support import generated, runner  # noqa: F401 - runner is a fixture

from trex.workloads.or_data.code_style import CodeStyle, restyle, style_for
from trex.workloads.or_data.diversity import code_style_key
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.judge import _program_structure
from trex.workloads.or_data.seeds import stream
from trex.workloads.or_data.solver_libraries import (
    LIBRARIES,
    TranslationError,
    choose_library,
    translate,
    usable_for,
)
from trex.workloads.or_data.style import StyleTemplate
from trex.workloads.or_data.tasks import build_task
from trex.workloads.or_data.verify import verify_problem

OTHER = ("pulp", "pyomo", "coptpy")


@pytest.mark.parametrize("library", OTHER)
@pytest.mark.parametrize("name", ["lot_sizing", "machine_scheduling", "bin_packing"])
def test_translated_programs_reach_the_solver_outcome(name, library, runner):
    """Families with the less common constructs: scalar variables, multi-line sums, a list of
    variables, conditional bounds, empty sums. The sandbox run must print SCIP's outcome."""
    made = generated(name, 3)
    problem = verify_problem(FAMILIES[name], made.data, made.status, made.note, runner, library=library)
    assert problem.library == library
    assert f"import {library if library != 'pyomo' else 'pyomo.environ'}" in problem.program
    assert "pyscipopt" not in problem.program and not re.search(r"(?<![\w.])quicksum\(", problem.program)
    assert code_style_key(problem.program).startswith(library + "/")
    assert not _program_structure(problem.program)


def test_an_infeasible_instance_reports_infeasible_in_every_library(runner):
    made = generated("transportation", 4, "infeasible")
    for library in OTHER:
        problem = verify_problem(FAMILIES["transportation"], made.data, made.status, made.note, runner, library=library)
        assert problem.library == library and problem.outcome.status == "infeasible"


def test_unbounded_instances_keep_pyscipopt(runner):
    """HiGHS through Pyomo says "infeasible or unbounded": such instances stay with SCIP."""
    name = next(name for name, family in FAMILIES.items() if "unbounded" in family.statuses)
    made = generated(name, 2, "unbounded")
    assert not usable_for("pyomo", "unbounded")
    problem = verify_problem(FAMILIES[name], made.data, made.status, made.note, runner, library="pyomo")
    assert problem.library == "pyscipopt" and problem.outcome.status == "unbounded"


def test_the_prompt_names_the_library_the_answer_uses(runner):
    made = generated("knapsack", 6)
    problem = verify_problem(FAMILIES["knapsack"], made.data, made.status, made.note, runner, library="pulp")
    task = build_task(
        "t", problem, "text_to_code", "code", text_rng=random.Random(1), task_rng=random.Random(2), runner=runner
    )
    assert "PuLP" in task.prompt and "pyscipopt" not in task.prompt
    assert task.reference.program.startswith("import pulp")


def test_library_choice_follows_the_task():
    rng = random.Random(0)
    assert {choose_library("repair", rng) for _ in range(50)} == {"pyscipopt"}
    assert {choose_library("decision", rng) for _ in range(50)} == {"pyscipopt"}
    assert {choose_library("code", rng) for _ in range(200)} == set(LIBRARIES)


def test_translation_refuses_what_it_does_not_know():
    family = FAMILIES["knapsack"]
    program = family.program(family.generate(stream(1, 0, "data"), "optimal").data)
    with pytest.raises(TranslationError):
        translate(program.replace("model.setObjective(", "model.setObjectiveLimit(", 1), "pulp")
    with pytest.raises(ValueError):
        translate(program, "gurobipy")
    assert translate(program, "pyscipopt") == program


def test_model_name_styles_apply_to_every_library():
    family = FAMILIES["production_planning"]
    program = family.program(family.generate(stream(1, 2, "data"), "optimal").data)
    for library in OTHER:
        styled = restyle(program, CodeStyle("from", "prob", "dict", library))
        assert "prob" in styled and "model." not in styled.replace("pyo.ConcreteModel", "")
        assert code_style_key(styled) == f"{library}/prob/dict"
        assert style_for(program, library).library == library


def test_model_tasks_also_start_from_a_program_or_from_an_lp_file(runner):
    """code -> model and LP -> model: the input is shown, the answer gives what the input lacks."""
    made = generated("knapsack", 3)
    problem = verify_problem(FAMILIES["knapsack"], made.data, made.status, made.note, runner, library="pyomo")
    sources = {}
    for seed in range(30):
        task = build_task(
            "t",
            problem,
            "text_to_model",
            "model",
            text_rng=random.Random(seed),
            task_rng=random.Random(seed),
            runner=runner,
        )
        sources.setdefault(task.source, task)
    code, lp = sources["code"], sources["text+lp"]
    assert problem.program.strip() in code.prompt and code.inputs == ("code",) and code.outputs == ("math", "lp")
    assert "`select`" in code.reference.reasoning and "`capacity`" in code.reference.reasoning
    assert code.reference.lp == problem.lp and not code.statement
    assert problem.lp.strip() in lp.prompt and lp.inputs == ("text", "lp") and lp.outputs == ("math",)
    assert lp.reference.lp == problem.lp and lp.reference.math and "algebraic model" in lp.reference.reasoning
    rendered = StyleTemplate().render("text_to_model", "model", lp.reference)
    assert StyleTemplate().accepts(re.findall(r"^## (.+)$", rendered, re.M), "text_to_model", "model", problem.outcome)


def test_structural_what_ifs_remove_an_option_and_explain_the_effect(runner):
    """A route closes / a source drops out: the changed instance is re-verified, and the reason
    says whether the original plan used what was removed."""
    found = {}
    for name in ("transportation", "piecewise_costs"):
        made = generated(name, 2)
        problem = verify_problem(FAMILIES[name], made.data, made.status, made.note, runner)
        for seed in range(40):
            task = build_task(
                "t",
                problem,
                "solve_analyze",
                "what_if",
                text_rng=random.Random(seed),
                task_rng=random.Random(seed),
                runner=runner,
            )
            if task.what_if is not None and task.what_if.change:
                found[name] = task
                break
    assert set(found) == {"transportation", "piecewise_costs"}
    for task in found.values():
        analysis = task.reference.analysis
        assert task.what_if.change in analysis and "removed option" in analysis
        removed = {v.name for v in task.problem.model.variables} - {v.name for v in task.target.model.variables}
        assert removed  # the option is gone from the re-verified model
        if task.target.outcome.status == "optimal":  # removing options never improves a minimum
            assert task.target.outcome.objective >= task.problem.outcome.objective - 1e-6
