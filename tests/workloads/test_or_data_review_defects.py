"""The defect classes of the Fourth review (bench/or_data/REVIEW.md), each twice: the prose checker
flags the exact sentence the reviewer quoted, and the generator no longer writes it (the fixed
writer's output for the same situation passes the checker and says the right thing)."""

from __future__ import annotations

import random

import pytest
from test_or_data_support import generated

from trex.workloads.or_data.bugs import Bug, _flipped_inequality, _loosened_equality, _sense_position
from trex.workloads.or_data.explain import instance_phrase, limits_analysis, spoken_names, variable_phrase
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.linear_model import ModelBuilder
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import Statement, setting_clash
from trex.workloads.or_data.prose import singular_noun
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.repair_reason import buggy_model, symptom_reason
from trex.workloads.or_data.solve import solve_model
from trex.workloads.or_data.worked import moved_decisions, objective_line, row_line

# Sentences quoted in the Fourth review (seed 2371's samples), with the kind the checker must give.
REVIEWED = [
    (
        "- Capacity for Hub Poznan, Prague: 35 (flow, timber, Hub Poznan, Prague) − 80 (build, Hub Poznan, Prague) "
        "= −45, 45 below the cap of 0.",
        "number_format",
    ),
    (
        "- Load for offset press: 45 (assign, invitations, offset press) + 55 (assign, menus, offset press) + 50 "
        "(assign, catalogs, offset press) + 45 (assign, labels, offset press) − 195 (makespan) = 0, at its limit "
        "of 0 (binding).",
        "number_format",
    ),
    ("- Machine for 0: 1 (RNA batch, 0) = 1, equal to its limit 1, so the row binds.", "number_format"),
    ("- Symmetry for 2: 1 (2) − 1 (1) = 0, exactly the limit of 0: binding.", "number_format"),
    ("Number of disks used: 1 (1) + 1 (2) + 1 (3) = 3.", "number_format"),
    ("- Machine: 13 of 17 rows binding (0, 1, 2 and 3, ...); the most slack is 16 with 1 to spare.", "number_format"),
    (
        "Total weighted completion time: 30 (microbiome set, 13) + 69 (methylation set, 19) + 40 (RNA batch, 0) = 139.",
        "number_format",
    ),
    (
        "Production, overtime, holding and late-delivery cost: 116,375 (from 7 nonzero regular terms) + 1,900 (from "
        "5 nonzero stock terms) + 350 (from 1 nonzero backlog term) ≈ 118,625.",
        "number_format",
    ),
    ("Total distance driven: 145 (from 9 nonzero arc terms) ≈ 145.", "number_format"),
    (
        "- Load for City Hall, Tower One: 20 (Tower One) − 10 (City Hall) = 10, 15 above the minimum of −5.",
        "number_format",
    ),
    ("Total cost: 4 × 25 (Leeds) + 3 × 30 (York) ≈ 190.", "number_format"),
    (
        "A pet-food company needs to decide how many portions of each of 5 ingredients go into a daily ration for one "
        "animal. One portion of canned meat has 6.5 g of fat and 11 g of protein; it costs USD 1.15. The shelter "
        "houses about 60 animals.",
        "contradicting_filler",
    ),
    (
        "The cheapest menu is wanted: a school cafeteria can combine milk, spinach and oatmeal.\n\nOnly 7 servings of "
        "milk are on hand. The kitchen serves 200 patients a day.",
        "contradicting_filler",
    ),
    (
        "From Dockside Store, Open Table Network supplies 4 shelters with food parcels.\n\nThere are 2 minibuses. "
        "The firm is considering opening a second office in Busan next year.\n\nThe charity has 3 part-time staff.",
        "contradicting_filler",
    ),
    ("In the original plan the variable for milk (servings of each ingredient to use) is 0.", "raw_fill"),
    (
        "Starting from any feasible plan, increasing the tons of each product to make per month for solvent A alone "
        "keeps every constraint satisfied.",
        "raw_fill",
    ),
    ("- The upper bound on the units to make on regular time in each month for February: at most 300", "raw_fill"),
    (
        "**Parameters**\n\n- $p_j$: processing time of job $j$ (hours): bracket 2, flange 3\n- $D_j$: deadline of "
        "job $j$ (where it has one) (table below)\n- $H$: horizon = 18\n\n**Decision variables**\n\n- $x_{jt}$: start",
        "missing_table",
    ),
]


