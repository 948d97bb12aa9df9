"""Buying under tiered (piecewise-linear, convex) prices: cover a requirement from several
sources whose unit price rises in steps with the volume taken, honouring minimum commitments.

The piecewise-linear cost of each source is modelled by one bounded variable per price tier.
Because prices rise from tier to tier the cost is convex, and a minimizing LP fills the cheaper
tier of a source before the dearer one on its own: no binary variables are needed (with
quantity discounts, falling prices, they would be; Williams, "Model Building in Mathematical
Programming", sec. 9.3).
"""

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
    join,
    number,
    pick,
    present,
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Scenario:
    buyer: tuple[str, ...]
    commodity: str
    need: str  # what the requirement is for
    source_kind: tuple[str, str]  # ("supplier", "suppliers")
    sources: tuple[str, ...]
    unit: tuple[str, str]
    requirement_range: tuple[int, int]
    price_range: tuple[float, float, float]  # first-tier price: low, high, step
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Riverside Data Center", "CloudNest", "Polar Compute"),
        "electricity",
        "next month's load",
        ("supply contract", "supply contracts"),
        ("North Grid", "SolarPark East", "WindCo", "City Utility", "HydroLink", "Baseload Partners"),
        ("MWh", "MWh"),
        (400, 1600),
        (40, 70, 1),
        ("The site uses free cooling in winter.", "Its racks are refreshed every four years."),
    ),
    Scenario(
        ("Ferro Steelworks", "Anvil Metals", "Castell Foundry"),
        "steel scrap",
        "the next campaign of the electric furnace",
        ("scrap dealer", "scrap dealers"),
        ("Metro Recycling", "Dockside Scrap", "Rail Salvage", "Harbor Metals", "Valley Scrap", "Auto Shredders"),
        ("ton", "tons"),
        (300, 1200),
        (180, 260, 5),
        ("The furnace was relined last year.", "Scrap arrives by rail and by truck."),
    ),
    Scenario(
        ("Lakeview Water Board", "Springfield Utilities", "Aqua Valley"),
        "raw water",
        "the coming dry month",
        ("water source", "water sources"),
        ("Upper Reservoir", "River Intake", "Well Field A", "Well Field B", "Neighbour Utility", "Desalination Plant"),
        ("megaliter", "megaliters"),
        (200, 900),
        (30, 80, 1),
        ("The treatment plant runs around the clock.", "Meters are read remotely."),
    ),
    Scenario(
        ("GreenLeaf Dairy", "Alpine Creamery", "Meadow Milk"),
        "milk",
        "next week's cheese production",
        ("farm cooperative", "farm cooperatives"),
        (
            "Hilltop Coop",
            "Riverbend Farms",
            "Oak Valley Coop",
            "Sunrise Dairy Farms",
            "Northfield Coop",
            "Lakeside Farms",
        ),
        ("thousand liters", "thousand liters"),
        (150, 700),
        (350, 520, 5),
        ("Cheese ripens for at least three months.", "Milk is collected twice a day."),
    ),
)


@dataclass(frozen=True)
class TierData:
    scenario: Scenario
    buyer: str
    money: Currency
    sources: tuple[str, ...]
    tiers: dict[str, tuple[tuple[float, float], ...]]  # source -> ((width, unit price), ...), prices rising
    requirement: float
    commitment: dict[str, float]  # minimum purchase per source (only some sources)

    def tier_keys(self) -> list[tuple[str, int]]:
        return [(s, k + 1) for s in self.sources for k in range(len(self.tiers[s]))]


