"""DTA: the teacher ensemble behind one interface, rewriting into the student's style, agreement
checks against the solver, the pluggable reflection judge, and signal-aware selection.

Model teachers are tested against a local OpenAI-compatible server started here and a tiny
random-init transformers model saved here; nothing is downloaded."""

from __future__ import annotations

import random

import pytest
from test_or_data_support import runner, tiny_lm_dir, verified  # noqa: F401 - fixtures
from workload_helpers import FakeOpenAIServer

from trex.workloads.llm_clients import OpenAIClient
from trex.workloads.or_data.agreement import check_candidate
from trex.workloads.or_data.dta import DtaPipeline
from trex.workloads.or_data.judge import ClientJudge, JudgePanel, ProgrammaticJudge, Review
from trex.workloads.or_data.rewrite import printed_decisions, prose_of, rewrite
from trex.workloads.or_data.selection import SelectionPolicy, select, signal_of
from trex.workloads.or_data.style import StyleTemplate, split_sections
from trex.workloads.or_data.tasks import build_task
from trex.workloads.or_data.teachers import PROGRAMMATIC, Candidate, ClientTeacher, ProgrammaticTeacher, teacher_prompt

STYLE = StyleTemplate()


@pytest.fixture(scope="module")
def tasks(runner):
    """Two text-to-code tasks and one text-to-model task on verified instances."""
    made = []
    for number, (family, category, variant) in enumerate(
        (
            ("production_planning", "text_to_code", "code"),
            ("blending", "text_to_code", "code"),
            ("knapsack", "text_to_model", "model"),
        )
    ):
        problem = verified(family, 30 + number, runner)
        made.append(
            build_task(
                f"task-{number}",
                problem,
                category,
                variant,
                text_rng=random.Random(number),
                task_rng=random.Random(number),
                runner=runner,
            )
        )
    return made


def rngs(tasks):
    return {task.id: random.Random(0) for task in tasks}


def free_form(task, *, correct: bool) -> str:
    """How a model teacher might answer: prose, a fenced program (or LP file), a final line."""
    program = task.target.program if correct else flipped_sense(task.target.program)
    if task.variant == "model":
        lp = task.target.lp if correct else task.target.lp.replace("Maximize", "Minimize")
        model = "The model: maximize $\\sum_i v_i y_i$ subject to $\\sum_i w_{di} y_i \\le C_d$ for every limit $d$, $y_i \\in \\{0,1\\}$."
        return f"We pick items to maximize value.\n\n{model}\n\n```lp\n{lp}```\n\nOptimal objective value: {task.truth.text()}\n"
    return f"Let me think about the decisions first.\n\nWe use one variable per product.\n\n```python\n{program}```\n\nOptimal objective value: {task.truth.text()}\n"


def flipped_sense(program: str) -> str:
    if 'sense="maximize"' in program:
        return program.replace('sense="maximize"', 'sense="minimize"')
    return program.replace('sense="minimize"', 'sense="maximize"')


def responder(tasks, correct_ids):
    def respond(prompt: str) -> str:
        for task in tasks:
            if task.prompt in prompt:
                return free_form(task, correct=task.id in correct_ids)
        return "I do not know."

    return respond


def test_the_programmatic_teacher_alone_runs_the_whole_pipeline_offline(tasks, runner):
    decisions = DtaPipeline([ProgrammaticTeacher(STYLE)], runner).run(tasks, rngs(tasks))
    for task, decision in zip(tasks, decisions, strict=True):
        assert decision.selection.signal == "single" and decision.selection.chosen == PROGRAMMATIC
        assert decision.answer == STYLE.render(task.category, task.variant, task.reference)
        assert all(check.correct for check in decision.checks) and all(verdict.passed for verdict in decision.verdicts)