@pytest.mark.parametrize(("text", "kind"), REVIEWED, ids=[f"{kind}-{i}" for i, (_, kind) in enumerate(REVIEWED)])
def test_the_checker_flags_each_sentence_the_review_quoted(text, kind):
    assert kind in {flag.kind for flag in check_prose(text)}, check_prose(text)


@pytest.mark.parametrize(
    "text",
    [
        "- Capacity for Hub Poznan, Prague: 35 (flow, timber, Hub Poznan, Prague) = 35, 45 below the cap of 80 × 1 "
        "(build, Hub Poznan, Prague) = 80.",
        "- Machine for hour 0: 1 (RNA batch, hour 0) = 1, equal to its limit 1, so the row binds.",
        "Number of disks used: 1 (disk 1) + 1 (disk 2) + 1 (disk 3) = 3.",
        "At least 19 officers are needed for 00:00-04:00: 19 (00:00-04:00 shift) = 19.",
        "Total cost: 4 × 25.5 (Leeds) + 3 × 30.25 (York) ≈ 192.75.",
        "An animal shelter plans a daily ration. The shelter houses about 60 animals.",
        "A hospital dietitian plans a daily menu. The kitchen serves 200 patients a day.",
        "- $v_{wt}$: rating (table below)\n\n$v_{wt}$:\n\n| w \\ t | a | b |\n| --- | --- | --- |\n| x | 1 | 2 |",
        "The upper bound on the units to make on regular time in February: at most 300.",
        "The problem is infeasible. All 3 clinics together can handle 3,690 patient visits, less than the total "
        "demand of 5,020.",
        "**Sets**\n\n- candidate clinics = {Kingsgate, Riverside}\n- districts = {North, South}\n\nEach district "
        "has patients.",
        "- Share for parks: 0.75 × 12 (parks) = 9, 9 above the minimum of 0.25 × 0 (bike lanes) = 0.",
    ],
)
def test_the_fixed_wordings_pass_the_checker(text):
    assert check_prose(text) == []


def _toy_design() -> tuple:
    """A built link (flow <= 80 build) and a makespan row (load - makespan <= 0), as the families
    write them: terms of the right-hand side moved to the left."""
    builder = ModelBuilder("toy")
    flow = builder.var("flow__poznan__prague")
    build = builder.var("build__poznan__prague", "binary")
    make = builder.var("makespan")
    job = builder.var("assign__menus__press", "binary")
    builder.row("capacity__poznan__prague", {flow: 1.0, build: -80.0}, "<=", 0.0)
    builder.row("load__press", {job: 45.0, make: -1.0}, "<=", 0.0)
    builder.row("demand__prague", {flow: 1.0}, ">=", 35.0)
    builder.minimize({flow: 2.0, build: 500.0, make: 1.0})
    math = MathModel(
        "Toy",
        "minimize",
        "c",
        "total cost",
        (
            SetDef("N", "n", "nodes", ("Poznan", "Prague", "Brno")),
            SetDef("J", "j", "jobs", ("menus",)),
            SetDef("M", "m", "presses", ("press",)),
        ),
        (),
        (
            VarDef("f", "flow", r"\ge 0", "flow", ("N", "N"), noun="tons to send on each link"),
            VarDef("y", "build", r"\in \{0,1\}", "build", ("N", "N"), indicator="whether each link is built"),
            VarDef("C", "makespan", r"\ge 0", "makespan", (), noun="finishing time of the last press (minutes)"),
            VarDef(
                "z", "assign", r"\in \{0,1\}", "assign", ("J", "M"), indicator="whether each job runs on each press"
            ),
        ),
        (
            ConstraintDef("Capacity", "within capacity", "x", "capacity", ("N", "N")),
            ConstraintDef("Load", "a press's load is within the makespan", "x", "load", ("M",)),
            ConstraintDef("Demand", "each node receives its demand", "x", "demand", ("N",)),
        ),
    )
    return builder.build(), math


