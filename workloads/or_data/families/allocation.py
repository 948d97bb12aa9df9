"""Resource allocation: divide a budget (and staff time) among activities with different
returns, within per-activity minimums and maximums and a rule that a group of activities gets at
least a share of the total. An investment variant can borrow at an interest rate, which makes the
problem unbounded when some activity has no upper limit and out-earns the rate."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, scale
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, lp_name
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import (
    Currency,
    Statement,
    capitalize,
    currency,
    generic_distractors,
    join,
    number,
    pick,
    present,
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Activity:
    name: str
    group: bool  # belongs to the group with a minimum share
    rate: tuple[float, float]  # return per unit of money
    effort: tuple[float, float]  # staff hours per unit


@dataclass(frozen=True)
class Scenario:
    who: tuple[str, ...]
    purpose: str
    activities: tuple[Activity, ...]
    group_name: str
    unit: str  # "thousand dollars" allocated
    return_word: str  # "expected return"
    return_unit: str  # "thousand dollars" / "new customers"
    budget_range: tuple[int, int, int]
    can_borrow: bool
    facts: tuple[str, ...]


def _a(name: str, group: bool, rate: tuple[float, float], effort: tuple[float, float] = (0.0, 0.0)) -> Activity:
    return Activity(name, group, rate, effort)


SCENARIOS = (
    Scenario(
        ("A pension fund", "A family office", "A university endowment"),
        "its investments for the year",
        (
            _a("government bonds", True, (0.03, 0.045)),
            _a("corporate bonds", True, (0.045, 0.065)),
            _a("stocks", False, (0.06, 0.1)),
            _a("real estate", False, (0.05, 0.08)),
            _a("private equity", False, (0.09, 0.14)),
            _a("money market", True, (0.02, 0.035)),
        ),
        "fixed-income assets",
        "million dollars",
        "expected return",
        "million dollars",
        (20, 200, 10),
        True,
        ("The fund has 12,000 members.", "Its board meets quarterly.", "Reports are audited externally."),
    ),
    Scenario(
        ("A marketing department", "A startup's growth team", "A retail chain"),
        "its advertising budget",
        (
            _a("search ads", True, (40, 70), (1, 3)),
            _a("social media", True, (30, 80), (2, 5)),
            _a("TV", False, (20, 45), (0.5, 1.5)),
            _a("radio", False, (15, 35), (0.5, 2)),
            _a("print", False, (8, 25), (1, 2.5)),
            _a("email campaigns", True, (25, 60), (3, 6)),
        ),
        "digital channels",
        "thousand euros",
        "expected new customers",
        "customers",
        (50, 400, 10),
        False,
        ("The brand was founded in 2012.", "Its mascot is a fox.", "Customer service is open on weekends."),
    ),
    Scenario(
        ("A city council", "A regional development agency", "A public-health office"),
        "its infrastructure grants",
        (
            _a("road repair", False, (1.5, 3.0), (2, 5)),
            _a("bike lanes", True, (2.0, 4.0), (1, 3)),
            _a("parks", True, (1.0, 2.5), (1, 2)),
            _a("street lighting", False, (1.2, 2.2), (0.5, 1.5)),
            _a("public transport", True, (2.5, 4.5), (2, 4)),
        ),
        "green projects",
        "million euros",
        "benefit score",
        "points",
        (10, 80, 5),
        False,
        ("The council has 31 members.", "Elections are held every four years.", "The town hall dates from 1890."),
    ),
    Scenario(
        ("A farm cooperative", "A family farm", "An agricultural investor"),
        "its planting budget across crops",
        (
            _a("wheat", False, (0.15, 0.3), (2, 4)),
            _a("corn", False, (0.2, 0.35), (3, 5)),
            _a("soybeans", True, (0.25, 0.4), (2, 3)),
            _a("vegetables", True, (0.35, 0.6), (8, 14)),
            _a("orchard", True, (0.3, 0.5), (5, 9)),
        ),
        "crops that fix nitrogen or diversify the rotation",
        "thousand dollars",
        "expected profit",
        "thousand dollars",
        (100, 800, 20),
        True,
        (
            "The farm has been in the family for four generations.",
            "Rainfall averages 700 mm a year.",
            "The tractor is ten years old.",
        ),
    ),
)


@dataclass(frozen=True)
class AllocationData:
    scenario: Scenario
    who: str
    money: Currency
    activities: tuple[str, ...]
    rate: dict[str, float]
    effort: dict[str, float]  # staff hours per unit (empty when staff is not limited)
    hours: float | None
    minimum: dict[str, float]
    maximum: dict[str, float]
    budget: float | None  # None: funds are borrowed without limit
    borrow_rate: float  # cost per unit of money spent beyond own funds; 0 when no borrowing
    group: tuple[str, ...]
    group_share: float  # the group gets at least this share of the total


class ResourceAllocation(Family):
    name = "resource_allocation"
    title = "Resource (budget) allocation"
    statuses = ("infeasible", "unbounded")

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, [s for s in SCENARIOS if s.can_borrow] if status == "unbounded" else SCENARIOS)
        chosen = rng.sample(sc.activities, rng.randint(3, min(5, len(sc.activities))))
        names = tuple(a.name for a in chosen)
        rate = {a.name: round(rng.uniform(*a.rate), 3 if a.rate[1] < 1 else 1) for a in chosen}
        low, high, step = sc.budget_range
        budget = float(rng.randrange(low, high + step, step))
        effort, hours = {}, None
        if any(a.effort[1] for a in chosen) and rng.random() < 0.6:
            effort = {a.name: round(rng.uniform(*a.effort), 1) for a in chosen}
            typical = sum(effort.values()) / len(effort) * budget
            hours = float(int(typical * rng.uniform(0.5, 0.9)))
        minimum = {n: float(int(budget * rng.uniform(0.03, 0.12))) for n in rng.sample(names, rng.randint(0, 2))}
        maximum = {
            n: float(int(budget * rng.uniform(0.25, 0.5))) for n in names if n not in minimum and rng.random() < 0.5
        }
        group = tuple(a.name for a in chosen if a.group)
        share = round(rng.uniform(0.2, 0.5), 2) if group and len(group) < len(names) and rng.random() < 0.6 else 0.0
        data = AllocationData(
            sc,
            pick(rng, sc.who),
            currency(rng),
            names,
            rate,
            effort,
            hours,
            minimum,
            maximum,
            budget,
            0.0,
            group if share else (),
            share,
        )
        if hours is not None and sum(effort[n] * v for n, v in minimum.items()) > hours:
            data = replace(data, minimum={})
        if status == "infeasible":
            forced = {n: float(int(budget * rng.uniform(0.3, 0.5))) for n in rng.sample(names, min(3, len(names)))}
            while sum(forced.values()) <= budget:
                forced = {n: v * 1.2 for n, v in forced.items()}
            forced = {n: float(int(v)) for n, v in forced.items()}
            first = next(iter(forced))
            forced[first] += max(0.0, budget - sum(forced.values()) + 1)  # flooring may have closed the gap
            data = replace(
                data,
                minimum=forced,
                maximum={n: v for n, v in data.maximum.items() if n not in forced},
                hours=None,
                effort={},
            )
            note = f"the minimum amounts for {join(list(forced))} add up to {number(sum(forced.values()))} {sc.unit}, more than the budget of {number(budget)}"
            return Generated(data, "infeasible", note)
        if status == "unbounded":
            borrow = round(min(rate.values()) * rng.uniform(0.5, 0.9), 3)
            best = max(names, key=lambda n: rate[n])
            maximum = {n: v for n, v in data.maximum.items() if n != best}
            data = replace(
                data, budget=None, borrow_rate=borrow, maximum=maximum, hours=None, effort={}, group=(), group_share=0.0
            )
            note = (
                # "each unit put into vegetables returns": the activity's name may be a plural ("vegetables returns",
                # the tenth session's review #25)
                f"money can be borrowed without limit at {borrow:.1%}, and each unit put into {best} returns "
                f"{rate[best]:.1%} with no upper limit, "
                "so every borrowed unit put into it adds to the return"
            )
            return Generated(data, "unbounded", note)
        return Generated(data, "optimal")

    def linear_model(self, data: AllocationData) -> LinearModel:
        b = ModelBuilder("resource_allocation")
        spend = {
            n: b.var(lp_name("spend", n), "continuous", data.minimum.get(n, 0.0), data.maximum.get(n))
            for n in data.activities
        }
        if data.budget is not None:
            b.row("budget", {spend[n]: 1 for n in data.activities}, "<=", data.budget)
        if data.hours is not None:
            b.row("staff", {spend[n]: data.effort[n] for n in data.activities}, "<=", data.hours)
        if data.group_share:
            terms = {spend[n]: (1.0 if n in data.group else 0.0) - data.group_share for n in data.activities}
            b.row("group_share", terms, ">=", 0.0)
        net = {spend[n]: data.rate[n] - data.borrow_rate for n in data.activities}
        b.maximize(net)
        return b.build()

    def program(self, data: AllocationData) -> str:
        body = """# spend[a]: amount allocated to activity a, within its minimum and maximum
