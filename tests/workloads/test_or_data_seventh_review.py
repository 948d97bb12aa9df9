"""The wrong explanations of the Seventh review (bench/or_data/REVIEW.md, seed 2421), each fixed at its
source: every test here fails on the code that review read and passes on the fix."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from types import SimpleNamespace

from test_or_data_review_defects import _toy_design
from test_or_data_support import generated

from trex.workloads.or_data.bugs import Bug
from trex.workloads.or_data.explain import limits_analysis
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.linear_model import ModelBuilder
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.repair_reason import _buggy_objective
from trex.workloads.or_data.row_shapes import switched_off
from trex.workloads.or_data.solve import solve_model
from trex.workloads.or_data.tasks import _as_old_options, _options_reason, same_options, understanding
from trex.workloads.or_data.worked import pricing_out, worked_check


def _production():
    """An integer program whose row nearest to binding (sewing, 1 to spare) has its largest
    coefficient on a quantity made 0 (trousers): an ordinary capacity row, not a big-M row."""
    builder = ModelBuilder("production")
    trousers, shirts = builder.var("make__trousers", "integer"), builder.var("make__shirts", "integer")
    builder.row("cutting", {trousers: 1.0, shirts: 1.0}, "<=", 81.0)
    builder.row("sewing", {trousers: 2.75, shirts: 1.5}, "<=", 46.0)
    builder.maximize({trousers: 3.0, shirts: 2.0})
    return builder.build(), {"make__trousers": 0.0, "make__shirts": 30.0}


def _makespan():
    """Two machines; q sets the makespan (4 + 6 = 10) while its largest coefficient (job z, 9) sits on
    an assignment at 0: the binding row that a largest-coefficient rule used to skip (seed 2401 #38)."""
    builder = ModelBuilder("makespan")
    assign = {(j, m): builder.var(f"assign__{j}__{m}", "binary") for j in "xyz" for m in "pq"}
    makespan = builder.var("makespan", upper=100.0)
    for job in "xyz":
        builder.row(f"once__{job}", {assign[job, m]: 1.0 for m in "pq"}, "==", 1.0)
    time = {"x": 4.0, "y": 6.0, "z": 9.0}
    for machine in "pq":
        builder.row(f"load__{machine}", {**{assign[j, machine]: time[j] for j in "xyz"}, makespan: -1.0}, "<=", 0.0)
    builder.minimize({makespan: 1.0})
    model = builder.build()
    values = {variable.name: 0.0 for variable in model.variables}
    values.update({"assign__x__q": 1.0, "assign__y__q": 1.0, "assign__z__p": 1.0, "makespan": 10.0})
    return model, values


def test_an_ordinary_row_on_a_decision_at_zero_is_not_a_switched_off_big_m_row():
    _, math = _toy_design()
    model, values = _production()
    assert not switched_off(model.rows[1], model, values)
    for seed in range(4):
        text = worked_check(model, math, values, model.objective_value(values), random.Random(seed))
        assert "- Sewing: 1.5 × 30 (shirts) = 45, 1 below the cap of 46." in text, text
    # the machine that sets the makespan: its row binds and is written out as binding
    model, values = _makespan()
    text = worked_check(model, math, values, 10.0, random.Random(0))
    assert re.search(r"Load for q: 4 × 1 \(.*\) \+ 6 × 1 \(.*\) = 10, .*bind", text), text
    assert "Load for p: 9 × 1" in text and "1 below the cap of 10" in text, text
    assert not [flag for flag in check_prose(text) if flag.kind == "check_rows"], check_prose(text)


def test_an_mtz_row_of_an_unused_arc_is_switched_off_and_not_counted_as_binding():
    """#48: a load row of an unused arc at its limit only through the big-M is neither counted as a
    binding row nor named as the loosest one; it is said to be left out."""
    _, math = _toy_design()
    builder = ModelBuilder("mtz")
    load_a, load_b = builder.var("load__a", lower=3.0, upper=23.0), builder.var("load__b", lower=10.0, upper=23.0)
    load_c = builder.var("load__c", lower=5.0, upper=23.0)
    ab, ba = builder.var("arc__a__b", "binary"), builder.var("arc__b__a", "binary")
    bc = builder.var("arc__b__c", "binary")
    builder.row("mtz__a__b", {load_b: 1.0, load_a: -1.0, ab: -23.0}, ">=", -13.0)  # unused: 10 − 23 = −13, binds
    builder.row("mtz__b__a", {load_a: 1.0, load_b: -1.0, ba: -23.0}, ">=", -20.0)  # unused: 13 to spare
    builder.row("mtz__b__c", {load_c: 1.0, load_b: -1.0, bc: -23.0}, ">=", -18.0)  # used: 15 − 10 >= 5, binds
    builder.row("fleet", {ab: 1.0, ba: 1.0, bc: 1.0}, "<=", 1.0)
    builder.minimize({ab: 5.0, ba: 5.0, load_a: 1.0, load_b: 1.0})
    model = builder.build()
    values = {"load__a": 23.0, "load__b": 10.0, "load__c": 15.0, "arc__a__b": 0.0, "arc__b__a": 0.0, "arc__b__c": 1.0}
    assert all(switched_off(row, model, values) for row in model.rows[:2])
    assert not switched_off(model.rows[2], model, values)
    text = limits_analysis(model, math, values, random.Random(0))
    assert "rows binding" not in text and "to spare" not in text, text
    assert "not counting 2 big-M rows of options the plan does not use" in text, text


def _degenerate_flow():
    """Demand 10 at a sink, met directly at 8 a unit or via a route whose two legs cost 4 + 5; the
    via leg's capacity row `via - feed <= 0` binds at 0 = 0, so the plan is degenerate and its
    dual values are not unique: any price of that row in [-5, -4] is optimal. A dead-end arc (its
    node has no way out) can carry nothing at any cost."""
    builder = ModelBuilder("flow")
    direct, via, feed, dead = (builder.var(f"flow__{name}") for name in ("direct", "via", "feed", "dead"))
    builder.row("demand", {direct: 1.0, via: 1.0}, ">=", 10.0)
    builder.row("cap", {via: 1.0, feed: -1.0}, "<=", 0.0)
    builder.row("dead", {dead: 1.0}, "==", 0.0)
    builder.minimize({direct: 8.0, via: 4.0, feed: 5.0, dead: 3.0})
    return builder.build()


def test_reduced_costs_of_degenerate_duals_are_checked_by_re_solving():
    """#23: at duals (demand 8, cap −4.5) the via leg's reduced cost is 0.5, but each unit forced in
    costs 1 (4 + 5 − 8) and it enters only below 3; the dead-end arc enters at no price."""
    _, math = _toy_design()
    model = _degenerate_flow()
    solved = solve_model(model)
    assert solved.status == "optimal" and abs(solved.objective - 80.0) < 1e-9
    lines = pricing_out(model, math, solved.values, {"demand": 8.0, "cap": -4.5, "dead": 1.0})
    via = next(line for line in lines if "via" in line)
    assert "raise the total cost by 0.5" not in via and "fall below 3.5" not in via, via
    assert "each unit would raise the total cost by 1;" in via and "fall below 3 before" in via, via
    # the statement is the re-solve's: a cost just below 3 makes the route enter, just above does not
    for cost, enters in ((2.9, True), (3.1, False)):
        cheaper = replace(model, objective=tuple((n, cost if n == "flow__via" else c) for n, c in model.objective))
        assert (solve_model(cheaper).values["flow__via"] > 1e-6) == enters
    dead = next(line for line in lines if "dead" in line)
    assert "would raise" not in dead and "no price makes the option enter" in dead, dead
    # at the other end of the dual set (cap −4) the reduced costs are the real ones and read as before
    lines = pricing_out(model, math, solved.values, {"demand": 8.0, "cap": -4.0, "dead": -5.0})
    assert any(
        "each unit would raise the total cost by 1; its cost would have to fall below 4" in line for line in lines
    )


def _cutting(capacity: float):
    data = generated("bin_packing", 1).data  # cutting stock: four piece types, 1,000 cm bars
    assert data.scenario.structure == "cutting"
    data = replace(data, capacity=capacity)
    model = FAMILIES["bin_packing"].linear_model(data)
    math = FAMILIES["bin_packing"].math_model(data)
    solved = solve_model(model)
    return SimpleNamespace(model=model, math=math, values=solved.values, outcome=SimpleNamespace(text=lambda: ""))


def test_a_cutting_stock_what_if_compares_patterns_by_content_not_by_number():
    """#12: a longer bar re-enumerates the maximal patterns, so `cut__p5` names another pattern; the
    old plan's patterns all fit the longer bar (it breaks no limit), they are just not maximal any more."""
    base, changed = _cutting(1000.0), _cutting(1200.0)
    match = same_options(base.model, changed.model)
    old_columns = {
        v.name: sorted((r.name, c) for r in base.model.rows for n, c in r.terms if n == v.name)
        for v in base.model.variables
    }
    new_columns = {
        v.name: sorted((r.name, c) for r in changed.model.rows for n, c in r.terms if n == v.name)
        for v in changed.model.variables
    }
    assert all(old_columns[old] == new_columns[new] for old, new in match.items())
    renamed = [name for name in old_columns if name in new_columns and old_columns[name] != new_columns[name]]
    assert renamed, "the test needs a pattern number that names another pattern after the change"
    reason = _options_reason(base, changed)
    assert "breaks a limit of the new data" not in reason, reason
    added = len(changed.model.variables) - len(match)
    assert f"adds {added} new options" in reason, (reason, added)
    chosen = [name for name, value in base.values.items() if value > 1e-6]
    if any(name not in match for name in chosen):
        assert "no counterpart with the same coefficients among the new options" in reason, reason
    # the decision-by-decision comparison pairs the same pattern, never two patterns sharing a number
    after = _as_old_options(base, changed)
    assert set(after) == set(match) and all(after[old] == changed.values.get(new, 0.0) for old, new in match.items())


def _blend(cap_cheap: bool, quality: str):
    """min x + 5 y over x + y >= 10; `quality` is the sense of the row on y (intended `<=` 2)."""
    builder = ModelBuilder("blend")
    x, y = builder.var("make__x"), builder.var("make__y")
    builder.row("demand", {x: 1.0, y: 1.0}, ">=", 10.0)
    builder.row("quality", {y: 1.0}, quality, 2.0)
    if cap_cheap:
        builder.row("cap", {x: 1.0}, "<=", 6.0)
    builder.minimize({x: 1.0, y: 5.0})
    return builder.build()


def test_a_bug_that_tightens_the_model_is_not_said_to_weaken_its_rows():
    """#37: a flipped row that forces an expensive input in makes the buggy value worse than the
    intended optimum; the lead says the changed rows force it in, not that weakened rows leave it out."""
    _, math = _toy_design()
    intended = _blend(False, "<=")  # x = 10: 10
    buggy = _blend(False, ">=")  # y >= 2 forced in: 8 + 10 = 18
    solved = solve_model(buggy)
    bug = Bug("flipped_inequality", "", ">=", "<=", "it reports 18")
    text = _buggy_objective(bug, buggy, math, solved.values, solved.objective, intended)
    assert "weakened" not in text and "leave out" not in text, text
    assert "force in: they cut off the intended optimum 10, so the buggy value is higher" in text, text
    # a bug that drops a row: the buggy value beats the intended one only with a plan the intended rows forbid
    intended, buggy = _blend(True, ">="), _blend(False, ">=")  # 6 + 20 = 26 against 8 + 10 = 18
    solved = solve_model(buggy)
    bug = Bug("missing_constraint", "", "", "", "it reports 18")
    text = _buggy_objective(bug, buggy, math, solved.values, solved.objective, intended)
    assert "allow and the intended ones forbid (the intended optimum is 26)" in text, text


def test_an_lp_without_an_optimum_is_not_said_to_have_one_proven_by_duality():
    """#40: the LP sentence's duality clause is kept for an optimal LP only."""
    math = FAMILIES["resource_allocation"].math_model(generated("resource_allocation", 0).data)
    assert not any("mathbb{Z}" in v.domain or r"\{0, 1\}" in v.domain for v in math.variables)
    optimal = [understanding(math, random.Random(seed)) for seed in range(40)]
    assert any("by LP duality" in text for text in optimal)
    for status in ("unbounded", "infeasible"):
        texts = [understanding(math, random.Random(seed), status) for seed in range(40)]
        assert not any("duality" in text for text in texts)
        # the rest of the text is the same words: only the clause goes
        assert [re.sub(r", and its optimum is \w+ by LP duality", "", text) for text in optimal] == texts


def test_an_active_disjunction_row_is_written_without_its_zero_big_m_term():
    """The binding rows are written again (they were computed and dropped since the Fifth session);
    an order row whose binary at 0 makes it the active disjunct is written without "+ 32.5 × 0 (...)",
    which reads as a switched-off row, and none of the rows shown is flagged."""
    data = generated("machine_scheduling", 1).data
    family = FAMILIES["machine_scheduling"]
    model, math = family.linear_model(data), family.math_model(data)
    solved = solve_model(model)
    text = worked_check(model, math, solved.values, solved.objective, random.Random(1))
    assert "so it binds" in text or "binding" in text, text
    assert not [flag for flag in check_prose(text) if flag.kind == "check_rows"], check_prose(text)
    # each order pair has one active row (binary at the value that keeps its big-M out) and one switched off
    for row in model.rows:
        if row.name.startswith(("i_first", "j_first")):
            order = solved.values[next(name for name, _ in row.terms if name.startswith("before"))]
            active = (order > 0.5) == row.name.startswith("i_first")
            assert switched_off(row, model, solved.values) != active, (row, order)
    # a used facility's capacity row (`flow - cap * open <= 0`, open at 1) is a resource's, not a switch's
    builder = ModelBuilder("facility")
    flow, other, open_ = builder.var("flow__a"), builder.var("flow__b"), builder.var("open__a", "binary")
    builder.row("capacity__a", {flow: 1.0, other: 1.0, open_: -80.0}, "<=", 0.0)
    builder.minimize({open_: 10.0, flow: 1.0, other: 1.0})
    facility = builder.build()
    assert not switched_off(facility.rows[0], facility, {"flow__a": 35.0, "flow__b": 5.0, "open__a": 1.0})


def test_a_repair_whose_buggy_plan_uses_decisions_is_built_not_rejected_with_an_error():
    """The lead's check after the merge (seed 0, index 342: network design, repair): `symptom_reason`
    handed the intended optimum (a float) to `_buggy_objective` where the intended model belongs, so
    every repair whose buggy program solved to a plan with nonzero decisions failed with
    AttributeError in the pipeline and was rejected as an error."""
    from trex.workloads.or_data.config import SynthConfig
    from trex.workloads.or_data.pipeline import ShardContext, synthesize_shard

    context = ShardContext(SynthConfig(seed=0, families=tuple(FAMILIES), isolation="process"))
    try:
        (result,) = synthesize_shard(range(342, 343), context)
    finally:
        context.close()
    assert (result["family"], result["variant"]) == ("network_design", "repair"), result
    assert result["stage"] != "error", result.get("detail")
