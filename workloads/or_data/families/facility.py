"""Capacitated facility location: decide which sites to open (fixed cost, capacity) and how to
serve each customer's demand from open sites, minimizing fixed plus shipping cost; optionally
single-sourced customers and a limit on the number of open sites."""

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
from trex.workloads.or_data.program import assemble, identifier


@dataclass(frozen=True)
class Scenario:
    company: tuple[str, ...]
    site: tuple[str, str]
    customer: tuple[str, str]
    sites: tuple[str, ...]
    customers: tuple[str, ...]
    unit: tuple[str, str]
    fixed_range: tuple[float, float, float]
    cost_range: tuple[float, float, float]
    demand_range: tuple[int, int]
    period: str
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("NorthStar Logistics", "Parcelink", "Meridian Supply"),
        ("warehouse", "warehouses"),
        ("retail region", "retail regions"),
        ("Leeds", "Bristol", "Coventry", "Reading", "Derby", "Swindon"),
        ("North", "Midlands", "South West", "London", "East", "Wales", "Scotland", "Yorkshire"),
        ("pallet", "pallets"),
        (8000, 30000, 500),
        (2, 18, 0.5),
        (40, 220),
        "month",
        ("Leases run for five years.", "The firm uses electric forklifts.", "A new CEO started in January."),
    ),
    Scenario(
        ("CloudNest", "Datagrid", "Skyline Hosting"),
        ("data center", "data centers"),
        ("user region", "user regions"),
        ("Dublin", "Frankfurt", "Stockholm", "Madrid", "Warsaw", "Milan"),
        ("Iberia", "Benelux", "Nordics", "Balkans", "Alps", "Baltics", "British Isles", "Central Europe"),
        ("rack-unit of load", "rack-units of load"),
        (40000, 160000, 1000),
        (20, 140, 5),
        (20, 120),
        "year",
        (
            "All sites run on renewable power.",
            "Latency targets are reviewed yearly.",
            "The company went public in 2019.",
        ),
    ),
    Scenario(
        ("HealthFirst", "CareNet Clinics", "Wellspring Health"),
        ("clinic", "clinics"),
        ("district", "districts"),
        ("Oakwood", "Millbrook", "Riverside", "Hilltop", "Lakeside", "Kingsgate"),
        ("Ashby", "Brent", "Caxton", "Dove", "Elm Park", "Fairfield", "Glen", "Holt"),
        ("patient visit", "patient visits"),
        (50000, 200000, 5000),
        (3, 25, 1),
        (200, 1200),
        "year",
        (
            "Each clinic would employ two doctors.",
            "Parking is free at all sites.",
            "The regional health board meets monthly.",
        ),
    ),
    Scenario(
        ("Voltway", "ChargeGrid", "E-Motion"),
        ("charging hub", "charging hubs"),
        ("neighborhood", "neighborhoods"),
        ("Station Square", "Mall West", "Harbor Gate", "Tech Park", "Old Mill", "Airport Road"),
        ("Northside", "Eastgate", "Southbank", "Westfield", "Central", "Parkview", "Bayview"),
        ("charging session", "charging sessions"),
        (15000, 60000, 1000),
        (1, 6, 0.25),
        (100, 600),
        "week",
        ("Hubs have solar canopies.", "Most users charge in the evening.", "The city offers a green-energy grant."),
    ),
)


@dataclass(frozen=True)
class FacilityData:
    scenario: Scenario
    company: str
    money: Currency
    sites: tuple[str, ...]
    customers: tuple[str, ...]
    fixed: dict[str, float]
    capacity: dict[str, float]
    demand: dict[str, float]
    cost: dict[tuple[str, str], float]  # (customer, site) per unit
    single_source: bool
    max_open: int | None