def test_rows_put_moved_terms_back_on_the_limit_side():
    model, math = _toy_design()
    values = {"flow__poznan__prague": 35.0, "build__poznan__prague": 1.0, "makespan": 45.0, "assign__menus__press": 1.0}
    rows = {row.name: row for row in model.rows}
    capacity = row_line(rows["capacity__poznan__prague"], math, values, random.Random(0))
    assert "45 below the cap of 80 × 1 (build, Poznan, Prague) = 80" in capacity and "cap of 0" not in capacity, (
        capacity
    )
    load = row_line(rows["load__press"], math, values, random.Random(0))
    assert load.startswith("Load for press: 45 × 1 (assign, menus, press) = 45") and "45 (makespan)" in load, load
    for text in (capacity, load):
        assert check_prose(text) == [], text


def test_a_limit_made_of_decisions_at_zero_is_written_out():
    """A share row (0.75 parks - 0.25 lanes >= 0) with no lanes in the plan: the limit is the lanes'
    term at 0, not a bare "minimum of 0"."""
    builder = ModelBuilder("toy")
    parks, lanes = builder.var("fund__parks"), builder.var("fund__lanes")
    builder.row("share__parks", {parks: 0.75, lanes: -0.25}, ">=", 0.0)
    builder.maximize({parks: 1.0, lanes: 1.0})
    math = MathModel("Toy", "maximize", "v", "value", (SetDef("O", "o", "options", ("parks", "lanes")),), (), (), ())
    [row] = builder.build().rows
    line = row_line(row, math, {"fund__parks": 12.0, "fund__lanes": 0.0}, random.Random(0))
    assert "9 above the minimum of 0.25 × 0 (lanes) = 0" in line and check_prose(line) == [], line


def test_exact_sums_say_equals_and_long_objectives_are_written_out_by_kind():
    builder = ModelBuilder("toy")
    made = [builder.var(f"regular__m{k}") for k in range(6)]
    held = [builder.var(f"stock__m{k}") for k in range(4)]
    builder.minimize({**{name: 245.0 for name in made}, **{name: 10.0 for name in held}})
    model = builder.build()
    math = MathModel(
        "Toy",
        "minimize",
        "c",
        "total cost",
        (SetDef("T", "t", "months", tuple(f"m{k}" for k in range(6))),),
        (),
        (),
        (),
    )
    values = {**{name: 70.0 for name in made}, **{name: 30.0 for name in held}}
    line = objective_line(model, math, values, model.objective_value(values))
    assert "102,900 (regular) + 1,200 (stock) = 104,100" in line and "≈" not in line, line
    assert "- regular: 245 × 70 (m0)" in line and "- stock: 10 × 30 (m0)" in line and "nonzero" not in line, line
    assert check_prose(line) == [], check_prose(line)


def test_numbered_elements_are_named_with_their_noun_in_every_family_that_has_them():
    checked = set()
    for family in ("bin_packing", "time_indexed_scheduling", "piecewise_costs"):
        for seed in range(12):
            math = FAMILIES[family].math_model(generated(family, seed).data)
            numbered = [str(e) for s in math.sets if s.member for e in s.elements if str(e).isdigit()]
            if numbered:
                names = spoken_names(math)
                assert all(
                    names[element] == f"{s.member} {element}" for s in math.sets if s.member for element in s.elements
                )
                checked.add(family)
                break
    assert checked == {"bin_packing", "time_indexed_scheduling", "piecewise_costs"}


def test_general_descriptions_are_made_specific_or_left_out():
    data = generated("blending", 4).data
    math = FAMILIES["blending"].math_model(data)
    model = FAMILIES["blending"].linear_model(data)
    name = model.variables[0].name
    ingredient = spoken_names(math)[name.split("__")[1]]
    noun = next(v.noun for v in math.variables if v.lp_family == name.split("__")[0])
    assert "each ingredient" in noun
    assert instance_phrase(noun, name, math) == noun.replace("each ingredient", ingredient)
    assert variable_phrase(name, math) == f"the variable for {ingredient}"
    assert instance_phrase("units to ship on each route", "ship__a", math) is None  # "route" matches no set
    data = generated("piecewise_costs", 4).data  # a multi-word noun whose last word names the set
    math = FAMILIES["piecewise_costs"].math_model(data)
    name = next(v.name for v in FAMILIES["piecewise_costs"].linear_model(data).variables if v.name.endswith("__2"))
    source = singular_noun(math.sets[0].description.split(" (")[0].split()[-1])
    element = spoken_names(math)[name.split("__")[1]]
    phrase = f"units bought from each {source} in each price tier"
    assert instance_phrase(phrase, name, math) == f"units bought from {element} in tier 2"
    assert instance_phrase("units bought in each price tier", name, math) is None  # the source key is left over