spend = {a: model.addVar(vtype="C", lb=minimum.get(a, 0), ub=maximum.get(a), name=f"spend[{a}]") for a in activities}
"""
        if data.budget is not None:
            body += """
# budget: the allocations add up to at most the budget
model.addCons(quicksum(spend[a] for a in activities) <= budget, name="budget")
"""
        if data.hours is not None:
            body += """
# staff: the staff time the activities need is available
model.addCons(quicksum(hours_per_unit[a] * spend[a] for a in activities) <= staff_hours, name="staff")
"""
        if data.group_share:
            body += """
# group_share: the group's activities receive at least their share of the total
model.addCons(quicksum(spend[a] for a in group) >= group_share * quicksum(spend[a] for a in activities), name="group_share")
"""
        if data.borrow_rate:
            body += """
# Objective: maximize the return net of the interest on borrowed money
model.setObjective(quicksum((rate[a] - borrow_rate) * spend[a] for a in activities), sense="maximize")
"""
        else:
            body += """
# Objective: maximize the total return
model.setObjective(quicksum(rate[a] * spend[a] for a in activities), sense="maximize")
"""
        values: list[tuple[str, object]] = [
            ("activities", list(data.activities)),
            ("rate", data.rate),
            ("minimum", data.minimum),
            ("maximum", data.maximum),
        ]
        if data.budget is not None:
            values.append(("budget", data.budget))
        if data.hours is not None:
            values += [("hours_per_unit", data.effort), ("staff_hours", data.hours)]
        if data.group_share:
            values += [("group", list(data.group)), ("group_share", data.group_share)]
        if data.borrow_rate:
            values.append(("borrow_rate", data.borrow_rate))
        return assemble(
            "resource_allocation", values, body, ["for a, var in spend.items():", '    show(f"spend[{a}]", var)']
        )

    def math_model(self, data: AllocationData) -> MathModel:
        sc = data.scenario
        params = [ParamDef("r_a", f"{sc.return_word} per unit allocated to $a$", data.rate, ("A",))]
        constraints = []
        domain = r"\ge 0"
        if data.minimum or data.maximum:
            if data.minimum:
                params.append(ParamDef("m_a", f"minimum allocation ({sc.unit}; 0 where absent)", data.minimum, ("A",)))
            if data.maximum:
                params.append(
                    ParamDef("M_a", f"maximum allocation ({sc.unit}; none where absent)", data.maximum, ("A",))
                )
            domain = (r"\ge m_a" if data.minimum else r"\ge 0") + (r", \; x_a \le M_a" if data.maximum else "")
        sets = [SetDef("A", "a", "activities", data.activities)]
        objective = r"\sum_{a \in A} r_a x_a"
        if data.budget is not None:
            params.append(ParamDef("B", f"budget ({sc.unit})", data.budget))
            constraints.append(
                ConstraintDef(
                    "Budget",
                    "allocations stay within the budget",
                    r"\sum_{a \in A} x_a \le B",
                    "budget",
                    (),
                    why="[the money spent on all options together|total spending over all options|what the options cost together] "
                    "[cannot exceed|must stay within|may not go beyond] [what there is|the budget|the money available]; "
                    "[leftover money is allowed|part of the budget may stay unspent], "
                    "[so this is an inequality rather than an equation|which makes the row an inequality, not an equation]",
                )
            )
        if data.hours is not None:
            params += [
                ParamDef("e_a", "staff hours per unit allocated", data.effort, ("A",)),
                ParamDef("H", "staff hours available", data.hours),
            ]
            constraints.append(
                ConstraintDef(
                    "Staff time",
                    "the staff time needed is available",
                    r"\sum_{a \in A} e_a x_a \le H",
                    "staff",
                    (),
                    why="[every unit allocated also costs staff hours|each allocated unit also takes staff time], and only a "
                    "[fixed|limited] number of hours [is available|can be worked]",
                )
            )
        if data.group_share:
            sets.append(SetDef("G", "a", sc.group_name, data.group))
            params.append(ParamDef("\\gamma", f"minimum share of {sc.group_name}", data.group_share))
            constraints.append(
                ConstraintDef(
                    "Group share",
                    f"{sc.group_name} get at least a share $\\gamma$",
                    r"\sum_{a \in G} x_a \ge \gamma \sum_{a \in A} x_a",
                    "group_share",
                    (),
                    why=f"policy reserves a minimum share for {sc.group_name}; [multiplying the share out against the total "
                    "keeps the rule linear|a share is a ratio, and multiplying it out against the total turns it into a "
                    "linear row|written as a ratio the rule would not be linear, so the share is multiplied out against "
                    "the total]",
                )
            )
        if data.borrow_rate:
            params.append(ParamDef("\\beta", "interest rate on borrowed money", data.borrow_rate))
            objective = r"\sum_{a \in A} (r_a - \beta) x_a"
        return MathModel(
            title="Resource allocation model",
            sense="maximize",
            objective=objective,
            objective_description=sc.return_word + (" net of interest" if data.borrow_rate else ""),
            sets=tuple(sets),
            params=tuple(params),
            variables=(
                VarDef(
                    "x_a",
                    f"amount allocated to $a$ ({sc.unit})",
                    domain,
                    "spend",
                    ("A",),
                    noun=f"amount ({sc.unit}) to put into each option",
                ),
            ),
            constraints=tuple(constraints),
        )

    def statement(self, data: AllocationData, rng: random.Random) -> str:
        sc = data.scenario
        st = Statement(rng)
        unit = sc.unit
        if data.budget is not None:
            st.add(
                pick(
                    rng,
                    (
                        f"{data.who} is dividing {sc.purpose}: {number(data.budget)} {unit} among {join(data.activities, rng)}.",
                        f"{data.who} has {number(data.budget)} {unit} to allocate across {len(data.activities)} options ({join(data.activities, rng)}).",
                        f"How should {data.who[0].lower() + data.who[1:]} split {number(data.budget)} {unit} between {join(data.activities, rng)}?",
                    ),
                )
            )
            if rng.random() < 0.5:
                st.add("Not all of the money has to be spent.")
        else:
            st.add(
                pick(
                    rng,
                    (
                        f"{data.who} is planning {sc.purpose} among {join(data.activities, rng)}. It has no fixed budget: any amount can be financed with a credit line at {data.borrow_rate:.1%} interest per year.",
                        f"{data.who} funds {sc.purpose} entirely with borrowed money, at an interest rate of {data.borrow_rate:.1%}, and can choose among {join(data.activities, rng)}.",
                    ),
                )
            )

        def shown(value: float) -> str:
            return f"{value:.1%}" if value < 1 else number(value)

        per = (
            f"per {unit.split()[-1][:-1] if unit.endswith('s') else unit}"
            if data.rate and max(data.rate.values()) >= 1
            else "per year"
        )
        st.add(
            present(
                rng,
                ["Activity", f"{capitalize(sc.return_word)} ({per if max(data.rate.values()) >= 1 else 'rate'})"],
                [(a, shown(data.rate[a])) for a in data.activities],
                lambda row: pick(rng, (f"{row[0]} yields {row[1]}", f"each unit put into {row[0]} returns {row[1]}")),
                intro=(f"{capitalize(sc.return_word)} of each option:", "Returns:"),
            )
        )
        if data.hours is not None:
            st.add(
                present(
                    rng,
                    ["Activity", "Staff hours per unit"],
                    [(a, number(data.effort[a])) for a in data.activities],
                    lambda row: (
                        f"{row[0]} needs {row[1]} staff hours per {unit.split()[0]} {' '.join(unit.split()[1:])}".rstrip()
                    ),
                    intro=("Staff time needed:", "Each unit also takes staff time:"),
                )
            )
            st.add(f"The team has {number(data.hours)} staff hours available.")
        for a, low in data.minimum.items():
            st.add(
                pick(
                    rng,
                    (
                        f"At least {number(low)} {unit} must go to {a}.",
                        f"{capitalize(a)} must receive no less than {number(low)} {unit}.",
                    ),
                )
            )
        for a, high in data.maximum.items():
            st.add(
                pick(
                    rng,
                    (
                        f"No more than {number(high)} {unit} may go to {a}.",
                        f"{capitalize(a)} is capped at {number(high)} {unit}.",
                    ),
                )
            )
        if data.group_share:
            st.add(
                pick(
                    rng,
                    (
                        f"At least {data.group_share:.0%} of the total allocated must go to {sc.group_name} ({join(data.group, rng)}).",
                        f"Policy requires that {join(data.group, rng)} together receive at least {data.group_share:.0%} of what is allocated.",
                    ),
                )
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"How much should go to each option to maximize the total {sc.return_word}"
                + (" net of interest?" if data.borrow_rate else "?"),
                f"Find the allocation with the highest {sc.return_word} and state that value.",
                f"What is the maximum {sc.return_word} that can be achieved?",
            ),
        )
        return st.text()

    def decisions(self, data: AllocationData, values: Mapping[str, float]) -> list[str]:
        unit = data.scenario.unit
        lines = []
        for a in data.activities:
            amount_ = values[lp_name("spend", a)]
            if amount_ > 1e-6:
                lines.append(f"Allocate {number(round(amount_, 4))} {unit} to {a}.")
        return lines

    def what_if(self, data: AllocationData, rng: random.Random) -> WhatIf:
        if data.budget is not None and rng.random() < 0.5:
            step = data.scenario.budget_range[2]
            new = scale(data.budget, pick(rng, (0.8, 0.9, 1.1, 1.25)), step=step)
            return WhatIf(
                f"What if the budget were {number(new)} {data.scenario.unit} instead of {number(data.budget)}?",
                replace(data, budget=new),
                "budget",
                data.budget,
                new,
            )
        a = pick(rng, data.activities)
        precision = 3 if data.rate[a] < 1 else 1
        new = round(data.rate[a] * pick(rng, (0.8, 0.9, 1.15, 1.3)), precision)
        if new == data.rate[a]:
            new = round(data.rate[a] + 10**-precision, precision)
        shown = (lambda v: f"{v:.1%}") if data.rate[a] < 1 else number
        return WhatIf(
            f"What if {a} returned {shown(new)} instead of {shown(data.rate[a])}?",
            replace(data, rate={**data.rate, a: new}),
            f"rate[{a}]",
            data.rate[a],
            new,
        )