def test_an_endpoint_teacher_is_rewritten_into_the_style_and_disagreement_is_kept(tasks, runner):
    correct = {tasks[0].id, tasks[2].id}
    server = FakeOpenAIServer(respond=responder(tasks, correct))
    try:
        teacher = ClientTeacher("openai-1", OpenAIClient(server.url, "tiny", backoff_s=0.01))
        decisions = DtaPipeline([ProgrammaticTeacher(STYLE), teacher], runner).run(tasks, rngs(tasks))
    finally:
        server.stop()
    assert sorted(request["messages"][-1]["content"] for request in server.requests) == sorted(
        teacher_prompt(task) for task in tasks
    )
    right, wrong, lp_task = decisions
    # the model got it right: unanimous, and the model's own (rewritten) answer is emitted
    assert right.selection.signal == "unanimous" and right.selection.chosen == "openai-1"
    assert "Let me think about the decisions first." in right.answer
    # every section of the layout but Checking the plan, which is computed from the verified plan and is
    # not added to a teacher's answer (its plan may be another optimum)
    headings = [h for h in split_sections(right.answer) if h]
    assert headings == [h for h in STYLE.headings_of("text_to_code", "code") if h != "Checking the plan"]
    assert STYLE.accepts(headings, "text_to_code", "code")
    # the model got it wrong: contested, the verified programmatic answer is emitted
    assert wrong.selection.signal == "contested" and wrong.selection.kept and wrong.selection.chosen == PROGRAMMATIC
    model_check = next(check for check in wrong.checks if check.teacher == "openai-1")
    assert not model_check.correct and model_check.reached is not None
    assert lp_task.selection.chosen == "openai-1" and "```lp" in lp_task.answer


def test_keep_unanimous_spends_the_budget_on_contested_tasks(tasks, runner):
    server = FakeOpenAIServer(respond=responder(tasks, {tasks[0].id, tasks[2].id}))
    try:
        teacher = ClientTeacher("openai-1", OpenAIClient(server.url, "tiny"))
        policy = SelectionPolicy(keep_unanimous=0.0)
        decisions = DtaPipeline([ProgrammaticTeacher(STYLE), teacher], runner, policy=policy).run(tasks, rngs(tasks))
    finally:
        server.stop()
    assert [decision.selection.kept for decision in decisions] == [False, True, False]
    assert decisions[0].answer is None


def test_a_failing_endpoint_yields_error_candidates_and_the_verified_answer_survives(tasks, runner):
    server = FakeOpenAIServer(script=[400] * 10)
    try:
        teacher = ClientTeacher("openai-1", OpenAIClient(server.url, "tiny", backoff_s=0.01, max_retries=0))
        decisions = DtaPipeline([ProgrammaticTeacher(STYLE), teacher], runner).run(tasks[:1], rngs(tasks))
    finally:
        server.stop()
    failed = next(check for check in decisions[0].checks if check.teacher == "openai-1")
    assert failed.reached is None and "refused" in failed.failure
    assert decisions[0].selection.signal == "contested" and decisions[0].selection.chosen == PROGRAMMATIC


def _tiny_teacher_decision(tasks, runner, tiny_lm_dir, *, compile: bool):
    from trex.workloads.llm_clients.local import TransformersClient

    client = TransformersClient(tiny_lm_dir, compile=compile, max_new_tokens=4 if compile else 12)
    assert client.identity()["compile"] is compile
    decisions = DtaPipeline([ProgrammaticTeacher(STYLE), ClientTeacher("tiny", client)], runner).run(
        tasks[:1], rngs(tasks)
    )
    tiny_check = next(check for check in decisions[0].checks if check.teacher == "tiny")
    assert tiny_check.failure.startswith("no_program")  # it answered, but random weights write no program
    assert tiny_check.reached is None and not tiny_check.correct
    assert decisions[0].selection.signal == "contested" and decisions[0].answer is not None


def test_a_local_transformers_teacher_is_checked_like_any_other(tasks, runner, tiny_lm_dir):
    _tiny_teacher_decision(tasks, runner, tiny_lm_dir, compile=False)


@pytest.mark.slow
def test_a_local_transformers_teacher_runs_through_trex_compile(tasks, runner, tiny_lm_dir):
    # each decoding step has a new sequence length, so the compiled model recompiles: minutes
    _tiny_teacher_decision(tasks, runner, tiny_lm_dir, compile=True)


def test_without_any_passing_answer_the_task_is_dropped(tasks, runner):
    server = FakeOpenAIServer(respond=responder(tasks, set()))
    try:
        teacher = ClientTeacher("openai-1", OpenAIClient(server.url, "tiny"))
        decisions = DtaPipeline([teacher], runner).run(tasks[:2], rngs(tasks))
    finally:
        server.stop()
    assert all(decision.selection.signal == "unverified" and decision.answer is None for decision in decisions)


