"""Blending and diet problems: mix ingredients at least cost so the mix meets nutrient or
quality requirements. Two structures: a diet (amounts meet absolute minimums and maximums) and a
blend (a batch of fixed size whose quality shares lie within bounds)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, draw, nice, scale
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, lp_name
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import (
    Currency,
    Statement,
    amount,
    capitalize,
    currency,
    decapitalize,
    generic_distractors,
    join,
    number,
    pick,
    table,
)
from trex.workloads.or_data.program import assemble
from trex.workloads.or_data.prose import verb


@dataclass(frozen=True)
class Quality:
    name: str
    unit: str  # "g" per serving, "%" of the ingredient, "points"
    step: float  # contents are multiples of this


@dataclass(frozen=True)
class Ingredient:
    name: str
    cost: tuple[float, float]  # per unit of amount
    content: dict[str, tuple[float, float]]  # quality -> typical range


@dataclass(frozen=True)
class Scenario:
    structure: str  # "diet" | "blend"
    who: tuple[str, ...]
    context: str
    ingredients: tuple[Ingredient, ...]
    unit: tuple[str, str]  # unit of an ingredient amount
    integer: bool
    qualities: tuple[Quality, ...]
    cost_step: float
    batch_range: tuple[int, int]  # blend: batch size
    facts: tuple[str, ...]


def _i(name: str, cost: tuple[float, float], **content: tuple[float, float]) -> Ingredient:
    return Ingredient(name, cost, {key.replace("_", " "): value for key, value in content.items()})


# Contents are typical values (per serving, per portion, or percent by weight), varied within
# the ranges so instances differ.
SCENARIOS = (
    Scenario(
        "diet",
        ("A hospital dietitian", "A school cafeteria", "A sports nutritionist"),
        "a daily menu",
        (
            _i("oatmeal", (0.3, 0.6), protein=(5, 6), fiber=(3.5, 4.5), calories=(140, 160), calcium=(15, 25)),
            _i("chicken", (1.5, 2.8), protein=(25, 31), fiber=(0, 0), calories=(165, 190), calcium=(10, 15)),
            _i("eggs", (0.5, 0.9), protein=(12, 13), fiber=(0, 0), calories=(140, 155), calcium=(50, 56)),
            _i("milk", (0.3, 0.6), protein=(8, 8.5), fiber=(0, 0), calories=(100, 150), calcium=(280, 300)),
            _i("lentils", (0.4, 0.8), protein=(9, 18), fiber=(8, 15), calories=(115, 230), calcium=(20, 38)),
            _i("spinach", (0.6, 1.2), protein=(3, 5), fiber=(2, 4), calories=(20, 40), calcium=(100, 245)),
            _i("rice", (0.2, 0.4), protein=(4, 5), fiber=(0.5, 1), calories=(200, 210), calcium=(15, 20)),
            _i("yogurt", (0.7, 1.3), protein=(9, 17), fiber=(0, 0), calories=(100, 150), calcium=(190, 300)),
        ),
        ("serving", "servings"),
        False,
        (
            Quality("protein", "g", 0.5),
            Quality("fiber", "g", 0.5),
            Quality("calories", "kcal", 5),
            Quality("calcium", "mg", 5),
        ),
        0.05,
        (0, 0),
        (
            "The kitchen serves 200 patients a day.",
            "Menus are printed every Sunday.",
            "Fresh bread is delivered by a local baker.",
        ),
    ),
    Scenario(
        "diet",
        ("A pet-food company", "An animal shelter", "A zoo keeper"),
        "a daily ration for one animal",
        (
            _i("dry kibble", (0.4, 0.8), protein=(20, 26), fat=(10, 14), fiber=(3, 4)),
            _i("canned meat", (0.9, 1.6), protein=(8, 12), fat=(5, 8), fiber=(0.5, 1)),
            _i("fish", (1.2, 2.2), protein=(18, 22), fat=(4, 10), fiber=(0, 0)),
            _i("rice", (0.1, 0.3), protein=(2, 3), fat=(0.5, 1), fiber=(0.5, 1)),
            _i("pumpkin", (0.2, 0.5), protein=(1, 2), fat=(0, 0.5), fiber=(2, 4)),
            _i("carrots", (0.1, 0.3), protein=(0.5, 1), fat=(0, 0.5), fiber=(2, 3)),
        ),
        ("portion", "portions"),
        True,
        (Quality("protein", "g", 0.5), Quality("fat", "g", 0.5), Quality("fiber", "g", 0.5)),
        0.05,
        (0, 0),
        (
            "The shelter houses about 60 animals.",
            "Volunteers walk the dogs twice a day.",
            "Food is stored in a cool room.",
        ),
    ),
    Scenario(
        "blend",
        ("A feed mill", "An agricultural cooperative", "A livestock farm"),
        "a batch of cattle feed",
        (
            _i("corn", (0.18, 0.26), protein=(8, 9), fat=(3.5, 4), fiber=(2, 2.5)),
            _i("soybean meal", (0.38, 0.52), protein=(44, 48), fat=(1, 2), fiber=(3, 7)),
            _i("oats", (0.22, 0.3), protein=(11, 13), fat=(4, 6), fiber=(10, 12)),
            _i("barley", (0.2, 0.28), protein=(11, 12), fat=(2, 2.5), fiber=(5, 6)),
            _i("fish meal", (1.1, 1.6), protein=(60, 70), fat=(8, 12), fiber=(0.5, 1)),
            _i("wheat bran", (0.15, 0.22), protein=(15, 17), fat=(3.5, 4.5), fiber=(10, 12)),
        ),
        ("kg", "kg"),
        False,
        (Quality("protein", "%", 0.5), Quality("fat", "%", 0.5), Quality("fiber", "%", 0.5)),
        0.01,
        (500, 5000),
        ("The mill runs two shifts.", "Feed is delivered in 25 kg bags.", "The cooperative has 140 member farms."),
    ),
    Scenario(
        "blend",
        ("A refinery", "A fuel distributor", "A blending terminal"),
        "a batch of gasoline",
        (
            _i("straight-run naphtha", (55, 70), octane_rating=(60, 70), vapor_pressure=(6, 11)),
            _i("reformate", (85, 100), octane_rating=(95, 102), vapor_pressure=(3, 5)),
            _i("alkylate", (90, 110), octane_rating=(92, 97), vapor_pressure=(4, 6)),
            _i("butane", (40, 55), octane_rating=(91, 94), vapor_pressure=(50, 60)),
            _i("FCC gasoline", (75, 88), octane_rating=(90, 93), vapor_pressure=(5, 8)),
        ),
        ("barrel", "barrels"),
        False,
        (Quality("octane rating", "points", 0.5), Quality("vapor pressure", "psi", 0.5)),
        0.5,
        (2000, 12000),
        ("The terminal has eight storage tanks.", "Tanker trucks load around the clock.", "Prices are set weekly."),
    ),
    Scenario(
        "blend",
        ("A steel foundry", "A metal recycler", "An alloy producer"),
        "a melt of alloy",
        (
            _i("scrap iron", (250, 400), carbon=(0.1, 0.3), chromium=(0, 0.5), nickel=(0, 0.3)),
            _i("pig iron", (380, 520), carbon=(3.5, 4.5), chromium=(0, 0.2), nickel=(0, 0.1)),
            _i("ferrochrome", (1400, 2200), carbon=(4, 8), chromium=(50, 65), nickel=(0, 0.5)),
            _i("stainless scrap", (900, 1400), carbon=(0.05, 0.1), chromium=(17, 19), nickel=(8, 10)),
            _i("nickel pellets", (15000, 21000), carbon=(0, 0.05), chromium=(0, 0.1), nickel=(99, 99.8)),
        ),
        ("ton", "tons"),
        False,
        (Quality("carbon", "%", 0.05), Quality("chromium", "%", 0.5), Quality("nickel", "%", 0.5)),
        10,
        (20, 120),
        ("The furnace was relined last year.", "The foundry employs 85 people.", "Castings are shipped by rail."),
    ),
)


@dataclass(frozen=True)
class BlendData:
    scenario: Scenario
    who: str
    money: Currency
    ingredients: tuple[str, ...]
    qualities: tuple[Quality, ...]
    cost: dict[str, float]
    content: dict[tuple[str, str], float]  # (quality, ingredient)
    minimum: dict[str, float]  # diet: absolute amounts; blend: share of the batch
    maximum: dict[str, float]
    available: dict[str, float]  # ingredient limits (absent = unlimited)
    batch: float  # blend only


class Blending(Family):
    name = "blending"
    title = "Blending and diet"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        chosen = rng.sample(sc.ingredients, rng.randint(3, min(6, len(sc.ingredients))))
        ingredients = tuple(ingredient.name for ingredient in chosen)
        qualities = draw(rng, sc.qualities, 2)
        content = {(q.name, i.name): _within(rng, i.content[q.name], q.step) for q in qualities for i in chosen}
        cost = {i.name: _within(rng, i.cost, sc.cost_step) for i in chosen}
        # witness mix: a feasible blend the bounds are built around
        weights = {f: rng.uniform(0.2, 1.0) for f in ingredients}
        if sc.structure == "diet":
            witness = {f: round(rng.uniform(0.5, 4.0)) * 1.0 for f in ingredients}
            level = {q.name: sum(content[q.name, f] * witness[f] for f in ingredients) for q in qualities}
            batch = 0.0
        else:
            batch = nice(rng, *sc.batch_range, 100 if sc.batch_range[1] > 1000 else 10)
            total = sum(weights.values())
            witness = {f: batch * weights[f] / total for f in ingredients}
            level = {q.name: sum(content[q.name, f] * witness[f] for f in ingredients) / batch for q in qualities}
        minimum, maximum = {}, {}
        for q in qualities:
            if rng.random() < 0.8:
                low = _round_down(level[q.name] * rng.uniform(0.75, 0.98))
                if low > 0:  # a level under 0.1 rounds to a minimum of 0, a row that asks nothing
                    minimum[q.name] = low
            if q.name not in minimum or rng.random() < 0.35:
                maximum[q.name] = _round_up(level[q.name] * rng.uniform(1.03, 1.3))
        available = {f: float(int(witness[f] * rng.uniform(1.2, 2.5)) + 1) for f in ingredients if rng.random() < 0.35}
        data = BlendData(
            sc,
            pick(rng, sc.who),
            currency(rng),
            ingredients,
            qualities,
            cost,
            content,
            minimum,
            maximum,
            available,
            batch,
        )
        if status == "infeasible":
            q = pick(rng, qualities)
            if sc.structure == "diet":
                limits = {f: float(max(1, int(witness[f]))) for f in ingredients}
                best = sum(content[q.name, f] * limits[f] for f in ingredients)
                need = _round_up(best * rng.uniform(1.1, 1.4))
                data = replace(
                    data,
                    available=limits,
                    minimum={**minimum, q.name: need},
                    maximum={k: v for k, v in maximum.items() if k != q.name},
                )
                note = f"even using every available {sc.unit[0]} of every ingredient gives only {number(best)} {q.unit} of {q.name}, but at least {number(need)} {q.unit} are required"
            else:
                richest = max(content[q.name, f] for f in ingredients)
                need = _round_up(richest * rng.uniform(1.05, 1.25))
                data = replace(
                    data, minimum={**minimum, q.name: need}, maximum={k: v for k, v in maximum.items() if k != q.name}
                )
                note = f"no ingredient has more than {number(richest)} {q.unit} {q.name}, so no mix of them can reach the required {number(need)} {q.unit}"
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: BlendData) -> LinearModel:
        b = ModelBuilder("blending")
        kind = "integer" if data.scenario.integer else "continuous"
        use = {f: b.var(lp_name("use", f), kind, 0.0, data.available.get(f)) for f in data.ingredients}
        diet = data.scenario.structure == "diet"
        if not diet:
            b.row("batch", {use[f]: 1.0 for f in data.ingredients}, "==", data.batch)
        for bound, sense, label in ((data.minimum, ">=", "min_quality"), (data.maximum, "<=", "max_quality")):
            for q, level in bound.items():
                terms = {use[f]: data.content[q, f] for f in data.ingredients}
                b.row(lp_name(label, q), terms, sense, level if diet else level * data.batch)
        b.minimize({use[f]: data.cost[f] for f in data.ingredients})
        return b.build()

    def program(self, data: BlendData) -> str:
        sc = data.scenario
        diet = sc.structure == "diet"
        vtype = "I" if sc.integer else "C"
        # the model's own words ("portions of ingredient f used"): a model -> code task gives the model, not the
        # story, so "in a daily ration for one animal" would be a fact the input does not give (the Seventh's #25)
        body = f'''# use[f]: {sc.unit[1]} of ingredient f used, up to what is available
use = {{f: model.addVar(vtype="{vtype}", lb=0, ub=available.get(f), name=f"use[{{f}}]") for f in ingredients}}
'''
        if not diet:
            body += """