class FacilityLocation(Family):
    name = "facility_location"
    title = "Capacitated facility location"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        sites = draw(rng, sc.sites, 3, 5)
        customers = draw(rng, sc.customers, 4, 7)
        step = 10 if sc.demand_range[1] > 300 else 5
        demand = {c: nice(rng, *sc.demand_range, step) for c in customers}
        total = sum(demand.values())
        largest = max(demand.values())
        # each site alone can take at least the largest customer; together they cover demand twice
        capacity = {s: float(int(max(largest, total * rng.uniform(0.3, 0.7)) / step + 1) * step) for s in sites}
        while sum(capacity.values()) < 1.3 * total:
            capacity = {s: value + step for s, value in capacity.items()}
        fixed = {s: nice(rng, *sc.fixed_range) for s in sites}
        cost = {(c, s): nice(rng, *sc.cost_range) for c in customers for s in sites}
        single = rng.random() < 0.35
        max_open = None
        if rng.random() < 0.3:
            ranked = sorted(capacity.values(), reverse=True)
            need = next(k for k in range(1, len(sites) + 1) if sum(ranked[:k]) >= 1.25 * total)
            if need < len(sites):
                max_open = need + (1 if need + 1 < len(sites) and rng.random() < 0.5 else 0)
        data = FacilityData(
            sc, pick(rng, sc.company), currency(rng), sites, customers, fixed, capacity, demand, cost, single, max_open
        )
        if status == "infeasible":
            short = rng.uniform(0.7, 0.95) * total / sum(capacity.values())
            capacity = {s: float(max(step, int(value * short / step) * step)) for s, value in capacity.items()}
            data = replace(data, capacity=capacity, max_open=None, single_source=False)
            note = f"all {len(sites)} {sc.site[1]} together can handle {number(sum(capacity.values()))} {sc.unit[1]}, less than the total demand of {number(total)}"
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: FacilityData) -> LinearModel:
        b = ModelBuilder("facility_location")
        is_open = {s: b.var(lp_name("open", s), "binary") for s in data.sites}
        if data.single_source:
            serve = {(c, s): b.var(lp_name("serve", c, s), "binary") for c in data.customers for s in data.sites}
            for c in data.customers:
                b.row(lp_name("demand", c), {serve[c, s]: 1 for s in data.sites}, "==", 1)
            for s in data.sites:
                terms = {serve[c, s]: data.demand[c] for c in data.customers}
                terms[is_open[s]] = -data.capacity[s]
                b.row(lp_name("capacity", s), terms, "<=", 0)
            shipping = {serve[c, s]: data.cost[c, s] * data.demand[c] for c in data.customers for s in data.sites}
        else:
            serve = {(c, s): b.var(lp_name("serve", c, s)) for c in data.customers for s in data.sites}
            for c in data.customers:
                b.row(lp_name("demand", c), {serve[c, s]: 1 for s in data.sites}, "==", data.demand[c])
            for s in data.sites:
                terms = {serve[c, s]: 1 for c in data.customers}
                terms[is_open[s]] = -data.capacity[s]
                b.row(lp_name("capacity", s), terms, "<=", 0)
            shipping = {serve[c, s]: data.cost[c, s] for c in data.customers for s in data.sites}
        if data.max_open is not None:
            b.row("max_open", {is_open[s]: 1 for s in data.sites}, "<=", data.max_open)
        b.minimize({**{is_open[s]: data.fixed[s] for s in data.sites}, **shipping})
        return b.build()

    def program(self, data: FacilityData) -> str:
        sc = data.scenario
        sites, customers = identifier(sc.site[1]), identifier(sc.customer[1])
        if data.single_source:
            body = f"""# is_open[s] = 1 when {sc.site[0]} s is opened
is_open = {{s: model.addVar(vtype="B", name=f"open[{{s}}]") for s in {sites}}}

# serve[c, s] = 1 when {sc.customer[0]} c is served entirely by {sc.site[0]} s
serve = {{(c, s): model.addVar(vtype="B", name=f"serve[{{c}},{{s}}]") for c in {customers} for s in {sites}}}

# demand: every {sc.customer[0]} is served by exactly one {sc.site[0]}
for c in {customers}:
    model.addCons(quicksum(serve[c, s] for s in {sites}) == 1, name=f"demand[{{c}}]")

# capacity: an open {sc.site[0]} serves at most its capacity, a closed one nothing
for s in {sites}:
    model.addCons(quicksum(demand[c] * serve[c, s] for c in {customers}) <= capacity[s] * is_open[s], name=f"capacity[{{s}}]")
"""
            shipping = f"quicksum(unit_cost[c, s] * demand[c] * serve[c, s] for c in {customers} for s in {sites})"
        else:
            body = f"""# is_open[s] = 1 when {sc.site[0]} s is opened
is_open = {{s: model.addVar(vtype="B", name=f"open[{{s}}]") for s in {sites}}}

# serve[c, s]: {sc.unit[1]} of {sc.customer[0]} c's demand handled by {sc.site[0]} s
serve = {{(c, s): model.addVar(vtype="C", lb=0, name=f"serve[{{c}},{{s}}]") for c in {customers} for s in {sites}}}

# demand: every {sc.customer[0]}'s demand is met in full
for c in {customers}:
    model.addCons(quicksum(serve[c, s] for s in {sites}) == demand[c], name=f"demand[{{c}}]")

# capacity: an open {sc.site[0]} handles at most its capacity, a closed one nothing
for s in {sites}:
    model.addCons(quicksum(serve[c, s] for c in {customers}) <= capacity[s] * is_open[s], name=f"capacity[{{s}}]")
"""
            shipping = f"quicksum(unit_cost[c, s] * serve[c, s] for c in {customers} for s in {sites})"
        if data.max_open is not None:
            body += f"""
# max_open: at most max_open {sc.site[1]} may be opened
model.addCons(quicksum(is_open[s] for s in {sites}) <= max_open, name="max_open")
"""
        body += f"""
# Objective: minimize fixed opening costs plus service costs
model.setObjective(quicksum(fixed_cost[s] * is_open[s] for s in {sites}) + {shipping}, sense="minimize")
"""
        values: list[tuple[str, object]] = [
            (sites, list(data.sites)),
            (customers, list(data.customers)),
            ("fixed_cost", data.fixed),
            ("capacity", data.capacity),
            ("demand", data.demand),
            ("unit_cost", data.cost),
        ]
        if data.max_open is not None:
            values.append(("max_open", data.max_open))
        report = [
            "for s, var in is_open.items():",
            '    show(f"open[{s}]", var)',
            "for (c, s), var in serve.items():",
            '    show(f"serve[{c}, {s}]", var)',
        ]
        return assemble("facility_location", values, body, report)

    def math_model(self, data: FacilityData) -> MathModel:
        sc = data.scenario
        params = [
            ParamDef(
                "f_s", f"fixed cost of opening {sc.site[0]} $s$ ({data.money.code} per {sc.period})", data.fixed, ("S",)
            ),
            ParamDef("Q_s", f"capacity of {sc.site[0]} $s$ ({sc.unit[1]})", data.capacity, ("S",)),
            ParamDef("d_c", f"demand of {sc.customer[0]} $c$ ({sc.unit[1]})", data.demand, ("C",)),
            ParamDef("g_{cs}", f"cost per {sc.unit[0]} of serving $c$ from $s$", data.cost, ("C", "S")),
        ]
        if data.single_source:
            variables = (
                VarDef(
                    "y_s",
                    f"1 if {sc.site[0]} $s$ is opened",
                    r"\in \{0, 1\}",
                    "open",
                    ("S",),
                    indicator=f"whether to open each candidate {sc.site[0]}",
                ),
                VarDef(
                    "x_{cs}",
                    f"1 if {sc.customer[0]} $c$ is served by $s$",
                    r"\in \{0, 1\}",
                    "serve",
                    ("C", "S"),
                    indicator=f"which {sc.site[0]} serves each {sc.customer[0]}",
                ),
            )
            constraints = [
                ConstraintDef(
                    "Single sourcing",
                    f"each {sc.customer[0]} has exactly one {sc.site[0]}",
                    r"\sum_{s \in S} x_{cs} = 1",
                    "demand",
                    ("C",),
                    why=f"a {sc.customer[0]} [must be served in full by one {sc.site[0]}, never split|gets all of its demand "
                    f"from a single {sc.site[0]}|is served by exactly one {sc.site[0]} and never split between two]",
                ),
                ConstraintDef(
                    "Capacity",
                    "open sites serve within capacity",
                    r"\sum_{c \in C} d_c x_{cs} \le Q_s y_s",
                    "capacity",
                    ("S",),
                    why=f"a {sc.site[0]} can handle only [so many|a limited number of] {sc.unit[1]}, and a closed one "
                    "[none at all|none]",
                    technique=f"[Multiplying the capacity by the opening decision links the two kinds of decision|The "
                    "capacity is multiplied by the opening decision, which links the two kinds of decision]: with the "
                    f"{sc.site[0]} closed the right-hand side is 0, so nothing can be assigned to it; [a separate rule "
                    "'serve only if open' is not needed|no separate rule 'serve only if open' is needed].",
                ),
            ]
            objective = r"\sum_{s \in S} f_s y_s + \sum_{c \in C} \sum_{s \in S} g_{cs} d_c x_{cs}"
        else:
            variables = (
                VarDef(
                    "y_s",
                    f"1 if {sc.site[0]} $s$ is opened",
                    r"\in \{0, 1\}",
                    "open",
                    ("S",),
                    indicator=f"whether to open each candidate {sc.site[0]}",
                ),
                VarDef(
                    "x_{cs}",
                    f"{sc.unit[1]} of $c$'s demand served from $s$",
                    r"\ge 0",
                    "serve",
                    ("C", "S"),
                    noun=f"{sc.unit[1]} each {sc.customer[0]} receives from each {sc.site[0]}",
                ),
            )
            constraints = [
                ConstraintDef(
                    "Demand",
                    f"each {sc.customer[0]}'s demand is met",
                    r"\sum_{s \in S} x_{cs} = d_c",
                    "demand",
                    ("C",),
                    why=f"every {sc.customer[0]} must [receive its whole demand|be supplied in full], [possibly from "
                    f"several {sc.site[1]}|which may be split between several {sc.site[1]}]",
                ),
                ConstraintDef(
                    "Capacity",
                    "open sites serve within capacity, closed ones nothing",
                    r"\sum_{c \in C} x_{cs} \le Q_s y_s",
                    "capacity",
                    ("S",),
                    # "handle"/"serve", not "ship": the same words must fit data centers and clinics
                    why=f"a {sc.site[0]} can [handle|serve] [only up to its capacity|no more than its capacity] in "
                    f"{sc.unit[1]}, and a closed one [none|none at all]",
                    technique="[Multiplying the capacity by the opening decision links the amounts served to the yes/no "
                    "choice|The capacity term carries the opening decision as a factor, which ties the amounts served "
                    f"to the yes/no choice]: closing a {sc.site[0]} sets its capacity to 0, so [the fixed cost must be "
                    f"paid before it serves any {sc.customer[0]}|it serves no {sc.customer[0]} unless its fixed cost "
                    "is paid].",
                ),
            ]
            objective = r"\sum_{s \in S} f_s y_s + \sum_{c \in C} \sum_{s \in S} g_{cs} x_{cs}"
        if data.max_open is not None:
            params.append(ParamDef("K", f"most {sc.site[1]} that may be opened", data.max_open))
            constraints.append(
                ConstraintDef(
                    "Open limit",
                    f"at most $K$ {sc.site[1]} open",
                    r"\sum_{s \in S} y_s \le K",
                    "max_open",
                    (),
                    why=f"[management allows only a limited number of {sc.site[1]} to be open at once|at most a fixed "
                    f"number of {sc.site[1]} may be open at the same time]",
                )
            )
        return MathModel(
            title="Capacitated facility location model" + (" (single sourcing)" if data.single_source else ""),
            sense="minimize",
            objective=objective,
            objective_description="fixed plus service cost",
            sets=(
                SetDef("S", "s", f"candidate {sc.site[1]}", data.sites),
                SetDef("C", "c", sc.customer[1], data.customers),
            ),
            params=tuple(params),
            variables=variables,
            constraints=tuple(constraints),
        )

    def statement(self, data: FacilityData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.company} is deciding where to open {sc.site[1]}. The candidate locations are {join(data.sites, rng)}, and they would serve {len(data.customers)} {sc.customer[1]}.",
                    f"To serve the {sc.customer[1]} {join(data.customers, rng)}, {data.company} can open {sc.site[1]} in any of {join(data.sites, rng)}.",
                    f"{data.company} plans its network of {sc.site[1]} for the coming {sc.period}: {len(data.sites)} candidate sites, {len(data.customers)} {sc.customer[1]} to serve.",
                    f"Opening a {sc.site[0]} is expensive, but serving {sc.customer[1]} from far away is too. {data.company} must strike the balance for {join(data.customers, rng)}.",
                ),
            )
        )
        st.add(
            present(
                rng,
                [capitalize(sc.site[0]), f"Fixed cost per {sc.period}", f"Capacity ({sc.unit[1]})"],
                [(s, money(data.fixed[s]), number(data.capacity[s])) for s in data.sites],
                lambda row: pick(
                    rng,
                    (
                        f"opening {row[0]} costs {row[1]} per {sc.period} and it can handle {row[2]} {sc.unit[1]}",
                        f"{row[0]} has a fixed cost of {row[1]} and a capacity of {row[2]} {sc.unit[1]}",
                    ),
                ),
                intro=(f"Candidate {sc.site[1]}:", "Site data:", f"Each {sc.site[0]} has a fixed cost and a capacity:"),
            )
        )
        st.add(
            present(
                rng,
                [capitalize(sc.customer[0]), f"Demand ({sc.unit[1]})"],
                [(c, number(data.demand[c])) for c in data.customers],
                lambda row: pick(
                    rng,
                    (
                        f"{row[0]} needs {row[1]} {sc.unit[1]}",
                        f"the demand of {row[0]} is {row[1]} {sc.unit[1]}",
                        f"{row[0]} generates {row[1]} {sc.unit[1]} per {sc.period}",
                    ),
                ),
                intro=(f"Demand per {sc.period}:", f"The {sc.customer[1]} require:", "Expected demand:"),
            )
        )
        rows = [[c, *(money(data.cost[c, s]) for s in data.sites)] for c in data.customers]
        st.add(
            pick(
                rng,
                (
                    f"Serving one {sc.unit[0]} costs:",
                    f"Service cost per {sc.unit[0]}, by {sc.customer[0]} and {sc.site[0]}:",
                ),
            )
            + "\n\n"
            + table([f"{capitalize(sc.customer[0])} \\ {sc.site[0]}", *data.sites], rows)
        )
        if data.single_source:
            st.add(
                pick(
                    rng,
                    (
                        f"Each {sc.customer[0]} must be served entirely by one {sc.site[0]}.",
                        f"For simplicity, a {sc.customer[0]} cannot be split between {sc.site[1]}.",
                    ),
                )
            )
        else:
            st.add(pick(rng, (f"A {sc.customer[0]}'s demand may be split across several {sc.site[1]}.", "")))
        if data.max_open is not None:
            st.add(
                pick(
                    rng,
                    (
                        f"Management will open at most {data.max_open} {sc.site[1]}.",
                        f"No more than {data.max_open} sites can be staffed.",
                    ),
                )
            )
        st.add(
            pick(
                rng,
                (
                    f"A {sc.site[0]} that is not opened cannot serve anyone.",
                    f"Only open {sc.site[1]} can serve demand.",
                ),
            )
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"Which {sc.site[1]} should be opened, and how should demand be served, to minimize total cost?",
                "Find the cheapest network design and its total cost.",
                f"Determine the optimal set of {sc.site[1]} and the minimum total cost per {sc.period}.",
            ),
        )
        return st.text()

    def decisions(self, data: FacilityData, values: Mapping[str, float]) -> list[str]:
        sc = data.scenario
        opened = [s for s in data.sites if values[lp_name("open", s)] > 0.5]
        lines = [f"Open {sc.site[1] if len(opened) > 1 else sc.site[0]} {join(opened)}."] if opened else []
        for c in data.customers:
            for s in data.sites:
                served = values[lp_name("serve", c, s)]
                if served > 1e-6:
                    handled = data.demand[c] if data.single_source else served
                    lines.append(f"{capitalize(s)} serves {amount(handled, sc.unit)} for {c}.")
        return lines

    def what_if(self, data: FacilityData, rng: random.Random) -> WhatIf:
        s = pick(rng, data.sites)
        if rng.random() < 0.5:
            new = scale(data.fixed[s], pick(rng, (0.6, 0.8, 1.3, 1.6)), step=data.scenario.fixed_range[2])
            return WhatIf(
                f"What if opening {s} cost {data.money(new)} instead of {data.money(data.fixed[s])}?",
                replace(data, fixed={**data.fixed, s: new}),
                f"fixed_cost[{s}]",
                data.fixed[s],
                new,
            )
        c = pick(rng, data.customers)
        new = scale(data.demand[c], pick(rng, (0.8, 1.2, 1.4)))
        return WhatIf(
            f"What if {c} needed {number(new)} {data.scenario.unit[1]} instead of {number(data.demand[c])}?",
            replace(data, demand={**data.demand, c: new}),
            f"demand[{c}]",
            data.demand[c],
            new,
        )