def test_filler_that_names_another_setting_is_not_used():
    assert setting_clash("The shelter houses about 60 animals.", "A pet-food company plans a ration.")
    assert not setting_clash("The shelter houses about 60 animals.", "An animal shelter plans a ration.")
    kept = []
    for seed in range(40):
        statement = Statement(random.Random(seed))
        statement.add("A pet-food company plans a daily ration for one animal.")
        statement.add("Costs are per portion.")
        statement.distract(["The shelter houses about 60 animals.", "Food is stored in a cool room."], 2, 2)
        kept.append(statement.text())
        assert "shelter" not in statement.text()
    assert any("cool room" in text for text in kept)
    charity = Statement(random.Random(1))
    charity.add("Open Table Network supplies 4 shelters with food parcels.")
    charity.distract(["The charity has 3 part-time staff.", "The firm is considering a second office."], 2, 2)
    assert "firm" not in charity.text()


def test_a_deadline_defined_for_some_jobs_is_listed_not_promised_as_a_table():
    math = MathModel(
        "Toy",
        "minimize",
        "c",
        "cost",
        (SetDef("J", "j", "jobs", ("bracket", "flange", "shaft")),),
        (ParamDef("D_j", "deadline of job $j$ (where it has one)", {"bracket": 15, "flange": 10}),),
        (),
        (),
    )
    text = math.to_markdown()
    assert "(table below)" not in text and "bracket 15, flange 10" in text


_TIME_INDEXED = (
    "for s in range(horizon):\n"
    "    prob.addCons(quicksum(start[j, t] for (j, t) in start if t <= s < t + duration[j]) <= 1, name=f'm[{s}]')"
)


def test_a_flipped_sense_changes_the_rows_sense_not_a_condition_inside_it():
    line = _TIME_INDEXED.split("\n")[1]
    assert line[_sense_position(line, (" <= ", " >= ")) :].startswith(" <= 1")
    lines = ["# machine: at most one job runs in any slot", *_TIME_INDEXED.split("\n")]
    buggy, diagnosis = _flipped_inequality(lines, random.Random(0))
    assert "if t <= s < t" in buggy and ") >= 1, name" in buggy and "use `>=` where the model needs `<=`" in diagnosis
    once = [
        "# once: every job starts exactly once",
        "for j in jobs:",
        "    prob.addCons(quicksum(start[k, t] for (k, t) in start if k == j) == 1, name=f'once[{j}]')",
    ]
    buggy, _ = _loosened_equality(once, random.Random(0))
    assert "if k == j)" in buggy and ") == 1" not in buggy


def _assignment_bug() -> tuple:
    """4 consultants, 3 projects, at most 1 each; the `load` rows flipped to `>=` (sample #4)."""
    builder = ModelBuilder("assignment")
    people, projects = ("Avery", "Blake", "Devon", "Finley"), ("audit", "strategy", "merger")
    x = {(w, t): builder.var(f"assign__{w.lower()}__{t}", "binary") for w in people for t in projects}
    for t in projects:
        builder.row(f"cover__{t}", {x[w, t]: 1.0 for w in people}, "==", 1.0)
    for w in people:
        builder.row(f"load__{w.lower()}", {x[w, t]: 1.0 for t in projects}, "<=", 1.0)
    builder.maximize({var: 1.0 for var in x.values()})
    math = MathModel(
        "Assignment",
        "maximize",
        "v",
        "total rating",
        (SetDef("W", "w", "consultants", people), SetDef("T", "t", "projects", projects)),
        (),
        (
            VarDef(
                "x",
                "assign",
                r"\in \{0,1\}",
                "assign",
                ("W", "T"),
                indicator="whether each consultant takes each project",
            ),
        ),
        (
            ConstraintDef("Cover", "each project is assigned exactly once", "x", "cover", ("T",)),
            ConstraintDef("Load", "each consultant takes at most 1 project", "x", "load", ("W",)),
        ),
    )
    fixed = "\n".join(
        [
            "# load: a consultant takes at most 1 project",
            "for w in people:",
            "    mdl.addCons(quicksum(x[w, t] for t in projects) <= 1, name=f'load[{w}]')",
            "",
        ]
    )
    buggy = fixed.replace(") <= 1", ") >= 1")
    bug = Bug("flipped_inequality", "", buggy, fixed, "it reports `Optimal objective value: infeasible`")
    return builder.build(), math, bug