# batch: the ingredients add up to the batch size
model.addCons(quicksum(use[f] for f in ingredients) == batch_size, name="batch")
"""
        scale_text = "" if diet else " * batch_size"
        where = (
            "the mix contains at least the required amount" if diet else "the blend's average is at least the minimum"
        )
        if data.minimum:
            body += f"""
# min_quality: {where}
for q, level in minimum.items():
    model.addCons(quicksum(content[q, f] * use[f] for f in ingredients) >= level{scale_text}, name=f"min_quality[{{q}}]")
"""
        if data.maximum:
            body += f"""
# max_quality: {where.replace("at least", "at most").replace("minimum", "maximum").replace("required", "allowed")}
for q, level in maximum.items():
    model.addCons(quicksum(content[q, f] * use[f] for f in ingredients) <= level{scale_text}, name=f"max_quality[{{q}}]")
"""
        body += """
# Objective: minimize the cost of the ingredients
model.setObjective(quicksum(cost[f] * use[f] for f in ingredients), sense="minimize")
"""
        values: list[tuple[str, object]] = [
            ("ingredients", list(data.ingredients)),
            ("cost", data.cost),
            ("content", data.content),
            ("minimum", data.minimum),
            ("maximum", data.maximum),
            ("available", data.available),
        ]
        if not diet:
            values.append(("batch_size", data.batch))
        return assemble("blending", values, body, ["for f, var in use.items():", '    show(f"use[{f}]", var)'])

    def math_model(self, data: BlendData) -> MathModel:
        sc = data.scenario
        diet = sc.structure == "diet"
        domain = r"\in \mathbb{Z}_{\ge 0}" if sc.integer else r"\ge 0"
        level = r"l_q" if diet else r"l_q B"
        upper = r"h_q" if diet else r"h_q B"
        params = [
            ParamDef("c_f", f"cost per {sc.unit[0]} of ingredient $f$ ({data.money.code})", data.cost, ("I",)),
            ParamDef(
                "a_{qf}",
                "content of quality $q$ per " + (sc.unit[0] if diet else "unit share") + " of ingredient $f$",
                data.content,
                ("Q", "I"),
            ),
        ]
        constraints = []
        if not diet:
            params.append(ParamDef("B", f"batch size ({sc.unit[1]})", data.batch))
            constraints.append(
                ConstraintDef(
                    "Batch",
                    "the ingredients add up to the batch",
                    r"\sum_{f \in I} x_f = B",
                    "batch",
                    (),
                    why="the ingredients [make up the whole batch|are all there is in the batch|form the entire batch], so "
                    "their amounts must add up to [its size exactly|exactly the batch size]",
                )
            )
        if data.minimum:
            params.append(
                ParamDef(
                    "l_q",
                    "required minimum " + ("amount" if diet else "average level") + " of quality $q$",
                    data.minimum,
                    ("Q_l",),
                )
            )
            constraints.append(
                ConstraintDef(
                    "Minimum",
                    "each bounded quality reaches its minimum",
                    rf"\sum_{{f \in I}} a_{{qf}} x_f \ge {level}",
                    "min_quality",
                    ("Q_l",),
                    why="[the mix must deliver enough of each required quality|each required quality must reach its minimum in "
                    "the mix], and [every ingredient contributes its own content|each ingredient adds its own content "
                    "of it]"
                    + (
                        ""
                        if diet
                        else "; the level is an average over the batch, so [it is written against the batch size"
                        "|the requirement is scaled by the batch size]"
                    ),
                )
            )
        if data.maximum:
            params.append(
                ParamDef(
                    "h_q",
                    "allowed maximum " + ("amount" if diet else "average level") + " of quality $q$",
                    data.maximum,
                    ("Q_h",),
                )
            )
            constraints.append(
                ConstraintDef(
                    "Maximum",
                    "each capped quality stays below its maximum",
                    rf"\sum_{{f \in I}} a_{{qf}} x_f \le {upper}",
                    "max_quality",
                    ("Q_h",),
                    why="some qualities [are harmful in excess|do harm above a certain level], so the mix may contain only "
                    "[so much of them|a limited amount of them]",
                )
            )
        bound = ""
        if data.available:
            params.append(
                ParamDef(
                    "u_f", f"{sc.unit[1]} of ingredient $f$ available (unlimited where absent)", data.available, ("I",)
                )
            )
            bound = r", \; x_f \le u_f"
        sets = [
            SetDef("I", "f", "ingredients", data.ingredients),
            SetDef("Q", "q", "qualities", tuple(q.name for q in data.qualities)),
        ]
        if data.minimum:
            sets.append(SetDef("Q_l", "q", "qualities with a minimum", tuple(data.minimum)))
        if data.maximum:
            sets.append(SetDef("Q_h", "q", "qualities with a maximum", tuple(data.maximum)))
        return MathModel(
            title="Diet model" if diet else "Blending model",
            sense="minimize",
            objective=r"\sum_{f \in I} c_f x_f",
            objective_description="total ingredient cost",
            sets=tuple(sets),
            params=tuple(params),
            variables=(
                VarDef(
                    "x_f",
                    f"{sc.unit[1]} of ingredient $f$ used",
                    domain + bound,
                    "use",
                    ("I",),
                    noun=f"{sc.unit[1]} of each ingredient to use",
                    whole=f"ingredients come in whole {sc.unit[1]}" if sc.integer else "",
                ),
            ),
            constraints=tuple(constraints),
        )

    def statement(self, data: BlendData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        diet = sc.structure == "diet"
        st = Statement(rng)
        opening = (
            f"{data.who} is putting together {sc.context} from {join(data.ingredients, rng)}.",
            f"{data.who} needs to decide how many {sc.unit[1]} of each of {len(data.ingredients)} ingredients ({join(data.ingredients, rng)}) go into {sc.context}.",
            f"The cheapest {sc.context.split(' of ')[-1] if not diet else 'menu'} is wanted: {decapitalize(data.who)} can combine {join(data.ingredients, rng)}.",
        )
        st.add(pick(rng, opening))
        if not diet:
            st.add(
                pick(
                    rng,
                    (
                        f"The batch must total exactly {number(data.batch)} {sc.unit[1]}.",
                        f"Exactly {number(data.batch)} {sc.unit[1]} are produced in one batch.",
                    ),
                )
            )
        qualities = data.qualities
        per = f"per {sc.unit[0]}" if diet else "(as a share or level in the ingredient)"
        header = ["Ingredient", f"Cost per {sc.unit[0]}", *(f"{q.name} ({q.unit})" for q in qualities)]
        rows = [
            [f, money(data.cost[f]), *(number(data.content[q.name, f]) for q in qualities)] for f in data.ingredients
        ]
        if rng.random() < 0.6:
            st.add(
                pick(rng, (f"Costs and contents {per}:", "The ingredients have these properties:", "Ingredient data:"))
                + "\n\n"
                + table(header, rows)
            )
        else:
            for f in data.ingredients:
                traits = join([_content(data.content[q.name, f], q) for q in qualities], rng)
                st.add(
                    pick(
                        rng,
                        (
                            f"{capitalize(f)} {verb(f, 'costs')} {money(data.cost[f])} per {sc.unit[0]} and {verb(f, 'provides')} {traits}.",
                            f"One {sc.unit[0]} of {f} has {traits}; it costs {money(data.cost[f])}.",
                        ),
                    )
                )
        rules = []
        for q in qualities:
            low, high = data.minimum.get(q.name), data.maximum.get(q.name)
            what = f"{q.name}" if diet else f"the average {q.name}"
            if low is not None and high is not None:
                rules.append(f"{what} must lie between {number(low)} and {number(high)} {q.unit}")
            elif low is not None:
                rules.append(
                    pick(
                        rng,
                        (
                            f"{what} must be at least {number(low)} {q.unit}",
                            f"there must be no less than {number(low)} {q.unit} of {q.name}"
                            if diet
                            else f"{what} may not fall below {number(low)} {q.unit}",
                        ),
                    )
                )
            elif high is not None:
                rules.append(
                    pick(
                        rng,
                        (
                            f"{what} must not exceed {number(high)} {q.unit}",
                            f"{what} is capped at {number(high)} {q.unit}",
                        ),
                    )
                )
        lead = "In total, " if diet else "In the finished blend, "
        st.add(lead + join(rules, rng, "and") + ".")
        for f, limit in data.available.items():
            st.add(
                pick(
                    rng,
                    (
                        f"Only {amount(limit, sc.unit)} of {f} are on hand.",
                        f"At most {amount(limit, sc.unit)} of {f} can be used.",
                    ),
                )
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        whole = f" Ingredients come in whole {sc.unit[1]}." if sc.integer else ""
        st.question = (
            whole.strip()
            + " "
            + pick(
                rng,
                (
                    "What combination meets all requirements at the lowest cost?",
                    f"How many {sc.unit[1]} of each ingredient should be used to minimize cost? Give the minimum cost.",
                    "Find the least-cost mix and its cost.",
                ),
            )
        )
        return st.text()

    def decisions(self, data: BlendData, values: Mapping[str, float]) -> list[str]:
        lines = []
        for f in data.ingredients:
            used = values[lp_name("use", f)]
            if abs(used) > 1e-6:
                lines.append(f"Use {amount(used, data.scenario.unit)} of {f}.")
        return lines

    def what_if(self, data: BlendData, rng: random.Random) -> WhatIf:
        if rng.random() < 0.5 or not data.minimum:
            f = pick(rng, data.ingredients)
            new = scale(data.cost[f], pick(rng, (0.6, 0.8, 1.25, 1.5)), integer=False, step=data.scenario.cost_step)
            return WhatIf(
                f"What if {f} cost {data.money(new)} per {data.scenario.unit[0]} instead of {data.money(data.cost[f])}?",
                replace(data, cost={**data.cost, f: new}),
                f"cost[{f}]",
                data.cost[f],
                new,
            )
        q = pick(rng, sorted(data.minimum))
        unit = next(quality.unit for quality in data.qualities if quality.name == q)
        new = _round_down(data.minimum[q] * pick(rng, (0.85, 0.9, 1.05, 1.1)))
        if new == data.minimum[q]:
            new = _round_down(data.minimum[q] * 0.8)
        return WhatIf(
            f"What if the minimum for {q} were {number(new)} {unit} instead of {number(data.minimum[q])}?",
            replace(data, minimum={**data.minimum, q: new}),
            f"minimum[{q}]",
            data.minimum[q],
            new,
        )


def _content(value: float, quality: Quality) -> str:
    if quality.unit == "%":
        return f"{number(value)}% {quality.name}"
    if quality.unit == "points":
        return f"an {quality.name} of {number(value)}"
    return f"{number(value)} {quality.unit} of {quality.name}"


def _within(rng: random.Random, bounds: tuple[float, float], step: float) -> float:
    low, high = bounds
    return nice(rng, round(low / step) * step, max(round(low / step), round(high / step)) * step, step)


def _round_down(value: float) -> float:
    step = 0.1 if value < 20 else 1.0
    return round(int(value / step) * step, 4)


def _round_up(value: float) -> float:
    step = 0.1 if value < 20 else 1.0
    return round((int(value / step) + 1) * step, 4)
