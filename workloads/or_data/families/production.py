"""Production planning: choose how much of each product to make with limited resources to
maximize profit, with demand caps, contracted minimums and a product-mix share."""

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
    generic_distractors,
    join,
    number,
    pick,
    present,
    table,
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Resource:
    name: str
    unit: str  # "hours", "kg"
    reason: str  # why it is limited


@dataclass(frozen=True)
class Scenario:
    company: tuple[str, ...]
    kind: str  # "furniture workshop"
    products: tuple[str, ...]
    unit: tuple[str, str]  # what is made: ("chair", "chairs") or ("ton", "tons")
    integer: bool
    resources: tuple[Resource, ...]
    profit_range: tuple[float, float, float]
    usage_range: tuple[float, float, float]
    period: str
    kit_reason: str  # why an "unbounded" product needs no limited resource
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Oakline Furniture", "Timber & Co", "Northwood Crafts"),
        "furniture workshop",
        ("chairs", "tables", "desks", "bookcases", "stools", "cabinets"),
        ("unit", "units"),
        True,
        (
            Resource("carpentry", "hours", "two carpenters are on staff"),
            Resource("finishing", "hours", "the paint booth is shared"),
            Resource("lumber", "board-feet", "the supplier delivers once a week"),
            Resource("assembly", "hours", "the assembly bench seats three people"),
        ),
        (20, 140, 5),
        (1, 8, 0.5),
        "week",
        "they are bought ready-made and only resold",
        (
            "The workshop opened its first showroom last spring.",
            "Most customers order in oak.",
            "Wood shavings are sold to a local farm.",
        ),
    ),
    Scenario(
        ("Golden Crust Bakery", "Rise & Shine", "Le Petit Four"),
        "bakery",
        ("baguettes", "croissants", "muffins", "sourdough loaves", "bagels", "scones"),
        ("batch", "batches"),
        True,
        (
            Resource("oven", "hours", "there is a single deck oven"),
            Resource("flour", "kg", "flour is delivered daily"),
            Resource("labor", "hours", "four bakers work the early shift"),
            Resource("butter", "kg", "butter must be used fresh"),
        ),
        (15, 90, 1),
        (0.5, 6, 0.5),
        "day",
        "they arrive frozen from a partner bakery and are only reheated off-site",
        (
            "The bakery opens at 6 a.m.",
            "Its sourdough starter is twelve years old.",
            "A café next door also sells coffee.",
        ),
    ),
    Scenario(
        ("Nova Electronics", "Circuitry Ltd", "Bright Devices"),
        "electronics plant",
        ("phones", "tablets", "smartwatches", "earbuds", "chargers"),
        ("device", "devices"),
        True,
        (
            Resource("assembly", "hours", "the assembly line runs one shift"),
            Resource("testing", "hours", "only two test rigs exist"),
            Resource("chips", "units", "the chip supplier allocates a fixed quota"),
        ),
        (12, 160, 2),
        (0.5, 5, 0.5),
        "week",
        "they are sourced from a contract manufacturer and shipped directly",
        (
            "The plant is certified to ISO 9001.",
            "Returns are handled by a separate team.",
            "The firm sponsors a local robotics club.",
        ),
    ),
    Scenario(
        ("ChemSol Industries", "Meridian Chemicals", "Apex Solvents"),
        "chemical plant",
        ("solvent A", "solvent B", "degreaser", "coating base", "cleaner concentrate"),
        ("ton", "tons"),
        False,
        (
            Resource("reactor", "hours", "the reactor needs cleaning between batches"),
            Resource("feedstock", "tons", "feedstock arrives by rail"),
            Resource("distillation", "hours", "the column is shared with another line"),
        ),
        (80, 600, 10),
        (0.5, 4, 0.25),
        "month",
        "they are traded products bought from other producers",
        (
            "The plant has had no safety incident for 400 days.",
            "Its storage tanks were repainted last year.",
            "The chemicals ship in drums.",
        ),
    ),
    Scenario(
        ("Threadline Apparel", "Urban Stitch", "Seamwell"),
        "garment factory",
        ("shirts", "jackets", "trousers", "dresses", "hoodies"),
        ("piece", "pieces"),
        True,
        (
            Resource("cutting", "hours", "there is one cutting table"),
            Resource("sewing", "hours", "twelve sewing machines are available"),
            Resource("fabric", "meters", "fabric is ordered monthly"),
        ),
        (6, 60, 1),
        (0.25, 3, 0.25),
        "week",
        "they are made by a subcontractor who delivers them finished",
        (
            "The factory's designs are sold in three countries.",
            "Buttons are bought in bulk twice a year.",
            "Fabric scraps are recycled.",
        ),
    ),
    Scenario(
        ("Hopfield Brewing", "Copper Kettle", "Stonegate Ales"),
        "brewery",
        ("lager", "pale ale", "stout", "wheat beer", "IPA"),
        ("hectoliter", "hectoliters"),
        False,
        (
            Resource("brewhouse", "hours", "the brewhouse runs one batch at a time"),
            Resource("malt", "kg", "malt is delivered every week"),
            Resource("fermentation", "tank-days", "there are only six fermentation tanks"),
        ),
        (40, 220, 5),
        (1, 12, 0.5),
        "week",
        "they are brewed under licence elsewhere and delivered in kegs",
        (
            "The brewery runs guided tours on Saturdays.",
            "Its stout won a regional award.",
            "Spent grain goes to a cattle farm.",
        ),
    ),
)