def test_a_repair_says_why_the_bug_gives_its_symptom_from_the_buggy_model():
    model, math, bug = _assignment_bug()
    buggy = buggy_model(bug, model)
    assert {row.sense for row in buggy.rows if row.name.startswith("load")} == {">="}
    assert solve_model(buggy).status == "infeasible"
    reason = symptom_reason(bug, model, math, random.Random(0))
    # the clash: 4 consultants must each take at least 1 of 3 projects, each assigned exactly once
    assert reason.count("Load for") == 4 and reason.count("Cover for") == 3, reason
    assert "at most 1 project" not in reason  # the flipped rows' description no longer holds: left out
    assert check_prose(reason) == [], check_prose(reason)
    cover = "\n".join(
        [
            "# cover: every project is assigned exactly once",
            "for t in projects:",
            "    mdl.addCons(quicksum(x[w, t] for w in people) == 1, name=f'cover[{t}]')",
            "",
        ]
    )
    costly = ModelBuilder("costly")  # minimizing: without the cover rows nobody is assigned
    for variable in model.variables:
        costly.var(variable.name, "binary")
    for row in model.rows:
        costly.row(row.name, dict(row.terms), row.sense, row.rhs)
    costly.minimize({variable.name: 1.0 for variable in model.variables})
    missing = Bug("missing_constraint", "", "\n", cover, "it reports `Optimal objective value: 0`")
    reason = symptom_reason(missing, costly.build(), math, random.Random(0))
    assert (
        "breaks 3 rows" in reason
        and "Cover for audit: 0 in the buggy plan, where the model requires exactly 1" in reason
    )


def test_a_what_if_that_cuts_off_the_old_plan_says_so_and_moves_are_priced():
    model, math = _toy_design()
    before = {"flow__poznan__prague": 35.0, "build__poznan__prague": 1.0, "makespan": 45.0, "assign__menus__press": 1.0}
    after = {**before, "flow__poznan__prague": 40.0}
    text = moved_decisions(model, before, after, math, model.objective)
    assert "account for the whole change: 2 × 5 (Poznan, Prague) = 10" in text, text
    assert "Priced" not in moved_decisions(model, before, after, math, tuple((n, 1.0) for n, _ in model.objective))


def test_limits_analysis_counts_the_rows_it_leaves_out():
    """A row of an option the plan does not use (every term 0) is not counted as binding, and the
    count says so (the review's "2 of 7 rows" against 8 rows in the model)."""
    builder = ModelBuilder("toy")
    flows = [builder.var(f"flow__poznan__{n}") for n in ("prague", "brno")]
    builds = [builder.var(f"build__poznan__{n}", "binary") for n in ("prague", "brno")]
    for flow, build, n in zip(flows, builds, ("prague", "brno"), strict=True):
        builder.row(f"capacity__poznan__{n}", {flow: 1.0, build: -80.0}, "<=", 0.0)
    builder.minimize({name: 1.0 for name in [*flows, *builds]})
    model = builder.build()
    _, math = _toy_design()
    values = {
        "flow__poznan__prague": 80.0,
        "build__poznan__prague": 1.0,
        "flow__poznan__brno": 0.0,
        "build__poznan__brno": 0.0,
    }
    text = limits_analysis(model, math, values, random.Random(0))
    assert "1 row of options the plan does not use" in text, text
