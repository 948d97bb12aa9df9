"""Answers that redo the optimum on the instance (`worked`), and programs that hold their data in
several real layouts (`data_layout`): every figure is checked against an independent computation,
every layout against the literal data it replaces."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest
from test_or_data_support import generated

from trex.workloads.or_data.code_style import CodeStyle, restyle
from trex.workloads.or_data.data_layout import LAYOUTS, relayout
from trex.workloads.or_data.diversity import code_style_key
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, Variable
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.solve import solve_model
from trex.workloads.or_data.worked import moved_decisions, pricing_out, row_label, worked_check, written_rows


def _toy_lp() -> LinearModel:
    """max 3a + 2b + 4c over two resources; c uses both heavily and is priced out."""
    builder = ModelBuilder("toy")
    a, b, c = (builder.var(f"make__{name}") for name in ("chairs", "tables", "desks"))
    builder.row("capacity__wood", {a: 1.0, b: 1.0, c: 3.0}, "<=", 4.0)
    builder.row("capacity__labour", {a: 1.0, b: 3.0, c: 2.0}, "<=", 6.0)
    builder.maximize({a: 3.0, b: 2.0, c: 4.0})
    return builder.build()


def test_reduced_costs_match_what_forcing_the_option_in_costs():
    """The reduced cost written for a rejected option equals the objective change per unit when the
    option is forced in by a small amount and the LP is re-solved (an independent computation)."""
    from trex.workloads.or_data.certificates import find_dual

    model = _toy_lp()
    solved = solve_model(model)
    assert solved.status == "optimal" and abs(solved.values["make__desks"]) < 1e-9
    certificate = find_dual(model, solved.objective)
    assert certificate is not None
    math = FAMILIES["production_planning"].math_model(generated("production_planning", 3).data)  # "Capacity" rows
    lines = pricing_out(model, math, solved.values, certificate.rows)
    # both options the plan leaves out, the most tempting (largest profit) first
    assert len(lines) == 2 and "desks" in lines[0] and "tables" in lines[1]
    step = 0.01
    for line, name in zip(lines, ("make__desks", "make__tables"), strict=True):
        stated = float(re.search(r"its reduced cost is .*? = (−?[\d.]+)", line).group(1).replace("−", "-"))
        forced = LinearModel(
            model.name,
            model.sense,
            model.objective,
            tuple(Variable(v.name, v.kind, step if v.name == name else v.lower, v.upper) for v in model.variables),
            model.rows,
        )
        moved = solve_model(forced)
        assert abs((moved.objective - solved.objective) / step - stated) <= 1e-3
        assert stated < 0 and "would lower" in line


def test_worked_check_is_empty_without_a_nonzero_decision():
    model = _toy_lp()
    zero = {variable.name: 0.0 for variable in model.variables}
    math = FAMILIES["production_planning"].math_model(generated("production_planning", 3).data)
    assert worked_check(model, math, zero, 0.0, random.Random(0)) == ""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_data_layout_keeps_every_name_the_model_reads(family):
    """The data block of each layout defines the same names with equal values and the same key
    order as the literal block (so the model adds its rows and variables in the same order)."""
    program = FAMILIES[family].program(generated(family, 5).data)
    block = re.search(r"^# Data\n(.*?)\n\n", program, re.S | re.M).group(1)
    original: dict = {}
    exec(block, {}, original)  # noqa: S102 - the family's own literal data
    for layout in LAYOUTS:
        laid_out = relayout(program, layout)
        new_block = re.search(r"^# Data\n(.*?)\n\n", laid_out, re.S | re.M).group(1)
        assert laid_out.replace(new_block, block) == program  # only the data block changes
        names: dict = {}
        exec(new_block, {}, names)  # noqa: S102
        for name, value in original.items():
            assert names[name] == value, (family, layout, name)
            if isinstance(value, dict):
                assert list(names[name]) == list(value), (family, layout, name)


def test_layouts_run_to_the_same_output_and_are_counted_as_styles():
    family = FAMILIES["transportation"]
    program = family.program(generated("transportation", 2).data)
    outputs = set()
    for layout in LAYOUTS:
        styled = restyle(program, CodeStyle("from", "model", "helper", "pyscipopt", layout))
        if layout != "literal":
            assert styled != program and code_style_key(styled) == f"from/model/helper/{layout}"
        outputs.add(subprocess.run([sys.executable, "-c", styled], capture_output=True, text=True, timeout=300).stdout)
    assert len(outputs) == 1 and "Optimal objective value" in outputs.pop()
    with pytest.raises(ValueError, match="unknown data layout"):
        relayout(program, "columns")


@pytest.mark.parametrize("family", ["production_planning", "facility_location", "machine_scheduling"])
def test_written_rows_are_the_instances_own_rows_in_the_models_symbols(family):
    data = generated(family, 4).data
    model, math = FAMILIES[family].linear_model(data), FAMILIES[family].math_model(data)
    text = written_rows(model, math)
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert lines and len(lines) <= 4
    symbols = {re.match(r"\\?[A-Za-z]+", variable.symbol).group(0) for variable in math.variables}
    for line in lines:
        label, formula = line[2:].split(": $", 1)
        row = next(row for row in model.rows if row_label(row, math) == label)
        # one term per model term, in the model's symbols, and the row's own right-hand side
        assert formula.count(r"\text{") + formula.count("_{") >= len(row.terms) or len(row.terms) == 1
        assert set(re.findall(r"(\\?[A-Za-z]+)_\{", formula)) <= symbols
        assert abs(float(formula.rstrip("$").split()[-1]) - row.rhs) < 1e-6
        for _, coef in row.terms:
            if abs(abs(coef) - 1) > 1e-9:
                assert f"{abs(coef):g}" in formula


def test_moved_decisions_lists_each_change_with_its_difference():
    model = _toy_lp()
    math = FAMILIES["production_planning"].math_model(generated("production_planning", 3).data)
    before = {"make__chairs": 4.0, "make__tables": 0.0, "make__desks": 0.0}
    after = {"make__chairs": 3.0, "make__tables": 0.5, "make__desks": 0.0}
    text = moved_decisions(model, before, after, math)
    # a colon after each decision: "truck 1 1 → 0" ran the element's number into the value (Seventh review #32)
    assert text == "Decision by decision, 2 decisions move: chairs: 4 → 3 (−1); tables: 0 → 0.5 (+0.5)."
    assert moved_decisions(model, before, dict(before), math) == ""
    assert not check_prose(text)