@dataclass(frozen=True)
class ProductionData:
    scenario: Scenario
    company: str
    money: Currency
    products: tuple[str, ...]
    resources: tuple[Resource, ...]
    profit: dict[str, float]
    usage: dict[tuple[str, str], float]  # (resource, product) -> per unit; absent = 0
    capacity: dict[str, float]
    demand_cap: dict[str, float]  # products whose sales are limited
    minimum: dict[str, float]  # contracted minimum production
    mix: tuple[str, float] | None  # (product, share): at least share of all output is this product

    def uses(self, resource: str, product: str) -> float:
        return self.usage.get((resource, product), 0.0)


class ProductionPlanning(Family):
    name = "production_planning"
    title = "Production planning"
    statuses = ("infeasible", "unbounded")

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        products = draw(rng, sc.products, 2, 5)
        resources = draw(rng, sc.resources, 2)
        p_low, p_high, p_step = sc.profit_range
        u_low, u_high, u_step = sc.usage_range
        profit = {p: nice(rng, p_low, p_high, p_step) for p in products}
        usage = {
            (r.name, p): nice(rng, u_low, u_high, u_step) for r in resources for p in products if rng.random() < 0.85
        }
        for p in products:  # every product needs at least one limited resource
            if not any((r.name, p) in usage for r in resources):
                usage[resources[0].name, p] = nice(rng, u_low, u_high, u_step)
        witness = {p: float(rng.randint(5, 40)) for p in products}  # a plan the limits admit
        capacity = {
            r.name: float(
                int(sum(usage.get((r.name, p), 0) * witness[p] for p in products) * rng.uniform(1.0, 1.4)) + 1
            )
            for r in resources
        }
        demand_cap = {p: float(int(witness[p] * rng.uniform(1.1, 1.8)) + 1) for p in products if rng.random() < 0.4}
        minimum = {p: float(max(1, int(witness[p] * rng.uniform(0.2, 0.8)))) for p in products if rng.random() < 0.25}
        mix = None
        if len(products) > 2 and rng.random() < 0.3:
            chosen = pick(rng, products)
            share = witness[chosen] / sum(witness.values())
            mix = (chosen, round(max(0.05, share * rng.uniform(0.5, 0.9)), 2))
        data = ProductionData(
            sc,
            pick(rng, sc.company),
            currency(rng),
            products,
            resources,
            profit,
            usage,
            capacity,
            demand_cap,
            minimum,
            mix,
        )
        if status == "infeasible":
            resource = pick(rng, resources)
            users = [p for p in products if (resource.name, p) in usage]
            minimum = {p: float(max(1, int(witness[p]))) for p in users}
            needed = sum(usage[resource.name, p] * minimum[p] for p in users)
            capacity = {**capacity, resource.name: float(max(1, int(needed * rng.uniform(0.6, 0.9))))}
            data = replace(
                data,
                minimum=minimum,
                capacity=capacity,
                demand_cap={p: max(c, minimum.get(p, 0)) for p, c in demand_cap.items()},
            )
            note = (
                f"the contracted minimum production needs {number(needed)} {resource.unit} of {resource.name}, "
                f"but only {number(capacity[resource.name])} {resource.unit} are available"
            )
            return Generated(data, "infeasible", note)
        if status == "unbounded":
            free = pick(rng, products)
            usage = {key: value for key, value in usage.items() if key[1] != free}
            data = replace(data, usage=usage, demand_cap={p: c for p, c in demand_cap.items() if p != free}, mix=None)
            note = f"{free} uses none of the limited resources and its sales are not capped, so making more of it always adds profit"
            return Generated(data, "unbounded", note)
        return Generated(data, "optimal")

    def linear_model(self, data: ProductionData) -> LinearModel:
        b = ModelBuilder("production_planning")
        kind = "integer" if data.scenario.integer else "continuous"
        make = {
            p: b.var(lp_name("make", p), kind, data.minimum.get(p, 0.0), data.demand_cap.get(p)) for p in data.products
        }
        for r in data.resources:
            b.row(
                lp_name("capacity", r.name),
                {make[p]: data.uses(r.name, p) for p in data.products},
                "<=",
                data.capacity[r.name],
            )
        if data.mix is not None:
            product, share = data.mix
            terms = {make[p]: -share for p in data.products}
            terms[make[product]] += 1.0
            b.row(lp_name("mix", product), terms, ">=", 0.0)
        b.maximize({make[p]: data.profit[p] for p in data.products})
        return b.build()

    def program(self, data: ProductionData) -> str:
        sc = data.scenario
        vtype = "I" if sc.integer else "C"
        body = f'''# make[p]: {sc.unit[1]} of product p made per {sc.period}, between its contracted minimum and its sales cap
make = {{p: model.addVar(vtype="{vtype}", lb=minimum.get(p, 0), ub=sales_cap.get(p), name=f"make[{{p}}]") for p in products}}

# capacity: the products' use of each resource stays within what is available
for r in resources:
    model.addCons(quicksum(usage.get((r, p), 0) * make[p] for p in products) <= available[r], name=f"capacity[{{r}}]")
'''
        if data.mix is not None:
            body += f"""
# mix: at least {data.mix[1]:.0%} of all output is {data.mix[0]}
model.addCons(make[mix_product] >= mix_share * quicksum(make[p] for p in products), name="mix")
"""
        body += """
# Objective: maximize the total profit
model.setObjective(quicksum(profit[p] * make[p] for p in products), sense="maximize")
"""
        values: list[tuple[str, object]] = [
            ("products", list(data.products)),
            ("resources", [r.name for r in data.resources]),
            ("profit", data.profit),
            ("usage", data.usage),
            ("available", data.capacity),
            ("sales_cap", data.demand_cap),
            ("minimum", data.minimum),
        ]
        if data.mix is not None:
            values += [("mix_product", data.mix[0]), ("mix_share", data.mix[1])]
        return assemble(
            "production_planning", values, body, ["for p, var in make.items():", '    show(f"make[{p}]", var)']
        )

    def math_model(self, data: ProductionData) -> MathModel:
        sc = data.scenario
        domain = r"\in \mathbb{Z}" if sc.integer else r"\in \mathbb{R}"
        params = [
            ParamDef("\\pi_p", f"profit per {sc.unit[0]} of product $p$ ({data.money.code})", data.profit, ("P",)),
            ParamDef(
                "a_{rp}", f"amount of resource $r$ one {sc.unit[0]} of $p$ uses (– means none)", data.usage, ("R", "P")
            ),
            ParamDef("b_r", "amount of resource $r$ available per " + sc.period, data.capacity, ("R",)),
        ]
        bounds = "0"
        if data.minimum:
            params.append(ParamDef("m_p", "contracted minimum production (0 where none)", data.minimum, ("P",)))
            bounds = "m_p"
        upper = ""
        if data.demand_cap:
            params.append(
                ParamDef(
                    "u_p", f"most {sc.unit[1]} of $p$ that can be sold (no cap where absent)", data.demand_cap, ("P",)
                )
            )
            upper = r" \le u_p"
        constraints = [
            ConstraintDef(
                "Capacity",
                "resource use stays within availability",
                r"\sum_{p \in P} a_{rp} x_p \le b_r",
                "capacity",
                ("R",),
                why=f"every {sc.unit[0]} draws on the limited resources, and each resource has only a fixed amount "
                f"per {sc.period}, so [the products' combined use of it is capped|the combined use over all products "
                "is capped]",
            )
        ]
        if data.mix is not None:
            params.append(ParamDef("\\sigma", f"minimum share of {data.mix[0]} in total output", data.mix[1]))
            constraints.append(
                ConstraintDef(
                    "Product mix",
                    f"the share of {data.mix[0]} in the output is at least $\\sigma$",
                    f"x_{{\\text{{{data.mix[0]}}}}} \\ge \\sigma \\sum_{{p \\in P}} x_p",
                    "mix",
                    (),
                    why=f"management wants {data.mix[0]} to keep a minimum share of the range; [the share is written as "
                    "a linear inequality by multiplying it out against total output instead of dividing|dividing by "
                    "total output would not be linear, so the share is multiplied out against it]",
                )
            )
        return MathModel(
            title="Production planning model",
            sense="maximize",
            objective=r"\sum_{p \in P} \pi_p x_p",
            objective_description="total profit",
            sets=(
                SetDef("P", "p", "products", data.products),
                SetDef("R", "r", "resources", tuple(r.name for r in data.resources)),
            ),
            params=tuple(params),
            variables=(
                VarDef(
                    "x_p",
                    f"{sc.unit[1]} of product $p$ made per {sc.period}",
                    f"{domain}, \\; {bounds} \\le x_p{upper}",
                    "make",
                    ("P",),
                    noun=f"{sc.unit[1]} of each product to make per {sc.period}",
                    whole=f"a {sc.unit[0]} is made whole or not at all" if sc.integer else "",
                ),
            ),
            constraints=tuple(constraints),
        )

    def statement(self, data: ProductionData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        unit = sc.unit
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.company}, a {sc.kind}, makes {join(data.products, rng)}.",
                    f"A {sc.kind} called {data.company} is planning next {sc.period}'s production of {join(data.products, rng)}.",
                    f"{data.company} produces {len(data.products)} products ({join(data.products, rng)}) and wants to decide how many {unit[1]} of each to make per {sc.period}.",
                    f"The production manager of {data.company} must set the output per {sc.period} of its {sc.kind}, which can make {join(data.products, rng)}.",
                ),
            )
        )
        st.add(
            present(
                rng,
                ["Product", f"Profit per {unit[0]}"],
                [(p, money(data.profit[p])) for p in data.products],
                lambda row: pick(
                    rng,
                    (
                        f"each {unit[0]} of {row[0]} earns a profit of {row[1]}",
                        f"{row[0]} brings {row[1]} per {unit[0]}",
                        f"the profit on {row[0]} is {row[1]} per {unit[0]}",
                    ),
                ),
                intro=(f"Profit per {unit[0]}:", "The products earn:", "Unit profits are as follows."),
            )
        )
        resources = data.resources
        if rng.random() < 0.5:
            rows = [
                [p, *(number(data.uses(r.name, p)) if (r.name, p) in data.usage else "0" for r in resources)]
                for p in data.products
            ]
            header = ["Product", *(f"{r.name} ({r.unit} per {unit[0]})" for r in resources)]
            st.add(
                pick(rng, ("Each product needs the following resources:", "Resource requirements:"))
                + "\n\n"
                + table(header, rows)
            )
        else:
            for r in resources:
                parts = [
                    f"{number(data.uses(r.name, p))} {r.unit} per {unit[0]} of {p}"
                    for p in data.products
                    if (r.name, p) in data.usage
                ]
                free = [p for p in data.products if (r.name, p) not in data.usage]
                sentence = pick(
                    rng,
                    (
                        f"Production uses {r.name}: {join(parts, rng)}.",
                        f"In terms of {r.name}, the requirement is {join(parts, rng)}.",
                    ),
                )
                if not parts:
                    sentence = f"None of the products needs {r.name} at the moment."
                    free = []
                if free:
                    sentence += f" {capitalize(join(free, rng))} {'needs' if len(free) == 1 else 'need'} no {r.name}."
                st.add(sentence)
        st.add(
            " ".join(
                pick(
                    rng,
                    (
                        f"{capitalize(r.name)} is limited to {number(data.capacity[r.name])} {r.unit} per {sc.period} because {r.reason}.",
                        f"There are {number(data.capacity[r.name])} {r.unit} of {r.name} available each {sc.period}.",
                        f"At most {number(data.capacity[r.name])} {r.unit} of {r.name} can be used per {sc.period}.",
                    ),
                )
                for r in resources
            )
        )
        free_products = [p for p in data.products if not any((r.name, p) in data.usage for r in resources)]
        for p in free_products:
            st.add(f"{capitalize(p)} uses none of these resources, because {sc.kit_reason}.")
        for p, cap in data.demand_cap.items():
            st.add(
                pick(
                    rng,
                    (
                        f"The market takes at most {number(cap)} {unit[1]} of {p} per {sc.period}.",
                        f"No more than {number(cap)} {unit[1]} of {p} can be sold.",
                    ),
                )
            )
        for p, low in data.minimum.items():
            st.add(
                pick(
                    rng,
                    (
                        f"A contract requires at least {number(low)} {unit[1]} of {p}.",
                        f"{capitalize(p)} must be made in a quantity of at least {number(low)} {unit[1]} to honor existing orders.",
                    ),
                )
            )
        if data.mix is not None:
            product, share = data.mix
            st.add(
                pick(
                    rng,
                    (
                        f"To keep its product range balanced, at least {share:.0%} of the total output must be {product}.",
                        f"Management wants {product} to make up no less than {share:.0%} of all {unit[1]} produced.",
                    ),
                )
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        whole = f" Only whole {unit[1]} can be made." if sc.integer and rng.random() < 0.6 else ""
        st.question = (
            whole.strip()
            + " "
            + pick(
                rng,
                (
                    f"How many {unit[1]} of each product should be made to maximize total profit?",
                    "Determine the production plan that maximizes profit, and the maximum profit.",
                    f"What is the largest profit the {sc.kind} can earn per {sc.period}, and with which plan?",
                    "Find the most profitable product mix.",
                ),
            )
        )
        return st.text()

    def decisions(self, data: ProductionData, values: Mapping[str, float]) -> list[str]:
        lines = []
        for p in data.products:
            made = values[lp_name("make", p)]
            if abs(made) > 1e-6:
                lines.append(f"Make {amount(made, data.scenario.unit)} of {p}.")
        return lines

    def what_if(self, data: ProductionData, rng: random.Random) -> WhatIf:
        if rng.random() < 0.5:
            r = pick(rng, data.resources)
            new = scale(data.capacity[r.name], pick(rng, (0.8, 0.9, 1.1, 1.25)))
            return WhatIf(
                f"What if {number(new)} {r.unit} of {r.name} were available instead of {number(data.capacity[r.name])}?",
                replace(data, capacity={**data.capacity, r.name: new}),
                f"available[{r.name}]",
                data.capacity[r.name],
                new,
            )
        p = pick(rng, data.products)
        step = data.scenario.profit_range[2]
        new = scale(data.profit[p], pick(rng, (0.7, 0.85, 1.2, 1.4)), integer=False, step=step)
        return WhatIf(
            f"What if the profit on {p} changed from {data.money(data.profit[p])} to {data.money(new)} per {data.scenario.unit[0]}?",
            replace(data, profit={**data.profit, p: new}),
            f"profit[{p}]",
            data.profit[p],
            new,
        )