def test_the_reflection_judge_reads_the_verdict_and_fails_answers_without_one(tasks, runner):
    replies = iter(
        [
            "Looks right.\nVERDICT: PASS",
            "The capacity row is wrong.\nVERDICT: FAIL because of capacity",
            "no verdict here",
        ]
    )
    server = FakeOpenAIServer(respond=lambda prompt: next(replies))
    try:
        judge = ClientJudge(OpenAIClient(server.url, "judge", concurrency=1))
        items = [_review(task, runner) for task in tasks]
        verdicts = judge.review(items)
    finally:
        server.stop()
    assert [verdict.passed for verdict in verdicts] == [True, False, False]
    assert "capacity" in verdicts[1].reasons[0] and "no VERDICT" in verdicts[2].reasons[0]


def test_a_judge_panel_asks_later_judges_only_about_answers_earlier_ones_passed(tasks, runner):
    server = FakeOpenAIServer(respond=lambda prompt: "VERDICT: PASS")
    try:
        panel = JudgePanel([ProgrammaticJudge(STYLE), ClientJudge(OpenAIClient(server.url, "judge"))])
        good = _review(tasks[0], runner)
        broken = Review(good.task, good.text.replace("## Program", "## Code"), good.parts, good.check)
        verdicts = panel.review([good, broken])
    finally:
        server.stop()
    assert [verdict.passed for verdict in verdicts] == [True, False]
    assert len(server.requests) == 1  # the broken answer never reached the model judge
    assert "programmatic: sections" in verdicts[1].reasons[0]


def test_the_programmatic_judge_checks_structure_not_only_the_number(tasks, runner):
    lp_task = tasks[2]
    fewer_items = lp_task.target.lp.replace(" Binary\n", " Binary\n")
    lines = [line for line in fewer_items.splitlines() if not line.startswith(" capacity")]
    good = _review(lp_task, runner)
    candidate = Candidate("m", lp_task.id, good.text.replace(lp_task.target.lp.rstrip(), "\n".join(lines).rstrip()))
    check = check_candidate(candidate, lp_task, runner)
    review = Review(lp_task, candidate.text, rewrite(candidate, check, lp_task), check)
    problems = ProgrammaticJudge(STYLE).problems(review)
    assert any("re-solving reaches" in problem for problem in problems)  # without capacities the optimum moves


def test_a_right_number_from_a_wrong_program_is_not_agreement(tasks, runner):
    task = tasks[0]
    text = free_form(task, correct=False)  # states the true optimum, runs the wrong program
    check = check_candidate(Candidate("m", task.id, text), task, runner)
    assert check.stated is not None and check.stated.matches(task.truth)
    assert check.reached is not None and not check.reached.matches(task.truth) and not check.correct


def test_rewrite_keeps_the_teachers_substance_and_takes_decisions_from_its_run():
    text = "<think>scratch</think>\n## Approach\nWe maximize.\n\n```python\nprint(1)\n```\nOptimal objective value: 3\n"
    assert prose_of(text) == "We maximize."
    stdout = "setup noise = 1\nOptimal objective value: 12\nmake[chairs] = 4\nmake[tables] = 2\n"
    assert printed_decisions(stdout) == ("make[chairs] = 4", "make[tables] = 2")


def test_selection_signals_follow_the_agreement_of_passing_answers():
    assert [signal_of(p) for p in ([True], [True, True], [True, False], [False, False])] == [
        "single",
        "unanimous",
        "contested",
        "unverified",
    ]
    chosen = select(["programmatic", "a", "b"], [True, False, True], SelectionPolicy(), random.Random(0))
    assert chosen.chosen == "b"  # model teachers before the programmatic one
    preferred = select(
        ["programmatic", "a", "b"], [True, True, True], SelectionPolicy(prefer=("programmatic",)), random.Random(0)
    )
    assert preferred.chosen == "programmatic"
    with pytest.raises(ValueError):
        SelectionPolicy(keep_unanimous=1.5)


def _review(task, runner) -> Review:
    candidate = ProgrammaticTeacher(STYLE).propose([task])[0]
    check = check_candidate(candidate, task, runner)
    return Review(task, candidate.text, rewrite(candidate, check, task), check)
