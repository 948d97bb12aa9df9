"""Prose of the OR data: agreement, the prose checker, typed phrases in every family, code styles,
the IIS explanation and the diversity measures (all fast: no sandbox, small solves only)."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from trex.workloads.or_data.code_style import IMPORTS, MODEL_NAMES, REPORTS, CodeStyle, restyle
from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.diversity import code_style_key, overlap, overlap_at, skeleton
from trex.workloads.or_data.explain import iis_explanation
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.iis import deletion_filter
from trex.workloads.or_data.linear_model import ModelBuilder
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, SetDef, VarDef
from trex.workloads.or_data.pipeline import plan
from trex.workloads.or_data.prose import agree, count, is_plural, verb
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.seeds import stream
from trex.workloads.or_data.tasks import understanding


def test_agreement_helpers():
    assert is_plural("eggs") and is_plural("sourdough loaves") and not is_plural("corn") and not is_plural("solvent A")
    assert verb("eggs", "costs") == "cost" and verb("glass", "costs") == "costs" and verb("search ads", "is") == "are"
    assert count(1, "dollar") == "1 dollar" and count(2.5, "dollar") == "2.5 dollars"
    fixed = agree("Government bonds yields 5%. A analyzer and a ambulance. Plant 1 needs 1 engineers. they has time.")
    assert fixed == "Government bonds yield 5%. An analyzer and an ambulance. Plant 1 needs 1 engineer. they have time."


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("The decisions are the 1 if project i is chosen.", "raw_fill"),
        ("Make 3 devices of product p per week.", "index_leak"),
        ("Eggs costs 2 dollars per dozen.", "agreement"),
        ("The budget is 1 dollars.", "agreement"),
        ("It needs a analyzer.", "agreement"),
        ("Background:\n\nCase:\n\nA zoo feeds its animals.", "duplicated_opener"),
        ("The city zoo plans its rations.\n\nThe company was founded in 1990.", "contradicting_filler"),
        ("Use 0.6599999999999999 tons.", "float_artefact"),
        ("subject to these rules: . All variables are continuous.", "raw_fill"),
    ],
)
def test_prose_checker_flags_each_kind(text, kind):
    assert kind in {flag.kind for flag in check_prose(text)}


def test_prose_checker_passes_clean_text_and_ignores_math_and_code():
    text = (
        "## Understanding\n\nThe decisions are whether each driver takes each route. Machine A and machine B run in parallel.\n\n"
        "$$ \\sum_{i \\in I} x_i \\le b $$ with $x_i$ per item.\n\n```python\nfor i in items:\n    x[i] = 1\n```\n\n"
        "Use 12 kg of flour (see item (b)); an hour of work costs 1 dollar."
    )
    assert check_prose(text) == []


def test_every_family_has_typed_phrases_and_clean_understanding():
    config = SynthConfig(seed=5, families=tuple(FAMILIES))
    for index in range(3 * len(FAMILIES)):
        planned = plan(config, index)
        family = FAMILIES[planned.family]
        generated = family.generate(stream(5, index, "data"), planned.status)
        math = family.math_model(generated.data)
        for variable in math.variables:
            assert variable.noun or variable.indicator, (family.name, variable.symbol)
        for constraint in math.constraints:
            assert constraint.why, (family.name, constraint.label)
        for text in (
            understanding(math, stream(5, index, "x")),
            family.statement(generated.data, stream(5, index, "text")),
            math.to_markdown(),
        ):
            assert check_prose(text) == [], (family.name, check_prose(text))


def test_understanding_explains_instead_of_pasting():
    math = MathModel(
        "Toy",
        "maximize",
        "x",
        "total profit",
        (SetDef("P", "p", "products", ("a", "b")),),
        (),
        (
            VarDef(
                "x_p",
                "1 if product $p$ is made",
                r"\in \{0, 1\}",
                "make",
                ("P",),
                indicator="whether to make each product",
            ),
        ),
        (
            ConstraintDef(
                "Budget",
                "spend within budget",
                "x",
                "budget",
                (),
                why="there is only a fixed amount of money",
                technique="It is a knapsack row.",
            ),
        ),
    )
    text = understanding(math)
    assert (
        "whether to make each product" in text
        and "there is only a fixed amount of money" in text
        and "knapsack row" in text
    )
    assert "1 if" not in text and "binary" in text and "mixed-integer" in text


def test_every_code_style_prints_the_same():
    family = FAMILIES["production_planning"]
    program = family.program(family.generate(stream(1, 2, "data"), "optimal").data)
    outputs = set()
    covering = [(IMPORTS[k % 2], MODEL_NAMES[k % 4], REPORTS[k % 3]) for k in range(4)] + [("from", "model", "dict")]
    for style in covering:
        styled = restyle(program, CodeStyle(*style))
        assert code_style_key(styled) == "/".join(style)
        outputs.add(subprocess.run([sys.executable, "-c", styled], capture_output=True, text=True, timeout=300).stdout)
    assert len(outputs) == 1 and "Optimal objective value" in outputs.pop()


def test_deletion_filter_finds_the_clashing_pair_and_words_it():
    builder = ModelBuilder("toy")
    x = builder.var("make__chairs", "integer", 5.0, None)
    y = builder.var("make__tables")
    builder.row("capacity__wood", {x: 2.0, y: 1.0}, "<=", 8.0)  # with x >= 5 this needs 10 <= 8
    builder.row("capacity__paint", {y: 1.0}, "<=", 100.0)
    builder.row("mix", {x: 1.0, y: -1.0}, ">=", -50.0)
    builder.minimize({x: 1.0})
    model = builder.build()
    found = deletion_filter(model)
    assert found is not None and found.irreducible
    assert {(element.kind, element.name) for element in found.elements} == {
        ("row", "capacity__wood"),
        ("lower", "make__chairs"),
    }
    math = MathModel(
        "Toy",
        "minimize",
        "x",
        "cost",
        (SetDef("P", "p", "products", ("chairs", "tables")), SetDef("R", "r", "resources", ("wood", "paint"))),
        (),
        (VarDef("x_p", "made", r"\ge m_p", "make", ("P",), noun="units of each product to make"),),
        (ConstraintDef("Capacity", "within stock", "x", "capacity", ("R",), why="stock is limited"),),
    )
    text = iis_explanation(model, math)
    assert (
        "Capacity for wood (within stock): at most 8" in text
        # the general phrase made specific, not pasted next to the element ("units of each product
        # to make for chairs" is the seam the Fourth review found)
        and "lower bound on the units of chairs to make: at least 5" in text
    ), text


def test_diversity_measures():
    assert overlap(["the same words in the same order here", "the same words in the same order here"]) == 1.0
    assert overlap(["alpha beta gamma delta epsilon zeta", "one two three four five six"]) == 0.0
    assert skeleton("Acme makes 12 chairs. Other facts. How many should Acme make?") == skeleton(
        "Zenith makes 7 chairs. More. How many should Zenith make?"
    )


def test_the_overlap_is_split_by_the_part_of_the_answer_it_comes_from():
    from trex.workloads.or_data.diversity import answer_parts, overlap_by_part

    def answer(story: str) -> str:
        return (
            f"## Understanding\n\n{story}\n\n$$ \\max \\; \\sum_i v_i x_i $$\n\n"
            "```python\nmodel.addCons(quicksum(size[d, i] * select[i] for i in items) <= limits[d])\n```\n\n"
            "```lp\nMaximize\n obj: 3 x + 2 y\nEnd\n```\n"
        )

    first = answer("Every bakery ships warm bread to nearby cafes before dawn each day.")
    second = answer("Quiet rivers carry timber downstream toward distant sawmills in spring.")
    parts = answer_parts(first)
    assert "quicksum" in parts["code"] and "Maximize" in parts["lp"] and "\\max" in parts["math"]
    assert "bakery" in parts["prose"] and "quicksum" not in parts["prose"] and "\\max" not in parts["prose"]
    split = overlap_by_part([first, second])
    assert split["prose"]["shared"] == 0.0, "the two stories share no 5-gram"
    assert split["code"]["shared"] == split["lp"]["shared"] == 1.0
    assert abs(sum(value["grams"] for value in split.values()) - 1.0) < 1e-3


def test_merger_caps_how_often_a_prompt_skeleton_is_used():
    from trex.workloads.or_data.merge import Merger

    def result(index: int, opening: str) -> dict:
        prompt = f"{opening} plant {index} makes {index * 7 + 3} chairs of kind q{index}x. Many words differ here: w{index}a w{index}b w{index}c. Solve it now."
        record = {
            "meta": {"id": f"s{index}", "family": "production_planning"},
            "messages": [{"content": ""}, {"content": prompt}, {"content": f"answer {index} " * 3}],
        }
        return {"result": "emitted", "stage": None, "sft": record, "cpt": {"text": f"document {index} " + "x" * index}}

    merger = Merger(n=20, benchmarks=None, near_threshold=0.99)
    merger.feed([result(index, "Acme") for index in range(6)])
    assert (
        len(merger.sft) == 3 and merger.removed["skeleton_cap"] == 3
    )  # the same frame at most 3 times among few samples


def test_agreement_leaves_a_capital_a_inside_a_name_alone():
    assert (
        agree("Terminal B, Terminal A and Pump Station 1 only pass oil on.")
        == "Terminal B, Terminal A and Pump Station 1 only pass oil on."
    )
    assert agree("A analyzer runs. (A apple)") == "An analyzer runs. (An apple)"


def test_family_reasons_have_several_wordings_and_every_one_reads_cleanly():
    from trex.workloads.or_data.wording import choose

    assert choose(r"[a|b] keeps $x \in [0, 1]$ and x[i]", random.Random(0)) in (
        r"a keeps $x \in [0, 1]$ and x[i]",
        r"b keeps $x \in [0, 1]$ and x[i]",
    )
    varied = 0
    for name, family in FAMILIES.items():
        math = family.math_model(family.generate(random.Random(5), "optimal").data)
        texts = {understanding(math, random.Random(seed)) for seed in range(6)}
        reasons = {choose(c.why + c.technique, random.Random(seed)) for c in math.constraints for seed in range(6)}
        varied += len(reasons) > len(math.constraints)
        for text in texts:
            assert "|" not in re.sub(r"\$[^$]*\$", "", text), (name, text)
            assert not check_prose(text), (name, check_prose(text))
    assert varied >= 15  # nearly every family words its knowledge in more than one way


def test_overlap_at_a_fixed_family_size_compares_runs_of_different_sizes():
    shared = "the plan ships every pallet from the plant to the store on time"
    texts = [f"{shared} {word} alpha beta gamma delta" for word in ("red", "blue", "green", "black", "white")]
    # with more texts a 5-gram is more likely to occur in another one: the measure rises with k
    assert overlap_at(texts, 2) <= overlap_at(texts, 5) == overlap(texts)
    assert overlap_at(texts, 6) is None


def test_planned_status_shares_hold_for_every_seed():
    """The issue asks for infeasible/unbounded shares within 1 point of the configuration on 1,000
    samples; the plan's per-family golden-ratio draws keep every seed within half a point."""
    for seed in range(6):
        config = SynthConfig(seed=seed, families=tuple(FAMILIES))
        statuses = [plan(config, index).status for index in range(1000)]
        assert abs(statuses.count("unbounded") / 1000 - config.unbounded_share) <= 0.005, seed
        assert abs(statuses.count("infeasible") / 1000 - config.infeasible_share) <= 0.005, seed
