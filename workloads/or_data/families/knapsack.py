"""Multi-dimensional knapsack: select items of greatest total value within several capacity
limits, with conflicts (at most one of a pair), prerequisites (one item only with another) and
mandatory items."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, draw, nice
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, lp_name
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import (
    Currency,
    Statement,
    capitalize,
    currency,
    decapitalize,
    generic_distractors,
    join,
    number,
    pick,
    present,
)
from trex.workloads.or_data.program import assemble
from trex.workloads.or_data.prose import singular_noun, sv


@dataclass(frozen=True)
class Dimension:
    name: str  # "budget"
    unit: str  # "thousand dollars"
    span: tuple[float, float, float]  # item size range


@dataclass(frozen=True)
class Scenario:
    who: tuple[str, ...]
    context: str
    item: tuple[str, str]
    items: tuple[str, ...]
    value_word: str  # "expected return", "science value"
    value_money: bool
    value_range: tuple[float, float, float]
    dimensions: tuple[Dimension, ...]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("The board of Helix Pharma", "A city council", "The R&D office of Vantor"),
        "the project portfolio for next year",
        ("project", "projects"),
        (
            "new warehouse",
            "CRM upgrade",
            "solar roof",
            "staff training",
            "lab expansion",
            "website relaunch",
            "fleet renewal",
            "data center",
            "market study",
            "patent filing",
            "robotics pilot",
            "safety audit",
        ),
        "expected net benefit",
        True,
        (20, 400, 5),
        (
            Dimension("budget", "thousand dollars", (30, 250, 5)),
            Dimension("engineers", "engineers", (1, 8, 1)),
            Dimension("management time", "days", (2, 20, 1)),
        ),
        (
            "The portfolio is reviewed every quarter.",
            "Two projects from last year are still running.",
            "The company's fiscal year starts in April.",
        ),
    ),
    Scenario(
        ("A cargo airline", "A shipping broker", "A freight forwarder"),
        "a cargo hold",
        ("shipment", "shipments"),
        (
            "machine parts",
            "textiles",
            "medical kits",
            "electronics",
            "wine crates",
            "auto parts",
            "books",
            "furniture",
            "toys",
            "coffee beans",
            "solar panels",
            "spare tires",
        ),
        "freight revenue",
        True,
        (300, 4000, 50),
        (Dimension("weight", "kg", (80, 900, 10)), Dimension("volume", "cubic meters", (0.5, 6, 0.5))),
        (
            "The aircraft flies twice a week.",
            "Customs clearance takes about a day.",
            "Fuel surcharges are billed separately.",
        ),
    ),
    Scenario(
        ("A space agency", "A satellite startup", "A university lab"),
        "the payload of a small satellite",
        ("instrument", "instruments"),
        (
            "camera",
            "spectrometer",
            "magnetometer",
            "radio beacon",
            "star tracker",
            "particle detector",
            "laser altimeter",
            "thermal imager",
            "radiometer",
            "gyroscope test",
        ),
        "science value",
        False,
        (5, 60, 1),
        (
            Dimension("mass", "kg", (1, 12, 0.5)),
            Dimension("power", "watts", (2, 40, 1)),
            Dimension("data rate", "Mbit/s", (1, 15, 1)),
        ),
        ("Launch is planned for the autumn.", "The satellite will orbit at 550 km.", "The team has 14 members."),
    ),
    Scenario(
        ("A hiker", "A mountain guide", "An expedition member"),
        "a backpack for a long trek",
        ("item", "items"),
        (
            "tent",
            "stove",
            "water filter",
            "first-aid kit",
            "camera",
            "extra jacket",
            "book",
            "trekking poles",
            "solar charger",
            "binoculars",
            "fishing rod",
            "hammock",
        ),
        "usefulness score",
        False,
        (3, 30, 1),
        (Dimension("weight", "kg", (0.2, 3, 0.1)), Dimension("volume", "liters", (0.5, 12, 0.5))),
        ("The trek takes six days.", "The trail passes three huts.", "The weather forecast is good."),
    ),
    Scenario(
        ("A marketing team", "The brand manager of Lumo", "An agency planning a launch"),
        "the campaign plan",
        ("campaign", "campaigns"),
        (
            "TV spot",
            "podcast ads",
            "billboards",
            "influencer deal",
            "search ads",
            "newsletter",
            "trade fair",
            "radio",
            "cinema ads",
            "social video",
            "print magazine",
            "sponsorship",
        ),
        "expected new customers",
        False,
        (100, 2500, 50),
        (Dimension("budget", "thousand euros", (10, 120, 5)), Dimension("staff hours", "hours", (20, 300, 10))),
        ("The brand turns ten this year.", "Its slogan was chosen by customers.", "The launch date is fixed."),
    ),
)


@dataclass(frozen=True)
class KnapsackData:
    scenario: Scenario
    who: str
    money: Currency
    items: tuple[str, ...]
    dimensions: tuple[Dimension, ...]
    value: dict[str, float]
    size: dict[tuple[str, str], float]  # (dimension, item)
    capacity: dict[str, float]
    conflicts: tuple[tuple[str, str], ...]  # at most one of the pair
    requires: tuple[tuple[str, str], ...]  # (a, b): a only together with b
    mandatory: tuple[str, ...]


class Knapsack(Family):
    name = "knapsack"
    title = "Multi-dimensional knapsack"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        items = draw(rng, sc.items, 6, 11)
        dimensions = draw(rng, sc.dimensions, 1)
        value = {i: nice(rng, *sc.value_range) for i in items}
        size = {(d.name, i): nice(rng, *d.span) for d in dimensions for i in items}
        capacity = {
            d.name: _tidy(sum(size[d.name, i] for i in items) * rng.uniform(0.35, 0.6), d.span[2]) for d in dimensions
        }
        pairs = [(a, b) for a in items for b in items if a < b]
        conflicts = tuple(rng.sample(pairs, rng.randint(0, 2)))
        requires = tuple(
            (a, b)
            for a, b in rng.sample(pairs, rng.randint(0, 2))
            if (a, b) not in conflicts and (b, a) not in conflicts
        )
        mandatory: tuple[str, ...] = ()
        free = [i for i in items if all(i not in pair for pair in (*conflicts, *requires))]
        if free and rng.random() < 0.3:
            must = pick(rng, free)
            if all(size[d.name, must] <= capacity[d.name] for d in dimensions):
                mandatory = (must,)
        who = pick(rng, sc.who)
        money = currency(rng)  # drawn after the owner, as before
        # a budget is counted in the story's own money: "255 yuan" of benefit next to a budget "(thousand
        # dollars)" mixed two currencies in one table (the tenth session's review, #29)
        dimensions = tuple(
            replace(d, unit=f"thousand {money.word or money.code}") if d.unit.startswith("thousand ") else d
            for d in dimensions
        )
        data = KnapsackData(
            sc,
            who,
            money,
            items,
            dimensions,
            value,
            size,
            capacity,
            conflicts,
            requires,
            mandatory,
        )
        if status == "infeasible":
            d = pick(rng, dimensions)
            ranked = sorted(free or list(items), key=lambda i: -size[d.name, i])
            chosen, total = [], 0.0
            for i in ranked:
                chosen.append(i)
                total += size[d.name, i]
                if total > capacity[d.name] and len(chosen) >= 2:
                    break
            if total <= capacity[d.name]:
                capacity = {**capacity, d.name: _tidy(total * 0.8, d.span[2])}
            data = replace(data, mandatory=tuple(chosen), capacity=capacity, conflicts=(), requires=())
            note = f"the mandatory {sc.item[1]} {join(chosen)} together need {number(total)} {d.unit}{'' if d.unit == d.name else ' of ' + d.name}, but only {number(capacity[d.name])} are available"
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: KnapsackData) -> LinearModel:
        b = ModelBuilder("knapsack")
        pick_ = {i: b.var(lp_name("select", i), "binary") for i in data.items}
        for d in data.dimensions:
            b.row(
                lp_name("capacity", d.name),
                {pick_[i]: data.size[d.name, i] for i in data.items},
                "<=",
                data.capacity[d.name],
            )
        for first, second in data.conflicts:
            b.row(lp_name("conflict", first, second), {pick_[first]: 1, pick_[second]: 1}, "<=", 1)
        for first, second in data.requires:
            b.row(lp_name("requires", first, second), {pick_[first]: 1, pick_[second]: -1}, "<=", 0)
        for item in data.mandatory:
            b.row(lp_name("mandatory", item), {pick_[item]: 1}, ">=", 1)
        b.maximize({pick_[i]: data.value[i] for i in data.items})
        return b.build()

    def program(self, data: KnapsackData) -> str:
        sc = data.scenario
        body = f"""# select[i] = 1 when {sc.item[0]} i is chosen
