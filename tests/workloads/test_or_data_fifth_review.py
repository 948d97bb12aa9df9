"""The defect classes of the Fifth review (bench/or_data/REVIEW.md, seed 2381), each twice: the prose
checker flags the exact sentence the reviewer quoted, and the generator no longer writes it (the fixed
writer's output for the same situation passes the checker and says the right thing)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from test_or_data_review_defects import _assignment_bug, _toy_design
from test_or_data_support import generated

from trex.workloads.or_data.bugs import Bug
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.linear_model import ModelBuilder
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.repair_reason import symptom_reason
from trex.workloads.or_data.solve import solve_model
from trex.workloads.or_data.tasks import lp_reading
from trex.workloads.or_data.worked import worked_check

# Sentences quoted in the Fifth review, with the kind the checker must give.
REVIEWED = [
    (
        "- Load for Haas VF-2: 8 (assign, pump covers, Haas VF-2) = 8, at its limit of 8 (makespan) (binding).",
        "stacked_parentheses",
    ),
    (
        "- $w_j$: weight of job $j$ (the penalty per hour the order waits (customer priority)): housing 6",
        "stacked_parentheses",
    ),
    (
        "With these data it gives 3 rows, one for each lane ((Inland Port, Cross-Dock Leipzig), (Hub Berlin, Dresden)).",
        "stacked_parentheses",
    ),
    (
        "1. Order (first before second) (if $y_{ij}=1$, $i$ ends before $j$ starts): $$S_i + p_i \\le S_j$$",
        "stacked_parentheses",
    ),
    ("- $p_{jm}$: processing time of $j$ on $m$ (minutes; – = cannot run there) (table below)", "stacked_parentheses"),
    ("The sources are Router C (110 Gbps); the destinations require Exchange South (110 Gbps).", "seam"),
    ("Processing times (hours) depend on the CNC machine: A dash means the job cannot run on that machine.", "seam"),
    ("- $D_j$: deadline of job $j$ (where it has one): \n- $H$: horizon", "seam"),
    ("A mast at Farm Mast would cost 195 thousand (GBP) and cover Hawthorn.", "seam"),
    ("The production manager of Golden Crust Bakery must set the dayly output of its bakery.", "seam"),
    ("The RNA batch sample batch takes 2 hours, can start from hour 0, has weight 7.", "seam"),
    ("- Start the exome batch sample batch after 5 hours; it finishes after 7 hours.", "seam"),
    (
        "The LP file maximizes a linear objective over 4 variables in the families `spend` (4 variables, continuous); "
        "its constraints come in the families no rows.",
        "mechanical_reading",
    ),
    ("`start` is declared General/Binary, so this is a mixed-integer program.", "mechanical_reading"),
    (
        "Checking the tightest rows by hand:\n\n- Routes needed: 1 (arc, depot, A) + 1 (arc, depot, B) + 1 (arc, depot, C)"
        " + 1 (arc, depot, D) = 4, 1 above the minimum of 3.",
        "check_rows",
    ),
    (
        "The rows that hold the plan, written out:\n\n- Load for Law Courts, Harbor Point: 13 (load, Harbor Point) = 13, "
        "at its limit of 23 (load, Law Courts) + 23 × 0 (arc, Law Courts, Harbor Point) − 10 = 13, so it binds.",
        "check_rows",
    ),
]


@pytest.mark.parametrize(("text", "kind"), REVIEWED)
def test_the_checker_flags_each_sentence_the_fifth_review_quoted(text, kind):
    assert kind in {flag.kind for flag in check_prose(text)}, check_prose(text)


@pytest.mark.parametrize(
    "text",
    [
        "- Load for Haas VF-2: 8 (assign, pump covers, Haas VF-2) = 8, at its limit of 8 (makespan), so it binds.",
        "- $w_j$: weight of job $j$ (the penalty per hour the order waits, set by customer priority): housing 6",
        "With these data it gives 2 rows, one for each lane (Inland Port → Cross-Dock Leipzig and Hub Berlin → Dresden).",
        "1. Order (first before second; if $y_{ij}=1$, $i$ ends before $j$ starts): $$S_i + p_i \\le S_j$$",
        "The only source is Router C (110 Gbps); the one destination is Exchange South (110 Gbps).",
        "Processing times (hours) depend on the CNC machine (a dash means the job cannot run on that machine):",
        "- $D_j$: deadline of job $j$ (where it has one): none in these data",
        "A mast at Farm Mast would cost 195 thousand GBP and cover Hawthorn.",
        "- Start the RNA-seq sample batch at the very start; it finishes after 2 hours.",
        "It costs 1.50 dollars per keg per week to hold stock; the options the plan leaves out are priced below.",
        # the Sixth review found the row with the most room the least informative: the closest one is shown
        "None of the short rows binds at this plan; the one nearest to binding is:\n\n- Routes needed: 4, 1 above the "
        "minimum of 3.",
    ],
)
def test_the_fixed_wordings_pass_the_checker(text):
    assert check_prose(text) == [], check_prose(text)


def test_a_parameter_and_a_label_with_their_own_parenthesis_get_one_not_two():
    math = MathModel(
        "Toy",
        "minimize",
        "c",
        "total time",
        (SetDef("J", "j", "jobs", ("a", "b", "c")), SetDef("M", "m", "machines", ("m1", "m2"))),
        (
            ParamDef(
                "p_{jm}",
                "processing time (minutes; – = cannot run there)",
                {(j, m): 2 + len(j + m) for j in ("a", "b", "c") for m in ("m1", "m2")},
                ("J", "M"),
            ),
            ParamDef("D_j", "deadline of job $j$ (where it has one)", {}, ("J",)),
        ),
        (VarDef("y", "order", r"\in \{0,1\}", "order", ("J", "J"), indicator="whether a goes first"),),
        (
            ConstraintDef(
                "Order (first before second)",
                "if $y=1$, the first job ends before the second starts",
                "y",
                "order",
                ("J",),
            ),
        ),
    )
    text = math.to_markdown()
    assert "(minutes; – = cannot run there; table below)" in text and "| " in text, text
    assert "Order (first before second; if $y=1$, the first job ends before the second starts)" in text, text
    assert "(where it has one): none in these data" in text, text
    assert not [flag for flag in check_prose(text) if flag.kind in ("stacked_parentheses", "seam")], check_prose(text)


def test_checking_the_plan_calls_no_roomy_row_tight_and_shows_no_switched_off_big_m_row():
    model, math = _toy_design()
    # demand 35 met with 40 (room 5), the link's capacity 80 used for 40 (room 40): nothing binds
    values = {"flow__poznan__prague": 40.0, "build__poznan__prague": 1.0, "makespan": 50.0, "assign__menus__press": 1.0}
    optimum = model.objective_value(values)
    for seed in range(6):
        text = worked_check(model, math, values, optimum, random.Random(seed))
        assert "tightest" not in text and "hold the plan" not in text and "uses of its limits" not in text, text
        assert ("closest to its limit" in text or "nearest to binding" in text) and not check_prose(text), (
            text,
            check_prose(text),
        )
    # an MTZ-like load row of an unused arc (the big-M on a route at 0) is at its limit only through the big-M
    builder = ModelBuilder("mtz")
    load_a, load_b = builder.var("load__a"), builder.var("load__b")
    arc = builder.var("arc__a__b", "binary")
    builder.row("mtz__a__b", {load_b: 1.0, load_a: -1.0, arc: -23.0}, ">=", -13.0)
    builder.row("cap__b", {load_b: 1.0}, "<=", 30.0)
    builder.minimize({arc: 5.0, load_a: 1.0, load_b: 1.0})
    mtz = builder.build()
    values = {"load__a": 23.0, "load__b": 10.0, "arc__a__b": 0.0}
    text = worked_check(mtz, math, values, mtz.objective_value(values), random.Random(0))
    assert "mtz" not in text.lower() or "binds" not in text, text
    assert not [flag for flag in check_prose(text) if flag.kind == "check_rows"], check_prose(text)


def test_a_repair_of_a_flipped_objective_says_where_the_buggy_number_comes_from():
    model, math, _ = _assignment_bug()
    # the intended model minimizes the assignments' cost; the bug maximizes it
    builder = ModelBuilder("costs")
    for variable in model.variables:
        builder.var(variable.name, "binary")
    for row in model.rows:
        builder.row(row.name, dict(row.terms), row.sense, row.rhs)
    costs = {variable.name: float(3 + index % 4) for index, variable in enumerate(model.variables)}
    builder.minimize(costs)
    intended = builder.build()
    buggy_value = solve_model(replace(intended, sense="maximize")).objective
    bug = Bug("objective_sense", "", "maximize", "minimize", f"it reports `Optimal objective value: {buggy_value:g}`")
    reason = symptom_reason(bug, intended, math, random.Random(0))
    assert f"Where the buggy value {buggy_value:g} comes from: the buggy program maximizes" in reason, reason
    assert f"= {buggy_value:g}." in reason and " × 1 (" in reason, reason
    assert check_prose(reason) == [], check_prose(reason)


def test_an_lp_file_is_read_in_words_and_an_empty_constraint_section_is_said_plainly():
    builder = ModelBuilder("alloc")
    names = [builder.var(f"spend__{crop}", upper=228.0 if crop == "corn" else None) for crop in ("orchard", "corn")]
    builder.maximize({names[0]: 0.174, names[1]: 0.075})
    text = lp_reading(builder.build())
    assert "Its Subject To section is empty" in text and "no rows" not in text, text
    assert "2 variables `spend` (continuous, e.g. `spend__orchard`)" in text, text
    assert not check_prose(text), check_prose(text)
    model, _, _ = _assignment_bug()
    text = lp_reading(model, "model")
    assert "in the Binary section, so this is a mixed-integer program" in text, text
    assert "3 equality rows named `cover`" in text and "4 at-most rows named `load`" in text, text
    assert not check_prose(text), check_prose(text)


def test_generated_prompts_of_the_reviewed_families_have_no_seams():
    for family in (
        "time_indexed_scheduling",
        "network_flow",
        "machine_scheduling",
        "set_covering",
        "production_planning",
    ):
        for seed in range(12):
            made = generated(family, seed)
            text = FAMILIES[family].statement(made.data, random.Random(seed))
            assert not [f for f in check_prose(text) if f.kind in ("seam", "stacked_parentheses")], (family, seed, text)
            if family == "time_indexed_scheduling":  # the plan: "right away (time 0)", not "after 0 hours"
                solved = solve_model(FAMILIES[family].linear_model(made.data))
                decisions = " ".join(FAMILIES[family].decisions(made.data, solved.values))
                assert "after 0 " not in decisions, decisions
                assert not [f for f in check_prose(decisions) if f.kind == "seam"], decisions


def test_an_lp_input_answer_explains_no_solution_with_the_files_own_names_and_numbers():
    from types import SimpleNamespace

    from trex.workloads.or_data.certificates import find_ray
    from trex.workloads.or_data.tasks import lp_no_solution_explanation

    builder = ModelBuilder("alloc")  # sample #44: four options, no rows, one bound
    spend = {
        c: builder.var(f"spend__{c}", upper=228.0 if c == "corn" else None) for c in ("orchard", "corn", "vegetables")
    }
    builder.maximize({spend["orchard"]: 0.174, spend["corn"]: 0.075, spend["vegetables"]: 0.212})
    model = builder.build()
    problem = SimpleNamespace(model=model, status="unbounded", certificate=find_ray(model), lp="alloc", note="")
    text = lp_no_solution_explanation(problem)
    assert "`spend__orchard` (objective coefficient 0.174)" in text and "no rows at all" in text, text
    assert "%" not in text and "borrow" not in text and "spend__corn` (" not in text, text
    assert not check_prose(text), check_prose(text)
    builder = ModelBuilder("clash")
    x, y = builder.var("make__a"), builder.var("make__b")
    builder.row("demand__total", {x: 1.0, y: 1.0}, ">=", 5.0)
    builder.row("cap__a", {x: 1.0}, "<=", 1.0)
    builder.row("cap__b", {y: 1.0}, "<=", 1.0)
    builder.minimize({x: 1.0, y: 1.0})
    problem = SimpleNamespace(model=builder.build(), status="infeasible", certificate=None, lp="clash", note="")
    text = lp_no_solution_explanation(problem)
    assert "keeps 3 requirements of the file" in text and "- `demand__total`: 1 make__a + 1 make__b >= 5" in text, text
