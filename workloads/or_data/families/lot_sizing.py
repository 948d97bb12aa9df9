"""Capacitated lot sizing with inventory: decide in which periods to set up production and how
much to make, so demand is met from production and stock at least production, setup and holding
cost (the multi-period inventory balance of Wagner-Whitin, with capacities and a final stock)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, nice, scale
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

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKS = tuple(f"week {k}" for k in range(1, 13))


@dataclass(frozen=True)
class Scenario:
    company: tuple[str, ...]
    product: str
    unit: tuple[str, str]
    integer: bool
    period: str  # "month" | "week"
    demand_range: tuple[int, int]
    unit_cost: tuple[float, float, float]
    setup_cost: tuple[float, float, float]
    holding: tuple[float, float, float]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Toyland Manufacturing", "PlayCraft", "Merry Makers"),
        "wooden toy trains",
        ("unit", "units"),
        True,
        "month",
        (200, 1800),
        (4, 12, 0.5),
        (500, 3000, 50),
        (0.2, 1.5, 0.1),
        (
            "The company sells mostly before the holidays.",
            "Its paint is water-based.",
            "Toys are tested for safety in-house.",
        ),
    ),
    Scenario(
        ("PharmaNova", "MediBatch", "CureLine"),
        "vaccine doses",
        ("thousand doses", "thousand doses"),
        False,
        "month",
        (20, 160),
        (150, 400, 10),
        (5000, 20000, 500),
        (2, 12, 0.5),
        (
            "Doses are stored at -20 °C.",
            "The plant passed an inspection last year.",
            "Batches are tracked with barcodes.",
        ),
    ),
    Scenario(
        ("Hillside Brewery", "Barrelhouse", "Malt & Co"),
        "craft beer",
        ("keg", "kegs"),
        True,
        "week",
        (40, 300),
        (30, 70, 1),
        (200, 1200, 25),
        (0.5, 3, 0.25),
        ("The brewery offers tours on Fridays.", "Kegs are returned for cleaning.", "Hops come from a nearby farm."),
    ),
    Scenario(
        ("ColdChain Foods", "FreshFreeze", "Arctic Meals"),
        "frozen meals",
        ("pallet", "pallets"),
        True,
        "week",
        (10, 80),
        (120, 300, 5),
        (400, 2500, 50),
        (3, 15, 0.5),
        ("Meals are sold in 12 countries.", "The freezer warehouse was expanded in 2021.", "Packaging is recyclable."),
    ),
    Scenario(
        ("PolyChem", "Resin Works", "Plastix"),
        "resin",
        ("ton", "tons"),
        False,
        "month",
        (50, 400),
        (600, 1200, 10),
        (3000, 15000, 250),
        (5, 30, 1),
        ("The plant runs on natural gas.", "Resin ships in 25 kg bags.", "Quality control takes one day."),
    ),
)


@dataclass(frozen=True)
class LotSizingData:
    scenario: Scenario
    company: str
    money: Currency
    periods: tuple[str, ...]
    demand: dict[str, float]
    unit_cost: dict[str, float]
    setup_cost: dict[str, float]
    holding: float  # per unit per period
    capacity: dict[str, float]
    initial: float
    final: float  # stock required at the end
    storage: float | None  # most stock that can be held


class LotSizing(Family):
    name = "lot_sizing"
    title = "Lot sizing and inventory"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        count = rng.randint(4, 7)
        first = rng.randrange(len(MONTHS) - count) if sc.period == "month" else 0
        periods = (MONTHS if sc.period == "month" else WEEKS)[first : first + count]
        step = 10 if sc.demand_range[1] > 500 else 5
        demand = {t: nice(rng, *sc.demand_range, step) for t in periods}
        peak = max(demand.values())
        capacity = {
            t: float(int(peak * rng.uniform(1.0, 1.6) / step + 1) * step) for t in periods
        }  # each period can cover itself
        unit_base = nice(rng, *sc.unit_cost)
        unit_cost = {
            t: float(round(unit_base * rng.uniform(0.9, 1.15) / sc.unit_cost[2]) * sc.unit_cost[2]) for t in periods
        }
        setup = nice(rng, *sc.setup_cost)
        setup_cost = (
            {t: setup for t in periods} if rng.random() < 0.6 else {t: nice(rng, *sc.setup_cost) for t in periods}
        )
        holding = nice(rng, *sc.holding)
        initial = float(int(demand[periods[0]] * rng.uniform(0, 0.6) / step) * step)
        final = float(int(peak * rng.uniform(0, 0.4) / step) * step) if rng.random() < 0.5 else 0.0
        storage = float(int(peak * rng.uniform(1.5, 2.5) / step) * step) if rng.random() < 0.3 else None
        if storage is not None:
            storage = max(storage, final, initial)
        data = LotSizingData(
            sc,
            pick(rng, sc.company),
            currency(rng),
            periods,
            demand,
            unit_cost,
            setup_cost,
            holding,
            capacity,
            initial,
            final,
            storage,
        )
        if status == "infeasible":
            k = rng.randrange(1, len(periods))
            cumulative_capacity = sum(capacity[t] for t in periods[: k + 1])
            spike = periods[k]
            needed_before = sum(demand[t] for t in periods[:k])
            new_demand = float(
                int((cumulative_capacity + initial - needed_before) * rng.uniform(1.1, 1.3) / step + 1) * step
            )
            data = replace(data, demand={**demand, spike: new_demand}, storage=None)
            total_need = needed_before + new_demand
            note = (
                f"by the end of {spike} cumulative demand is {number(total_need)} {sc.unit[1]}, but the opening stock plus all production "
                f"capacity up to then is only {number(initial + cumulative_capacity)}"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: LotSizingData) -> LinearModel:
        b = ModelBuilder("lot_sizing")
        kind = "integer" if data.scenario.integer else "continuous"
        make = {t: b.var(lp_name("make", t), kind) for t in data.periods}
        setup = {t: b.var(lp_name("setup", t), "binary") for t in data.periods}
        last = data.periods[-1]
        stock = {
            t: b.var(lp_name("stock", t), kind, data.final if t == last else 0.0, data.storage) for t in data.periods
        }
        previous = None
        for t in data.periods:
            terms = {make[t]: 1.0, stock[t]: -1.0}
            rhs = data.demand[t]
            if previous is None:
                rhs -= data.initial
            else:
                terms[stock[previous]] = 1.0
            b.row(lp_name("inventory", t), terms, "==", rhs)
            b.row(lp_name("capacity", t), {make[t]: 1.0, setup[t]: -data.capacity[t]}, "<=", 0.0)
            previous = t
        objective = {make[t]: data.unit_cost[t] for t in data.periods}
        objective.update({setup[t]: data.setup_cost[t] for t in data.periods})
        objective.update({stock[t]: data.holding for t in data.periods})
        b.minimize(objective)
        return b.build()

    def program(self, data: LotSizingData) -> str:
        sc = data.scenario
        vtype = "I" if sc.integer else "C"
        body = f'''# make[t]: {sc.unit[1]} produced in period t; setup[t] = 1 when production runs in t
make = {{t: model.addVar(vtype="{vtype}", lb=0, name=f"make[{{t}}]") for t in periods}}
setup = {{t: model.addVar(vtype="B", name=f"setup[{{t}}]") for t in periods}}

# stock[t]: {sc.unit[1]} in stock at the end of period t (the last period keeps the required final stock)
stock = {{
    t: model.addVar(vtype="{vtype}", lb=final_stock if t == periods[-1] else 0, ub=storage_limit, name=f"stock[{{t}}]")
    for t in periods
}}

# inventory: opening stock plus production covers demand plus closing stock
for k, t in enumerate(periods):
    opening = initial_stock if k == 0 else stock[periods[k - 1]]
    model.addCons(opening + make[t] == demand[t] + stock[t], name=f"inventory[{{t}}]")

# capacity: production only in periods with a setup, and at most the capacity
for t in periods:
    model.addCons(make[t] <= capacity[t] * setup[t], name=f"capacity[{{t}}]")

# Objective: minimize production, setup and holding costs
model.setObjective(
    quicksum(unit_cost[t] * make[t] + setup_cost[t] * setup[t] + holding_cost * stock[t] for t in periods),
    sense="minimize",
)
'''
        values = [
            ("periods", list(data.periods)),
            ("demand", data.demand),
            ("capacity", data.capacity),
            ("unit_cost", data.unit_cost),
            ("setup_cost", data.setup_cost),
            ("holding_cost", data.holding),
            ("initial_stock", data.initial),
            ("final_stock", data.final),
            ("storage_limit", data.storage),
        ]
        report = ["for t in periods:", '    show(f"make[{t}]", make[t])', '    show(f"stock[{t}]", stock[t])']
        return assemble("lot_sizing", values, body, report)

    def math_model(self, data: LotSizingData) -> MathModel:
        sc = data.scenario
        domain = r"\in \mathbb{Z}_{\ge 0}" if sc.integer else r"\ge 0"
        params = [
            ParamDef("d_t", f"demand in period $t$ ({sc.unit[1]})", data.demand, ("T",)),
            ParamDef("Q_t", f"production capacity in $t$ ({sc.unit[1]})", data.capacity, ("T",)),
            ParamDef("c_t", f"cost per {sc.unit[0]} produced in $t$ ({data.money.code})", data.unit_cost, ("T",)),
            ParamDef("K_t", f"setup cost in $t$ ({data.money.code})", data.setup_cost, ("T",)),
            ParamDef("h", f"holding cost per {sc.unit[0]} and {sc.period}", data.holding),
            ParamDef("I_0", "opening stock", data.initial),
            ParamDef("I_{end}", "stock required after the last period", data.final),
        ]
        stock_domain = domain + r", \; I_{|T|} \ge I_{end}"
        if data.storage is not None:
            params.append(ParamDef("U", "storage capacity", data.storage))
            stock_domain += r", \; I_t \le U"
        return MathModel(
            title="Capacitated lot-sizing model",
            sense="minimize",
            objective=r"\sum_{t \in T} \left( c_t x_t + K_t y_t + h I_t \right)",
            objective_description="production, setup and holding cost",
            sets=(SetDef("T", "t", f"{sc.period}s, in order", data.periods),),
            params=tuple(params),
            variables=(
                VarDef(
                    "x_t",
                    f"{sc.unit[1]} produced in $t$",
                    domain,
                    "make",
                    ("T",),
                    noun=f"{sc.unit[1]} to produce in each {sc.period}",
                    whole=f"only whole {sc.unit[1]} are made" if sc.integer else "",
                ),
                VarDef(
                    "y_t",
                    "1 if production is set up in $t$",
                    r"\in \{0, 1\}",
                    "setup",
                    ("T",),
                    indicator=f"whether to set up production in each {sc.period}",
                ),
                VarDef(
                    "I_t",
                    "stock at the end of $t$",
                    stock_domain,
                    "stock",
                    ("T",),
                    noun=f"{sc.unit[1]} in stock at the end of each {sc.period}",
                    whole=f"stock is counted in whole {sc.unit[1]}" if sc.integer else "",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Inventory balance",
                    "opening stock plus production meets demand and closing stock",
                    r"I_{t-1} + x_t = d_t + I_t",
                    "inventory",
                    ("T",),
                    why=f"[what is on hand at the start of a {sc.period} plus what is made|the opening stock of a "
                    f"{sc.period} plus its production] must cover that {sc.period}'s demand, and [whatever is left is "
                    f"carried over|what remains is carried into the next {sc.period}]; [this links the periods "
                    "together|this is what ties the periods to each other]",
                ),
                ConstraintDef(
                    "Setup and capacity",
                    "production needs a setup and respects capacity",
                    r"x_t \le Q_t y_t",
                    "capacity",
                    ("T",),
                    why=f"production is limited by the plant's capacity and happens only in a {sc.period} that [pays the "
                    "setup cost|carries a setup]",
                    technique="[This is a big-M style linking constraint with the capacity as M|The row is a big-M link "
                    "whose M is the capacity]: when the setup indicator is 0 the right-hand side is 0 and nothing can "
                    "be made; when it is 1 the full capacity is available. [Since capacity bounds production anyway, "
                    "this M never cuts off a feasible plan|Production can never exceed capacity, so this M removes no "
                    "feasible plan]; a smaller M, such as the demand still to come when it is below capacity, would "
                    "tighten the LP relaxation further.",
                ),
            ),
        )

    def statement(self, data: LotSizingData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.company} makes {sc.product} and plans production for the next {len(data.periods)} {sc.period}s ({data.periods[0]} to {data.periods[-1]}).",
                    f"{data.company} needs a production plan for {sc.product} covering {', '.join(data.periods[:-1])} and {data.periods[-1]}.",
                    f"Demand for {data.company}'s {sc.product} varies from {sc.period} to {sc.period}, and producing in small batches is expensive because of setups.",
                    f"The planner at {data.company} must decide when to run the {sc.product} line over a horizon of {len(data.periods)} {sc.period}s.",
                ),
            )
        )
        st.add(
            present(
                rng,
                [
                    capitalize(sc.period),
                    f"Demand ({sc.unit[1]})",
                    f"Capacity ({sc.unit[1]})",
                    f"Cost per {sc.unit[0]}",
                    "Setup cost",
                ],
                [
                    (
                        t,
                        number(data.demand[t]),
                        number(data.capacity[t]),
                        money(data.unit_cost[t]),
                        money(data.setup_cost[t]),
                    )
                    for t in data.periods
                ],
                lambda row: pick(
                    rng,
                    (
                        f"in {row[0]} demand is {row[1]} {sc.unit[1]}, at most {row[2]} can be made at {row[3]} each, and running production costs {row[4]} to set up",
                        f"{row[0]}: demand {row[1]}, capacity {row[2]}, unit cost {row[3]}, setup {row[4]}",
                        f"customers need {row[1]} {sc.unit[1]} in {row[0]}; the line can make up to {row[2]} that {sc.period} at {row[3]} per {sc.unit[0]}, after a setup costing {row[4]}",
                    ),
                ),
                intro=(
                    f"Data per {sc.period}:",
                    "The plan must respect the following figures:",
                    f"Forecast and costs by {sc.period}:",
                ),
            )
        )
        st.add(
            pick(
                rng,
                (
                    f"A setup cost is paid in every {sc.period} in which anything is produced. Units kept in stock from one {sc.period} to the next cost {money(data.holding)} per {sc.unit[0]} per {sc.period} (charged on the closing stock).",
                    f"Producing in a {sc.period} requires a setup, which costs the amount shown. Holding inventory costs {money(data.holding)} per {sc.unit[0]} for each {sc.period} it is kept, based on end-of-{sc.period} stock.",
                ),
            )
        )
        st.add(
            f"There {'are' if data.initial != 1 else 'is'} {amount(data.initial, sc.unit)} in stock at the start."
            if data.initial
            else "The warehouse is empty at the start."
        )
        if data.final:
            st.add(
                pick(
                    rng,
                    (
                        f"At least {amount(data.final, sc.unit)} must remain in stock after {data.periods[-1]}.",
                        f"The plan must end with a safety stock of {amount(data.final, sc.unit)}.",
                    ),
                )
            )
        if data.storage is not None:
            st.add(f"The warehouse holds at most {amount(data.storage, sc.unit)}.")
        st.add(
            pick(
                rng,
                (
                    "Demand must be met on time; backorders are not allowed.",
                    "All demand has to be met in the period it occurs.",
                ),
            )
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"In which {sc.period}s should production run, and how much should be made, to minimize total cost?",
                "Find the cost-minimizing production plan and its total cost.",
                f"What is the minimum total cost of production, setups and inventory over the {len(data.periods)} {sc.period}s?",
            ),
        )
        return st.text()

    def decisions(self, data: LotSizingData, values: Mapping[str, float]) -> list[str]:
        unit = data.scenario.unit
        lines = []
        for t in data.periods:
            made, kept = values[lp_name("make", t)], values[lp_name("stock", t)]
            if made > 1e-6:
                lines.append(f"{capitalize(t)}: make {amount(made, unit)}, end with {amount(kept, unit)} in stock.")
            else:
                lines.append(f"{capitalize(t)}: no production, end with {amount(kept, unit)} in stock.")
        return lines

    def what_if(self, data: LotSizingData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        choice = rng.randrange(3)
        if choice == 0:
            new = scale(data.holding, pick(rng, (0.5, 2.0, 3.0)), integer=False, step=sc.holding[2])
            return WhatIf(
                f"What if holding stock cost {data.money(new)} per {sc.unit[0]} per {sc.period} instead of {data.money(data.holding)}?",
                replace(data, holding=new),
                "holding_cost",
                data.holding,
                new,
            )
        t = pick(rng, data.periods)
        if choice == 1:
            new = scale(data.setup_cost[t], pick(rng, (0.5, 1.5, 2.0)), step=sc.setup_cost[2])
            return WhatIf(
                f"What if a setup in {t} cost {data.money(new)} instead of {data.money(data.setup_cost[t])}?",
                replace(data, setup_cost={**data.setup_cost, t: new}),
                f"setup_cost[{t}]",
                data.setup_cost[t],
                new,
            )
        new = scale(data.demand[t], pick(rng, (0.8, 1.15, 1.3)))
        return WhatIf(
            f"What if demand in {t} were {number(new)} {sc.unit[1]} instead of {number(data.demand[t])}?",
            replace(data, demand={**data.demand, t: new}),
            f"demand[{t}]",
            data.demand[t],
            new,
        )