select = {{i: model.addVar(vtype="B", name=f"select[{{i}}]") for i in items}}

# capacity: the chosen {sc.item[1]} fit within every limit
for d in limits:
    model.addCons(quicksum(size[d, i] * select[i] for i in items) <= limits[d], name=f"capacity[{{d}}]")
"""
        if data.conflicts:
            body += """
# conflict: at most one of each conflicting pair
for a, b in conflicts:
    model.addCons(select[a] + select[b] <= 1, name=f"conflict[{a},{b}]")
"""
        if data.requires:
            body += """
# requires: an item is chosen only together with its prerequisite
for a, b in requires:
    model.addCons(select[a] <= select[b], name=f"requires[{a},{b}]")
"""
        if data.mandatory:
            body += """
# mandatory: these must be chosen
for i in mandatory:
    model.addCons(select[i] >= 1, name=f"mandatory[{i}]")
"""
        body += f"""
# Objective: maximize the total {sc.value_word}
model.setObjective(quicksum(value[i] * select[i] for i in items), sense="maximize")
"""
        values: list[tuple[str, object]] = [
            ("items", list(data.items)),
            ("value", data.value),
            ("size", data.size),
            ("limits", data.capacity),
        ]
        for name, entries in (("conflicts", data.conflicts), ("requires", data.requires)):
            if entries:
                values.append((name, [list(pair) for pair in entries]))
        if data.mandatory:
            values.append(("mandatory", list(data.mandatory)))
        return assemble("knapsack", values, body, ["for i, var in select.items():", '    show(f"select[{i}]", var)'])

    def math_model(self, data: KnapsackData) -> MathModel:
        sc = data.scenario
        params = [
            ParamDef("v_i", f"{sc.value_word} of {sc.item[0]} $i$", data.value, ("I",)),
            ParamDef("w_{di}", f"use of limit $d$ by {sc.item[0]} $i$", data.size, ("D", "I")),
            ParamDef(
                "C_d",
                "capacity of limit $d$ ("
                + ", ".join(d.name if d.unit == d.name else f"{d.name} in {d.unit}" for d in data.dimensions)
                + ")",
                data.capacity,
                ("D",),
            ),
        ]
        sets = [
            SetDef("I", "i", sc.item[1], data.items),
            SetDef("D", "d", "limits", tuple(d.name for d in data.dimensions)),
        ]
        constraints = [
            ConstraintDef(
                "Capacity",
                "the selection fits every limit",
                r"\sum_{i \in I} w_{di} y_i \le C_d",
                "capacity",
                ("D",),
                # the instance's own limits, not "money, time or space" (engineers, power, data rate)
                why=f"[each limit ({join([d.name for d in data.dimensions])}) has a fixed amount|every limit, whether "
                f"{join([d.name for d in data.dimensions], conjunction='or')}, is fixed], and every chosen "
                f"{sc.item[0]} [uses part of it|takes up part of it]",
            )
        ]
        if data.conflicts:
            sets.append(SetDef("K", "(i,j)", "conflicting pairs", tuple(f"({a}, {b})" for a, b in data.conflicts)))
            constraints.append(
                ConstraintDef(
                    "Conflicts",
                    "at most one of a conflicting pair",
                    r"y_i + y_j \le 1",
                    "conflict",
                    ("K",),
                    why="some items exclude each other; with yes/no variables, ['not both' is a sum of at most one|'not "
                    "both' means that their sum is at most one]",
                )
            )
        if data.requires:
            sets.append(
                SetDef(
                    "R", "(i,j)", "prerequisite pairs ($i$ needs $j$)", tuple(f"({a}, {b})" for a, b in data.requires)
                )
            )
            constraints.append(
                ConstraintDef(
                    "Prerequisites",
                    "an item is chosen only with its prerequisite",
                    r"y_i \le y_j",
                    "requires",
                    ("R",),
                    why="an item that depends on another is only useful when that one is chosen too, which [the inequality "
                    "between the two yes/no variables expresses|bounding one yes/no variable by the other expresses]",
                )
            )
        if data.mandatory:
            sets.append(SetDef("M", "i", f"mandatory {sc.item[1]}", data.mandatory))
            constraints.append(
                ConstraintDef(
                    "Mandatory",
                    "mandatory items are chosen",
                    r"y_i = 1",
                    "mandatory",
                    ("M",),
                    why="some items [are already committed to|were promised beforehand] and must be in any selection",
                )
            )
        return MathModel(
            title="Multi-dimensional knapsack model",
            sense="maximize",
            objective=r"\sum_{i \in I} v_i y_i",
            objective_description=f"total {sc.value_word}",
            sets=tuple(sets),
            params=tuple(params),
            variables=(
                VarDef(
                    "y_i",
                    f"1 if {sc.item[0]} $i$ is chosen",
                    r"\in \{0, 1\}",
                    "select",
                    ("I",),
                    indicator=f"whether to choose each {sc.item[0]}",
                ),
            ),
            constraints=tuple(constraints),
        )

    def statement(self, data: KnapsackData, rng: random.Random) -> str:
        sc = data.scenario
        money = data.money
        worth = (lambda v: money(v)) if sc.value_money else number
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.who} is choosing {sc.context} from {len(data.items)} candidate {sc.item[1]}.",
                    f"{data.who} must decide which {sc.item[1]} to include in {sc.context}. The candidates are {join(data.items, rng)}.",
                    f"For {sc.context}, {decapitalize(data.who)} can pick any subset of these {sc.item[1]}: {join(data.items, rng)}.",
                ),
            )
        )
        dims = data.dimensions
        header = [
            capitalize(sc.item[0]),
            capitalize(sc.value_word),
            *(d.name if d.unit == d.name else f"{d.name} ({d.unit})" for d in dims),
        ]
        rows = [(i, worth(data.value[i]), *(number(data.size[d.name, i]) for d in dims)) for i in data.items]
        st.add(
            present(
                rng,
                header,
                rows,
                lambda row: (
                    f"{row[0]}: {sc.value_word} {row[1]}, "
                    + ", ".join(
                        f"{row[2 + k]} {singular_noun(d.unit) if row[2 + k] == '1' else d.unit}"
                        if d.unit == d.name
                        else f"{d.name} {row[2 + k]} {d.unit}"
                        for k, d in enumerate(dims)
                    )
                ),
                intro=(
                    f"Data for each {sc.item[0]}:",
                    f"The {sc.item[1]} are described below.",
                    f"Each {sc.item[0]} has a value and uses resources:",
                ),
                allowed=("list", "table"),
            )
        )
        st.add(
            " ".join(
                pick(
                    rng,
                    (
                        f"The total {'number of ' if d.unit == d.name else ''}{d.name} cannot exceed "
                        f"{number(data.capacity[d.name])}{'' if d.unit == d.name else ' ' + d.unit}.",
                        f"Only {number(data.capacity[d.name])} {d.unit}"
                        + ("" if d.unit == d.name else f" of {d.name}")
                        + " are available.",
                        f"There is a limit of {number(data.capacity[d.name])} {d.unit}"
                        + ("." if d.unit == d.name else f" on {d.name}."),
                    ),
                )
                for d in dims
            )
        )
        for a, b in data.conflicts:
            st.add(
                pick(
                    rng,
                    (f"{capitalize(a)} and {b} cannot both be chosen.", f"At most one of {a} and {b} can be included."),
                )
            )
        for a, b in data.requires:
            st.add(
                pick(
                    rng,
                    (
                        # "if textiles are chosen too": the verb agrees with the item's name (the tenth review's #21)
                        f"{capitalize(a)} can only be chosen if {sv(b, 'is')} chosen too.",
                        f"Including {a} requires including {b}.",
                    ),
                )
            )
        for item in data.mandatory:
            st.add(pick(rng, (f"{capitalize(item)} must be included.", f"{capitalize(item)} is mandatory.")))
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"Which {sc.item[1]} should be chosen to maximize the total {sc.value_word}?",
                f"Select the {sc.item[1]} with the greatest total {sc.value_word} and report that total.",
                f"What is the maximum total {sc.value_word} achievable?",
            ),
        ) + pick(rng, ("", f" Each {sc.item[0]} is either taken whole or not at all."))
        return st.text()

    def decisions(self, data: KnapsackData, values: Mapping[str, float]) -> list[str]:
        chosen = [i for i in data.items if values[lp_name("select", i)] > 0.5]
        return [f"Choose {i}." for i in chosen]

    def what_if(self, data: KnapsackData, rng: random.Random) -> WhatIf:
        d = pick(rng, data.dimensions)
        new = _tidy(data.capacity[d.name] * pick(rng, (0.8, 0.9, 1.15, 1.3)), d.span[2])
        if new == data.capacity[d.name]:
            new = data.capacity[d.name] + d.span[2]
        return WhatIf(
            f"What if the {d.name} limit were {number(new)} {d.unit} instead of {number(data.capacity[d.name])}?",
            replace(data, capacity={**data.capacity, d.name: new}),
            f"limits[{d.name}]",
            data.capacity[d.name],
            new,
        )


def _tidy(value: float, step: float) -> float:
    return float(round(max(step, round(value / step) * step), 4))