class PiecewiseCosts(Family):
    name = "piecewise_costs"
    title = "Purchasing with piecewise-linear costs"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        sources = tuple(rng.sample(sc.sources, rng.randint(3, 5)))
        requirement = nice(rng, *sc.requirement_range, 10)
        low, high, step = sc.price_range
        tiers: dict[str, tuple[tuple[float, float], ...]] = {}
        for s in sources:
            price = nice(rng, low, high, step)
            levels = []
            for _ in range(rng.randint(2, 3)):
                width = float(int(requirement * rng.uniform(0.12, 0.35) / 10 + 1) * 10)
                levels.append((width, price))
                price = float(round(price * rng.uniform(1.1, 1.45) / step) * step)
            tiers[s] = tuple(levels)
        total = sum(width for s in sources for width, _ in tiers[s])
        if total < requirement * 1.1:  # enough capacity in the tiers for an optimal instance
            last = sources[-1]
            width, price = tiers[last][-1]
            tiers[last] = (*tiers[last][:-1], (width + float(int((requirement * 1.1 - total) / 10 + 1) * 10), price))
        committed = rng.sample(sources, rng.randint(0, 2))
        commitment = {s: float(int(tiers[s][0][0] * rng.uniform(0.5, 1.4) / 10) * 10) or 10.0 for s in committed}
        data = TierData(sc, pick(rng, sc.buyer), currency(rng), sources, tiers, requirement, commitment)
        if status == "infeasible":  # the requirement exceeds everything the tiers can deliver
            total = sum(width for s in sources for width, _ in tiers[s])
            new = float(int(total * rng.uniform(1.05, 1.25) / 10 + 1) * 10)
            data = replace(data, requirement=new)
            note = (
                f"{number(new)} {sc.unit[1]} are required, but all price tiers of all {sc.source_kind[1]} together "
                f"offer only {number(total)}"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: TierData) -> LinearModel:
        b = ModelBuilder("piecewise_costs")
        buy = {
            (s, k): b.var(lp_name("buy", s, k), "continuous", 0.0, data.tiers[s][k - 1][0]) for s, k in data.tier_keys()
        }
        b.row("demand", {buy[key]: 1.0 for key in data.tier_keys()}, ">=", data.requirement)
        for s, minimum in data.commitment.items():
            b.row(lp_name("commitment", s), {buy[key]: 1.0 for key in data.tier_keys() if key[0] == s}, ">=", minimum)
        b.minimize({buy[s, k]: data.tiers[s][k - 1][1] for s, k in data.tier_keys()})
        return b.build()

    def program(self, data: TierData) -> str:
        sc = data.scenario
        body = f"""# buy[s, k]: {sc.unit[1]} bought from source s in its price tier k, at most the tier's size
buy = {{(s, k): model.addVar(vtype="C", lb=0, ub=tier_size[s, k], name=f"buy[{{s}},{{k}}]") for (s, k) in tier_price}}

# demand: the purchases cover the requirement
model.addCons(quicksum(buy[s, k] for (s, k) in tier_price) >= requirement, name="demand")

# commitment: each contracted minimum is taken
for c in commitment:
    model.addCons(quicksum(buy[s, k] for (s, k) in tier_price if s == c) >= commitment[c], name=f"commitment[{{c}}]")

# Objective: minimize the purchase cost (tier prices rise, so cheaper tiers fill first)
model.setObjective(quicksum(tier_price[s, k] * buy[s, k] for (s, k) in tier_price), sense="minimize")
"""
        values = [
            ("sources", list(data.sources)),
            ("tier_size", {key: data.tiers[key[0]][key[1] - 1][0] for key in data.tier_keys()}),
            ("tier_price", {key: data.tiers[key[0]][key[1] - 1][1] for key in data.tier_keys()}),
            ("requirement", data.requirement),
            ("commitment", data.commitment),
        ]
        report = ["for (s, k), var in buy.items():", '    show(f"buy[{s}, {k}]", var)']
        return assemble("piecewise_costs", values, body, report)

    def math_model(self, data: TierData) -> MathModel:
        sc, code = data.scenario, data.money.code
        keys = data.tier_keys()
        constraints = [
            ConstraintDef(
                "Demand",
                "the purchases cover the requirement",
                r"\sum_{(s,k) \in A} y_{sk} \ge D",
                "demand",
                why=f"the {sc.commodity} for {sc.need} must all be bought; [buying more would only cost money|buying "
                "more than needed only adds cost]",
                technique="[The piecewise-linear price of a source is linearised with one variable per price tier, "
                "bounded by the tier's size|Each source's piecewise-linear price becomes linear with one variable per "
                "price tier, bounded by the tier's size]. Because each tier is dearer than the one before (a convex "
                "cost), the minimization fills a cheaper tier before a dearer one by itself, so no binary variables "
                "are needed to keep the tiers in order; [falling prices (quantity discounts) would need them|with "
                "quantity discounts (falling prices) they would be needed].",
            )
        ]
        sets = [
            SetDef("S", "s", sc.source_kind[1], data.sources),
            SetDef(
                "K",
                "k",
                "tier numbers (1 is the cheapest tier of a source)",
                tuple(str(k) for k in sorted({k for _, k in keys})),
                member="tier",
            ),
            SetDef("A", "(s,k)", "price tiers (source, tier number)", tuple(f"({s}, {k})" for s, k in keys)),
        ]
        params = [
            ParamDef("D", f"requirement ({sc.unit[1]})", data.requirement),
            ParamDef(
                "w_{sk}",
                f"size of tier $k$ of source $s$ ({sc.unit[1]})",
                {f"({s}, {k})": data.tiers[s][k - 1][0] for s, k in keys},
                ("A",),
            ),
            ParamDef(
                "p_{sk}",
                f"price per {sc.unit[0]} in tier $k$ of source $s$ ({code})",
                {f"({s}, {k})": data.tiers[s][k - 1][1] for s, k in keys},
                ("A",),
            ),
        ]
        if data.commitment:
            sets.append(SetDef("C", "c", f"{sc.source_kind[1]} with a minimum commitment", tuple(data.commitment)))
            params.append(ParamDef("m_c", f"committed minimum from $c$ ({sc.unit[1]})", data.commitment, ("C",)))
            constraints.append(
                ConstraintDef(
                    "Commitment",
                    "each contracted minimum is taken",
                    r"\sum_{k: (c,k) \in A} y_{ck} \ge m_c",
                    "commitment",
                    ("C",),
                    why="the contracts oblige the buyer to take at least the agreed volume from these sources, "
                    "[even where another source is cheaper|whether or not another source is cheaper]",
                )
            )
        return MathModel(
            title="Piecewise-linear purchasing model",
            sense="minimize",
            objective=r"\sum_{(s,k) \in A} p_{sk} y_{sk}",
            objective_description="purchase cost",
            sets=tuple(sets),
            params=tuple(params),
            variables=(
                VarDef(
                    "y_{sk}",
                    "bought from source $s$ in tier $k$",
                    r"\ge 0, \; y_{sk} \le w_{sk}",
                    "buy",
                    ("A",),
                    noun=f"{sc.unit[1]} to buy in each price tier of each source",
                ),
            ),
            constraints=tuple(constraints),
        )

    def statement(self, data: TierData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        unit, kind = sc.unit, sc.source_kind
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.buyer} needs {amount(data.requirement, unit)} of {sc.commodity} for {sc.need}.",
                    f"For {sc.need}, {data.buyer} must buy {amount(data.requirement, unit)} of {sc.commodity} from "
                    f"{len(data.sources)} {kind[1]}.",
                    f"{data.buyer} is sourcing {sc.commodity}: {amount(data.requirement, unit)} are required "
                    f"for {sc.need}.",
                    f"The buyers at {data.buyer} have to cover a requirement of {amount(data.requirement, unit)} of "
                    f"{sc.commodity}.",
                    f"{capitalize(sc.commodity)} for {sc.need} at {data.buyer} ({amount(data.requirement, unit)} "
                    f"in all) can come from {join(list(data.sources))}.",
                    f"{data.buyer} has to buy {amount(data.requirement, unit)} of {sc.commodity}, and prices rise "
                    f"with the volume taken from each of the {kind[1]} it can use.",
                ),
            )
        )

        def tiers_text(row) -> str:
            s = row[0]
            parts = []
            for k, (width, price) in enumerate(data.tiers[s]):
                lead = "the first" if k == 0 else "the next"
                parts.append(f"{lead} {amount(width, unit)} cost {money(price)} per {unit[0]}")
            return f"{s}: {join(parts)}"

        st.add(
            present(
                rng,
                [capitalize(kind[0]), "Tier", f"Size ({unit[1]})", f"Price per {unit[0]}"],
                [
                    (s, str(k + 1), number(width), money(price))
                    for s in data.sources
                    for k, (width, price) in enumerate(data.tiers[s])
                ],
                lambda row: f"{row[0]}, tier {row[1]}: up to {row[2]} {unit[1]} at {row[3]} per {unit[0]}",
                intro=(
                    f"Each {kind[0]} prices in tiers; a tier's price applies only to the volume within it:",
                    "The tiered prices are:",
                    f"Price tiers of the {kind[1]} (volume beyond a tier is charged at the next tier's price):",
                ),
                allowed=("table", "list"),
            )
            if rng.random() < 0.6
            else "Prices are tiered; a tier's price applies only to the volume within it. "
            + " ".join(capitalize(tiers_text((s,))) + "." for s in data.sources)
        )
        if data.commitment:
            st.add(
                pick(
                    rng,
                    (
                        "Contracts oblige the buyer to take at least "
                        + join([f"{amount(m, unit)} from {s}" for s, m in data.commitment.items()])
                        + ".",
                        "Minimum commitments apply: "
                        + join([f"{s} {amount(m, unit)}" for s, m in data.commitment.items()])
                        + ".",
                    ),
                )
            )
        st.add(
            pick(
                rng,
                (
                    f"Volumes can be split freely between {kind[1]} and bought in fractions of a {unit[0]}.",
                    f"Any volume up to a tier's size may be bought; {kind[1]} can be combined freely.",
                ),
            )
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"How much should be bought from each {kind[0]} to cover the requirement at the lowest cost?",
                "What is the cheapest purchasing plan, and what does it cost?",
                f"Split the purchase across the {kind[1]} so that the total cost is minimal.",
                "Find the purchase plan with minimum total cost.",
                f"Which volumes from which {kind[1]} minimize the bill?",
                "Determine the least-cost purchase quantities and their total cost.",
            ),
        )
        return st.text()

    def decisions(self, data: TierData, values: Mapping[str, float]) -> list[str]:
        unit, money = data.scenario.unit, data.money
        lines = []
        for s in data.sources:
            parts, total = [], 0.0
            for k, (_, price) in enumerate(data.tiers[s], start=1):
                level = values.get(lp_name("buy", s, k), 0.0)
                if level > 1e-6:
                    parts.append(f"{amount(level, unit)} in tier {k} at {money(price)} per {unit[0]}")
                    total += level
            if parts:
                lines.append(f"Buy {amount(total, unit)} from {s}: {join(parts)}.")
        return lines

    def what_if(self, data: TierData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        choice = rng.randrange(4)
        if choice == 3 and len(data.sources) > 2:  # structural: a source drops out
            gone = pick(rng, data.sources)
            return WhatIf(
                f"What if {gone} could not deliver at all this time?",
                replace(
                    data,
                    sources=tuple(s for s in data.sources if s != gone),
                    tiers={s: levels for s, levels in data.tiers.items() if s != gone},
                    commitment={s: m for s, m in data.commitment.items() if s != gone},
                ),
                f"source[{gone}]",
                1.0,
                0.0,
                change=f"{gone} is removed as a source (with its tiers and any commitment)",
            )
        if choice in (0, 3):
            new = scale(data.requirement, pick(rng, (0.8, 1.15, 1.3)), step=10)
            return WhatIf(
                f"What if {amount(new, sc.unit)} were required instead of {number(data.requirement)}?",
                replace(data, requirement=new),
                "requirement",
                data.requirement,
                new,
            )
        s = pick(rng, data.sources)
        if choice == 1:
            width, price = data.tiers[s][0]
            new = scale(price, pick(rng, (0.8, 0.9, 1.2)), integer=False, step=sc.price_range[2])
            new = min(new, data.tiers[s][1][1] - sc.price_range[2]) if len(data.tiers[s]) > 1 else new
            tiers = {**data.tiers, s: ((width, new), *data.tiers[s][1:])}
            return WhatIf(
                f"What if {s} charged {data.money(new)} per {sc.unit[0]} in its first tier instead of "
                f"{data.money(price)}?",
                replace(data, tiers=tiers),
                f"tier_price[{s}, 1]",
                price,
                new,
            )
        width, price = data.tiers[s][0]
        new = scale(width, pick(rng, (0.5, 1.5, 2.0)), step=10)
        tiers = {**data.tiers, s: ((new, price), *data.tiers[s][1:])}
        return WhatIf(
            f"What if the first tier of {s} covered {amount(new, sc.unit)} instead of {number(width)}?",
            replace(data, tiers=tiers),
            f"tier_size[{s}, 1]",
            width,
            new,
        )
