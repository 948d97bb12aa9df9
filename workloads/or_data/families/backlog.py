"""Aggregate production planning with backlog: regular time, overtime, inventory and late
deliveries over several periods. Unlike lot sizing (`lot_sizing`), demand may be served late at a
penalty per unit and period, up to a backlog limit, but every order must be served by the end of
the horizon. The balance row carries both stock and backlog from one period to the next
(the classic aggregate-planning LP, e.g. Nahmias, "Production and Operations Analysis", ch. 3).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, nice, scale
from trex.workloads.or_data.families.lot_sizing import MONTHS, WEEKS
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, lp_name
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import (
    Currency,
    Statement,
    amount,
    capitalize,
    currency,
    generic_distractors,
    number,
    pick,
    present,
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Scenario:
    company: tuple[str, ...]
    product: str
    unit: tuple[str, str]
    integer: bool
    period: str  # "month" | "week"
    demand_range: tuple[int, int]
    regular_cost: tuple[float, float, float]  # low, high, step
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Nordic Bikes", "Velora", "PedalWorks"),
        "e-bikes",
        ("bike", "bikes"),
        True,
        "month",
        (80, 400),
        (300, 520, 10),
        ("Frames are welded in-house.", "The brand sponsors a cycling team.", "Batteries come from two suppliers."),
    ),
    Scenario(
        ("Brightline Furniture", "OakCraft", "Sitwell"),
        "office chairs",
        ("chair", "chairs"),
        True,
        "month",
        (150, 900),
        (60, 140, 5),
        ("The showroom opened last spring.", "Fabric comes in twelve colours.", "Chairs ship flat-packed."),
    ),
    Scenario(
        ("Aurora Printworks", "PageHouse", "InkLine"),
        "printed catalogues",
        ("thousand copies", "thousand copies"),
        False,
        "week",
        (20, 120),
        (40, 90, 1),
        ("The press runs on recycled paper.", "Catalogues are bound in-house.", "The plant has two loading docks."),
    ),
    Scenario(
        ("Cascade Foods", "GreenJar", "Harvest Line"),
        "canned soup",
        ("pallet", "pallets"),
        True,
        "week",
        (30, 160),
        (180, 320, 5),
        ("Labels are printed locally.", "Cans are made of recycled steel.", "The canning line was upgraded in 2020."),
    ),
    Scenario(
        ("Helix Components", "Torq Industries", "MetaForm"),
        "gear boxes",
        ("unit", "units"),
        True,
        "month",
        (100, 600),
        (150, 400, 10),
        ("Castings are sourced abroad.", "The firm holds an ISO 9001 certificate.", "Gear teeth are ground to order."),
    ),
)


@dataclass(frozen=True)
class BacklogData:
    scenario: Scenario
    company: str
    money: Currency
    periods: tuple[str, ...]
    demand: dict[str, float]
    regular_cap: dict[str, float]
    overtime_cap: dict[str, float]
    regular_cost: float  # per unit
    overtime_cost: float
    holding: float  # per unit left in stock at the end of a period
    penalty: float  # per unit owed at the end of a period
    initial: float
    max_backlog: float  # most units owed at any period end


class BacklogPlanning(Family):
    name = "backlog_planning"
    title = "Production planning with backlog"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        count = rng.randint(4, 8)
        first = rng.randrange(len(MONTHS) - count) if sc.period == "month" else 0
        periods = (MONTHS if sc.period == "month" else WEEKS)[first : first + count]
        step = 10 if sc.demand_range[1] > 300 else 5
        demand = {t: nice(rng, *sc.demand_range, step) for t in periods}
        mean = sum(demand.values()) / len(periods)
        # regular time alone falls short of the peaks: overtime, stock built ahead or backlog fill the gap
        regular_cap = {t: float(int(mean * rng.uniform(0.75, 1.0) / step + 1) * step) for t in periods}
        overtime_cap = {t: float(int(regular_cap[t] * rng.uniform(0.15, 0.35) / step + 1) * step) for t in periods}
        regular_cost = nice(rng, *sc.regular_cost)
        step_cost = sc.regular_cost[2]
        overtime_cost = float(round(regular_cost * rng.uniform(1.25, 1.6) / step_cost) * step_cost)
        holding = float(round(regular_cost * rng.uniform(0.02, 0.08) / step_cost) * step_cost) or step_cost
        penalty = float(round(regular_cost * rng.uniform(0.1, 0.3) / step_cost) * step_cost) or step_cost
        initial = float(int(demand[periods[0]] * rng.uniform(0, 0.4) / step) * step)
        max_backlog = float(int(mean * rng.uniform(0.3, 0.8) / step + 1) * step)
        data = BacklogData(
            sc,
            pick(rng, sc.company),
            currency(rng),
            periods,
            demand,
            regular_cap,
            overtime_cap,
            regular_cost,
            overtime_cost,
            holding,
            penalty,
            initial,
            max_backlog,
        )
        total_capacity = sum(regular_cap[t] + overtime_cap[t] for t in periods)
        if status == "infeasible":  # the horizon's demand exceeds stock plus every hour of capacity
            last = periods[-1]
            shortfall = total_capacity + initial - sum(demand.values())
            new = demand[last] + max(step, float(int(shortfall * rng.uniform(1.05, 1.3) / step + 1) * step))
            data = replace(data, demand={**demand, last: new})
            need = sum(data.demand.values())
            note = (
                f"over the {len(periods)} {sc.period}s demand totals {number(need)} {sc.unit[1]}, but opening "
                "stock plus "
                f"all regular and overtime capacity comes to only {number(total_capacity + initial)}, and nothing may "
                f"still be owed after {last}"
            )
            return Generated(data, "infeasible", note)
        if total_capacity + initial < sum(demand.values()) + step:  # keep optimal instances feasible
            extra = sum(demand.values()) + step - total_capacity - initial
            data = replace(data, overtime_cap={**overtime_cap, periods[0]: overtime_cap[periods[0]] + extra})
        # no prefix of the horizon may owe more than the backlog limit even at full output
        supplied, needed, worst = data.initial, 0.0, 0.0
        for t in periods:
            supplied += data.regular_cap[t] + data.overtime_cap[t]
            needed += data.demand[t]
            worst = max(worst, needed - supplied)
        if worst > data.max_backlog:
            data = replace(data, max_backlog=float(int(worst / step + 1) * step))
        return Generated(data, "optimal")

    def linear_model(self, data: BacklogData) -> LinearModel:
        b = ModelBuilder("backlog_planning")
        kind = "integer" if data.scenario.integer else "continuous"
        regular = {t: b.var(lp_name("regular", t), kind, 0.0, data.regular_cap[t]) for t in data.periods}
        overtime = {t: b.var(lp_name("overtime", t), kind, 0.0, data.overtime_cap[t]) for t in data.periods}
        stock = {t: b.var(lp_name("stock", t), kind) for t in data.periods}
        last = data.periods[-1]
        backlog = {
            t: b.var(lp_name("backlog", t), kind, 0.0, 0.0 if t == last else data.max_backlog) for t in data.periods
        }
        previous = None
        for t in data.periods:
            terms = {regular[t]: 1.0, overtime[t]: 1.0, stock[t]: -1.0, backlog[t]: 1.0}
            rhs = data.demand[t]
            if previous is None:
                rhs -= data.initial
            else:
                terms[stock[previous]] = 1.0
                terms[backlog[previous]] = -1.0
            b.row(lp_name("balance", t), terms, "==", rhs)
            previous = t
        objective = {regular[t]: data.regular_cost for t in data.periods}
        objective.update({overtime[t]: data.overtime_cost for t in data.periods})
        objective.update({stock[t]: data.holding for t in data.periods})
        objective.update({backlog[t]: data.penalty for t in data.periods})
        b.minimize(objective)
        return b.build()

    def program(self, data: BacklogData) -> str:
        sc = data.scenario
        vtype = "I" if sc.integer else "C"
        body = f'''# regular[t], overtime[t]: {sc.unit[1]} made in t on regular time and on overtime, within capacity
regular = {{t: model.addVar(vtype="{vtype}", lb=0, ub=regular_cap[t], name=f"regular[{{t}}]") for t in periods}}
overtime = {{t: model.addVar(vtype="{vtype}", lb=0, ub=overtime_cap[t], name=f"overtime[{{t}}]") for t in periods}}

# stock[t]: {sc.unit[1]} on hand at the end of t; backlog[t]: {sc.unit[1]} still owed then (none after the last period)
stock = {{t: model.addVar(vtype="{vtype}", lb=0, name=f"stock[{{t}}]") for t in periods}}
backlog = {{
    t: model.addVar(vtype="{vtype}", lb=0, ub=0 if t == periods[-1] else max_backlog, name=f"backlog[{{t}}]")
    for t in periods
}}

# balance: what is carried in plus what is made serves this period's demand and what is carried out
for k, t in enumerate(periods):
    carried_in = initial_stock if k == 0 else stock[periods[k - 1]] - backlog[periods[k - 1]]
    model.addCons(carried_in + regular[t] + overtime[t] == demand[t] + stock[t] - backlog[t], name=f"balance[{{t}}]")

# Objective: minimize production, overtime, holding and late-delivery costs
model.setObjective(
    quicksum(
        regular_cost * regular[t] + overtime_cost * overtime[t] + holding_cost * stock[t] + backlog_penalty * backlog[t]
        for t in periods
    ),
    sense="minimize",
)
'''
        values = [
            ("periods", list(data.periods)),
            ("demand", data.demand),
            ("regular_cap", data.regular_cap),
            ("overtime_cap", data.overtime_cap),
            ("regular_cost", data.regular_cost),
            ("overtime_cost", data.overtime_cost),
            ("holding_cost", data.holding),
            ("backlog_penalty", data.penalty),
            ("initial_stock", data.initial),
            ("max_backlog", data.max_backlog),
        ]
        report = [
            "for t in periods:",
            '    show(f"regular[{t}]", regular[t])',
            '    show(f"overtime[{t}]", overtime[t])',
            '    show(f"stock[{t}]", stock[t])',
            '    show(f"backlog[{t}]", backlog[t])',
        ]
        return assemble("backlog_planning", values, body, report)

    def math_model(self, data: BacklogData) -> MathModel:
        sc, code = data.scenario, data.money.code
        domain = r"\in \mathbb{Z}_{\ge 0}" if sc.integer else r"\ge 0"
        whole = f"{sc.unit[1]} are made and delivered whole" if sc.integer else ""
        return MathModel(
            title="Aggregate planning model with backlog",
            sense="minimize",
            objective=r"\sum_{t \in T} \left( c x_t + o z_t + h I_t + p B_t \right)",
            objective_description="production, overtime, holding and late-delivery cost",
            sets=(SetDef("T", "t", f"{sc.period}s, in order", data.periods),),
            params=(
                ParamDef("d_t", f"demand in period $t$ ({sc.unit[1]})", data.demand, ("T",)),
                ParamDef("R_t", f"regular-time capacity in $t$ ({sc.unit[1]})", data.regular_cap, ("T",)),
                ParamDef("V_t", f"overtime capacity in $t$ ({sc.unit[1]})", data.overtime_cap, ("T",)),
                ParamDef("c", f"cost per {sc.unit[0]} on regular time ({code})", data.regular_cost),
                ParamDef("o", f"cost per {sc.unit[0]} on overtime ({code})", data.overtime_cost),
                ParamDef("h", f"holding cost per {sc.unit[0]} left at the end of a {sc.period} ({code})", data.holding),
                ParamDef("p", f"penalty per {sc.unit[0]} owed at the end of a {sc.period} ({code})", data.penalty),
                ParamDef("I_0", "opening stock", data.initial),
                ParamDef("\\bar{B}", "most units that may be owed at a period end", data.max_backlog),
            ),
            variables=(
                VarDef(
                    "x_t",
                    "made on regular time in $t$",
                    domain + r", \; x_t \le R_t",
                    "regular",
                    ("T",),
                    noun=f"{sc.unit[1]} to make on regular time in each {sc.period}",
                    whole=whole,
                ),
                VarDef(
                    "z_t",
                    "made on overtime in $t$",
                    domain + r", \; z_t \le V_t",
                    "overtime",
                    ("T",),
                    noun=f"{sc.unit[1]} to make on overtime in each {sc.period}",
                    whole=whole,
                ),
                VarDef(
                    "I_t",
                    "stock at the end of $t$",
                    domain,
                    "stock",
                    ("T",),
                    noun=f"{sc.unit[1]} to keep in stock at the end of each {sc.period}",
                    whole=whole,
                ),
                VarDef(
                    "B_t",
                    "owed at the end of $t$",
                    domain + r", \; B_t \le \bar{B}, \; B_{|T|} = 0",
                    "backlog",
                    ("T",),
                    noun=f"{sc.unit[1]} to leave owed at the end of each {sc.period}",
                    whole=whole,
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Balance",
                    "carried-in stock minus backlog plus production meets demand and the carried-out position",
                    r"I_{t-1} - B_{t-1} + x_t + z_t = d_t + I_t - B_t",
                    "balance",
                    ("T",),
                    why=f"every {sc.unit[0]} demanded in a {sc.period} is served [from stock, from that {sc.period}'s "
                    f"production or later|from stock, from what is made that {sc.period}, or late], and [whatever is "
                    "served late stays on the books as backlog until it is made|an order served late is carried as "
                    "backlog until production catches up|late orders stay open as backlog until they are filled]",
                    technique="[Stock and backlog both enter the balance with opposite signs, so one row tracks the net "
                    "position|Stock enters the balance with one sign and backlog with the other, so a single row keeps "
                    "the net position]; since [holding and the late penalty both cost money|carrying stock and serving "
                    "late are both charged], the optimum never [carries stock and backlog in the same period|holds "
                    "stock in a period while orders of that period are still late].",
                ),
            ),
        )

    def statement(self, data: BacklogData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        n, period, units = len(data.periods), sc.period, sc.unit[1]
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.company} builds {sc.product} and needs a production plan for the next {n} {period}s "
                    f"({data.periods[0]} to {data.periods[-1]}).",
                    f"Orders for {data.company}'s {sc.product} swing from {period} to {period}, and the plant cannot "
                    "always keep up on regular time.",
                    f"The operations manager at {data.company} has to balance overtime, inventory and late deliveries "
                    f"of {sc.product} over {n} {period}s.",
                    f"{data.company} may deliver some {sc.product} late, at a price, when a {period} is too busy.",
                    f"Over a horizon of {n} {period}s, {data.company} must decide how many {units} to make on regular "
                    "time and on overtime.",
                    f"Planning {sc.product} at {data.company}: demand is known for {data.periods[0]} through "
                    f"{data.periods[-1]}, capacity is not always enough.",
                    f"In the {sc.product} plant of {data.company}, busy {period}s can be covered by overtime, by stock "
                    "built earlier, or by serving customers late.",
                ),
            )
        )
        st.add(
            present(
                rng,
                [
                    capitalize(period),
                    f"Demand ({units})",
                    f"Regular capacity ({units})",
                    f"Overtime capacity ({units})",
                ],
                [
                    (t, number(data.demand[t]), number(data.regular_cap[t]), number(data.overtime_cap[t]))
                    for t in data.periods
                ],
                lambda row: pick(
                    rng,
                    (
                        f"in {row[0]} customers order {row[1]} {units}, and the plant can make {row[2]} on regular "
                        f"time plus {row[3]} on overtime",
                        f"{row[0]}: demand {row[1]}, regular capacity {row[2]}, overtime capacity {row[3]}",
                        f"{row[0]} brings orders for {row[1]} {units}; regular shifts can produce up to {row[2]} and "
                        f"overtime up to {row[3]} more",
                    ),
                ),
                intro=(f"Per {period}:", "The figures for the horizon are:", f"Demand and capacity by {period}:"),
            )
        )
        costs = (
            f"Each {sc.unit[0]} costs {money(data.regular_cost)} on regular time and {money(data.overtime_cost)} on "
            f"overtime. Keeping a {sc.unit[0]} in stock past the end of a {period} costs {money(data.holding)}, and "
            f"every {sc.unit[0]} still owed to a customer at the end of a {period} costs {money(data.penalty)} in "
            "penalties and discounts.",
            f"Regular production costs {money(data.regular_cost)} per {sc.unit[0]}, overtime "
            f"{money(data.overtime_cost)}. "
            f"Stock held past the end of a {period} costs {money(data.holding)} per {sc.unit[0]}; an order "
            "served late costs "
            f"{money(data.penalty)} per {sc.unit[0]} for each {period} of delay.",
        )
        st.add(pick(rng, costs))
        st.add(
            f"The warehouse holds {amount(data.initial, sc.unit)} at the start."
            if data.initial
            else "No stock is on hand at the start."
        )
        st.add(
            pick(
                rng,
                (
                    f"At most {amount(data.max_backlog, sc.unit)} may be owed at the end of any {period}, and every "
                    f"order must be delivered by the end of {data.periods[-1]}.",
                    f"Customers accept late delivery for up to {amount(data.max_backlog, sc.unit)} in total at a time, "
                    f"but nothing may still be owed after {data.periods[-1]}.",
                ),
            )
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"How many {units} should be made on regular time and on overtime each {period}, to minimize "
                "total cost?",
                "Find the plan of regular production, overtime, stock and backlog with the lowest total cost.",
                f"What is the minimum total cost over the {n} {period}s, and which plan reaches it?",
                f"Plan production for every {period} so that all orders are served at the least total cost.",
                "Which production plan minimizes the sum of production, overtime, holding and lateness costs?",
                f"Determine regular and overtime output per {period} with the smallest total cost.",
            ),
        )
        return st.text()

    def decisions(self, data: BacklogData, values: Mapping[str, float]) -> list[str]:
        unit = data.scenario.unit
        lines = []
        for t in data.periods:
            regular, overtime = values[lp_name("regular", t)], values[lp_name("overtime", t)]
            stock, owed = values[lp_name("stock", t)], values[lp_name("backlog", t)]
            made = f"make {amount(regular, unit)} on regular time" if regular > 1e-6 else "no regular production"
            if overtime > 1e-6:
                made += f" and {amount(overtime, unit)} on overtime"
            if owed > 1e-6:
                position = f"{amount(owed, unit)} still owed at the end"
            else:
                position = f"end with {amount(stock, unit)} in stock"
            lines.append(f"{capitalize(t)}: {made}; {position}.")
        return lines

    def what_if(self, data: BacklogData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        step = sc.regular_cost[2]
        choice = rng.randrange(3)
        if choice == 0:
            new = scale(data.penalty, pick(rng, (0.5, 2.0, 3.0)), integer=False, step=step)
            return WhatIf(
                f"What if each {sc.unit[0]} owed at a {sc.period} end cost {data.money(new)} instead of "
                f"{data.money(data.penalty)}?",
                replace(data, penalty=new),
                "backlog_penalty",
                data.penalty,
                new,
            )
        if choice == 1:
            new = scale(data.overtime_cost, pick(rng, (0.85, 1.2, 1.4)), integer=False, step=step)
            return WhatIf(
                f"What if overtime cost {data.money(new)} per {sc.unit[0]} instead of "
                f"{data.money(data.overtime_cost)}?",
                replace(data, overtime_cost=new),
                "overtime_cost",
                data.overtime_cost,
                new,
            )
        t = pick(rng, data.periods[:-1])
        new = scale(data.demand[t], pick(rng, (0.8, 1.1, 1.2)))
        return WhatIf(
            f"What if demand in {t} were {number(new)} {sc.unit[1]} instead of {number(data.demand[t])}?",
            replace(data, demand={**data.demand, t: new}),
            f"demand[{t}]",
            data.demand[t],
            new,
        )
