"""Transportation: ship a commodity from sources with limited supply to destinations with
demands at least cost, some routes missing or capacity-limited (Hitchcock's problem)."""

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
    commodity: str
    source: tuple[str, str]  # singular, plural
    destination: tuple[str, str]
    unit: tuple[str, str]
    integer: bool
    source_names: tuple[str, ...]
    destination_names: tuple[str, ...]
    cost_range: tuple[float, float, float]  # low, high, step (per unit)
    amount_range: tuple[int, int]  # demand per destination
    cap_reason: str
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Volta Energy", "GridCo", "Northern Power"),
        "electricity",
        ("power plant", "power plants"),
        ("city", "cities"),
        ("MWh", "MWh"),
        False,
        ("Riverside", "Hillcrest", "Lakeview", "Northgate", "Stonebridge"),
        ("Aston", "Bramley", "Corby", "Dunmore", "Elwood", "Farley", "Glenrock"),
        (2, 14, 0.5),
        (40, 160),
        "the transmission line is rated for only that much",
        (
            "Electricity prices peak in the evening.",
            "One plant runs on natural gas and the others on coal.",
            "The grid operator publishes forecasts every hour.",
        ),
    ),
    Scenario(
        ("ShopRight", "Urban Goods", "Maple Retail"),
        "goods",
        ("warehouse", "warehouses"),
        ("store", "stores"),
        ("pallet", "pallets"),
        True,
        ("Central", "East Side", "Harbor", "Airport", "West End"),
        ("Downtown", "Mall", "Uptown", "Riverside", "Old Town", "Station", "Campus"),
        (3, 25, 1),
        (20, 90),
        "only one truck a day serves that route",
        (
            "Each pallet holds about 40 boxes.",
            "Stores are open seven days a week.",
            "Warehouse staff work in two shifts.",
        ),
    ),
    Scenario(
        ("Green Valley Co-op", "AgriLink", "Harvest Union"),
        "produce",
        ("farm", "farms"),
        ("market", "markets"),
        ("ton", "tons"),
        False,
        ("Oak Farm", "Sunfield", "Millbrook", "Redhill", "Willow Creek"),
        ("North Market", "Harbor Market", "Central Market", "East Market", "Station Market", "Square Market"),
        (4, 30, 1),
        (15, 70),
        "the bridge on that road has a weight limit",
        ("The harvest season lasts about ten weeks.", "Most of the produce is tomatoes.", "Markets open at 6 a.m."),
    ),
    Scenario(
        ("Atlas Manufacturing", "Kestrel Industries", "Orion Works"),
        "finished products",
        ("factory", "factories"),
        ("distribution center", "distribution centers"),
        ("container", "containers"),
        True,
        ("Plant A", "Plant B", "Plant C", "Plant D"),
        ("DC North", "DC South", "DC East", "DC West", "DC Central", "DC Coast"),
        (40, 260, 5),
        (8, 45),
        "the rail link has a fixed number of slots",
        ("Each container is 40 feet long.", "The factories run three shifts.", "Customs paperwork takes one day."),
    ),
    Scenario(
        ("the regional water authority", "AquaServe", "BlueRiver Utilities"),
        "water",
        ("reservoir", "reservoirs"),
        ("town", "towns"),
        ("megaliter", "megaliters"),
        False,
        ("Upper Lake", "Pine Reservoir", "Granite Dam", "Clearwater"),
        ("Ashford", "Bexley", "Carlow", "Dalton", "Easton", "Fenwick"),
        (1, 9, 0.25),
        (30, 120),
        "the pipeline between them is narrow",
        (
            "Rainfall was above average this spring.",
            "The water is treated at each town before use.",
            "Pumping stations are inspected monthly.",
        ),
    ),
    Scenario(
        ("PetroNord", "Coastal Fuels", "Summit Oil"),
        "fuel",
        ("refinery", "refineries"),
        ("depot", "depots"),
        ("thousand barrels", "thousand barrels"),
        False,
        ("Bayport", "Ridgeway", "Fairhaven", "Kingsley"),
        ("Depot 1", "Depot 2", "Depot 3", "Depot 4", "Depot 5", "Depot 6"),
        (5, 40, 1),
        (10, 60),
        "the pipeline segment is being repaired",
        (
            "Crude prices rose last quarter.",
            "Every depot keeps a fire crew on site.",
            "Tanker trucks are leased by the month.",
        ),
    ),
)


@dataclass(frozen=True)
class TransportData:
    scenario: Scenario
    company: str
    money: Currency
    sources: tuple[str, ...]
    destinations: tuple[str, ...]
    supply: dict[str, float]
    demand: dict[str, float]
    cost: dict[tuple[str, str], float]  # only routes that exist
    route_cap: dict[tuple[str, str], float]
    exact_demand: bool

    @property
    def missing(self) -> list[tuple[str, str]]:
        return [(s, d) for s in self.sources for d in self.destinations if (s, d) not in self.cost]


class Transportation(Family):
    name = "transportation"
    title = "Transportation problem"

    def generate(self, rng: random.Random, status: str) -> Generated:
        scenario = pick(rng, SCENARIOS)
        sources = draw(rng, scenario.source_names, 2, 4)
        destinations = tuple(
            rng.sample(scenario.destination_names, rng.randint(3, min(6, len(scenario.destination_names))))
        )
        low, high = scenario.amount_range
        demand = {d: nice(rng, low, high, 5 if high > 50 else 1) for d in destinations}
        # a witness plan (each destination served by one or two sources) makes the instance
        # feasible by construction: supplies cover it, and only routes it does not use may be
        # missing or capped below its flow
        witness: dict[tuple[str, str], float] = {}
        for d in destinations:
            first, *second = rng.sample(sources, 2 if rng.random() < 0.5 else 1)
            part = float(int(demand[d] * rng.uniform(0.3, 0.7))) if second else demand[d]
            witness[first, d] = part
            if second:
                witness[second[0], d] = demand[d] - part
        used = {s: sum(flow for (source, _), flow in witness.items() if source == s) for s in sources}
        total = sum(demand.values())
        supply = {s: float(int(used[s] * rng.uniform(1.0, 1.3) + total * rng.uniform(0.02, 0.15))) + 1 for s in sources}
        cost_low, cost_high, step = scenario.cost_range
        cost = {(s, d): nice(rng, cost_low, cost_high, step) for s in sources for d in destinations}
        unused = [route for route in sorted(cost) if witness.get(route, 0) == 0]
        for route in rng.sample(unused, min(len(unused), rng.choice((0, 0, 1, 2)))):
            del cost[route]
        route_cap: dict[tuple[str, str], float] = {}
        for route in rng.sample(sorted(cost), min(len(cost), rng.choice((0, 0, 1, 2)))):
            route_cap[route] = float(int(witness.get(route, 0) + demand[route[1]] * rng.uniform(0.1, 0.5)) + 1)
        data = TransportData(
            scenario,
            pick(rng, scenario.company),
            currency(rng),
            sources,
            destinations,
            supply,
            demand,
            cost,
            route_cap,
            rng.random() < 0.4,
        )
        if status == "infeasible":
            deficit = rng.uniform(0.75, 0.95) * total / sum(supply.values())
            short = {s: float(max(1, int(value * deficit))) for s, value in supply.items()}
            data = replace(data, supply=short)
            unit = scenario.unit[1]
            note = (
                f"the {scenario.source[1]} can supply {number(sum(short.values()))} {unit} in total, "
                f"but the {scenario.destination[1]} need {number(total)} {unit}"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: TransportData) -> LinearModel:
        b = ModelBuilder("transportation")
        kind = "integer" if data.scenario.integer else "continuous"
        ship = {route: b.var(lp_name("ship", *route), kind) for route in data.cost}
        for s in data.sources:
            b.row(
                lp_name("supply", s), {ship[s, d]: 1 for d in data.destinations if (s, d) in ship}, "<=", data.supply[s]
            )
        for d in data.destinations:
            b.row(
                lp_name("demand", d),
                {ship[s, d]: 1 for s in data.sources if (s, d) in ship},
                "==" if data.exact_demand else ">=",
                data.demand[d],
            )
        for route, cap in data.route_cap.items():
            b.row(lp_name("route_cap", *route), {ship[route]: 1}, "<=", cap)
        b.minimize({ship[route]: c for route, c in data.cost.items()})
        return b.build()

    def program(self, data: TransportData) -> str:
        sc = data.scenario
        src, dst = identifier(sc.source[1]), identifier(sc.destination[1])
        vtype = "I" if sc.integer else "C"
        demand_sense = "==" if data.exact_demand else ">="
        body = f'''# ship[s, d]: {sc.unit[1]} sent from {sc.source[0]} s to {sc.destination[0]} d, on routes that exist
ship = {{(s, d): model.addVar(vtype="{vtype}", lb=0, name=f"ship[{{s}},{{d}}]") for (s, d) in cost}}

# supply: a {sc.source[0]} cannot send more than it has
for s in {src}:
    model.addCons(quicksum(ship[s, d] for d in {dst} if (s, d) in cost) <= supply[s], name=f"supply[{{s}}]")

# demand: every {sc.destination[0]} receives {"exactly" if data.exact_demand else "at least"} what it needs
for d in {dst}:
    model.addCons(quicksum(ship[s, d] for s in {src} if (s, d) in cost) {demand_sense} demand[d], name=f"demand[{{d}}]")
'''
        if data.route_cap:
            body += """
# route_cap: some routes carry a limited amount
for (s, d), cap in route_cap.items():
    model.addCons(ship[s, d] <= cap, name=f"route_cap[{s},{d}]")
"""
        body += """
# Objective: minimize the total shipping cost
model.setObjective(quicksum(cost[s, d] * ship[s, d] for (s, d) in cost), sense="minimize")
"""
        values = [
            (src, list(data.sources)),
            (dst, list(data.destinations)),
            ("supply", data.supply),
            ("demand", data.demand),
            ("cost", data.cost),
        ]
        if data.route_cap:
            values.append(("route_cap", data.route_cap))
        return assemble(
            "transportation", values, body, ["for (s, d), var in ship.items():", '    show(f"ship[{s}, {d}]", var)']
        )

    def math_model(self, data: TransportData) -> MathModel:
        sc = data.scenario
        money = data.money
        domain = r"\in \mathbb{Z}_{\ge 0}" if sc.integer else r"\ge 0"
        params = [
            ParamDef("a_s", f"supply of {sc.source[0]} $s$ ({sc.unit[1]})", data.supply, ("S",)),
            ParamDef("b_d", f"demand of {sc.destination[0]} $d$ ({sc.unit[1]})", data.demand, ("D",)),
            ParamDef(
                "c_{sd}",
                f"cost per {sc.unit[0]} shipped from $s$ to $d$ ({money.code})"
                + (
                    "; – marks a route that does not exist"
                    if any((s, d) not in data.cost for s in data.sources for d in data.destinations)
                    else ""
                ),
                data.cost,
                ("S", "D"),
            ),
        ]
        constraints = [
            ConstraintDef(
                "Supply",
                f"a {sc.source[0]} ships no more than its supply",
                r"\sum_{d:(s,d) \in A} x_{sd} \le a_s",
                "supply",
                ("S",),
                why=f"a {sc.source[0]} cannot ship more than [it has|its supply]",
            ),
            ConstraintDef(
                "Demand",
                f"each {sc.destination[0]} receives {'exactly' if data.exact_demand else 'at least'} its demand",
                r"\sum_{s:(s,d) \in A} x_{sd} " + ("= b_d" if data.exact_demand else r"\ge b_d"),
                "demand",
                ("D",),
                why=f"every {sc.destination[0]} must get [what it ordered|its full order]"
                + (
                    "" if data.exact_demand else "; delivering more is allowed but costs money, so the optimum will not"
                ),
            ),
        ]
        if data.route_cap:
            params.append(ParamDef("u_{sd}", f"capacity of a limited route ({sc.unit[1]})", data.route_cap, ("S", "D")))
            constraints.append(
                ConstraintDef(
                    "Route capacity",
                    "limited routes carry at most their capacity",
                    r"x_{sd} \le u_{sd}",
                    "route_cap",
                    (),
                    count=len(data.route_cap),
                    condition=r"(s,d) \text{ with a capacity}",
                    why="some routes have a physical limit per period",
                )
            )
        routes = [f"({s}, {d})" for (s, d) in data.cost]
        missing = ", ".join(f"({s}, {d})" for s, d in data.missing)
        routes_text = r"$S \times D$" + (f" without {missing}" if missing else "")
        return MathModel(
            title="Transportation model",
            sense="minimize",
            objective=r"\sum_{(s,d) \in A} c_{sd} x_{sd}",
            objective_description="total shipping cost",
            sets=(
                SetDef("S", "s", f"{sc.source[1]}", data.sources),
                SetDef("D", "d", f"{sc.destination[1]}", data.destinations),
                SetDef("A", "(s,d)", "routes that exist", tuple(routes), display=routes_text),
            ),
            params=tuple(params),
            variables=(
                VarDef(
                    "x_{sd}",
                    f"{sc.unit[1]} shipped from $s$ to $d$",
                    domain,
                    "ship",
                    ("A",),
                    noun=f"{sc.unit[1]} to ship on each route",
                    whole=f"goods travel in whole {sc.unit[1]}" if sc.integer else "",
                ),
            ),
            constraints=tuple(constraints),
            notes=("Route capacities apply only to the routes listed for $u_{sd}$.",) if data.route_cap else (),
        )

    def statement(self, data: TransportData, rng: random.Random) -> str:
        sc = data.scenario
        unit = sc.unit[1]
        statement = Statement(rng)
        statement.add(
            pick(
                rng,
                (
                    f"{capitalize(data.company)} ships {sc.commodity} from {len(data.sources)} {sc.source[1]} ({join(data.sources, rng)}) to {len(data.destinations)} {sc.destination[1]} ({join(data.destinations, rng)}).",
                    f"{capitalize(data.company)} has to plan next week's deliveries of {sc.commodity}. It owns {len(data.sources)} {sc.source[1]}, namely {join(data.sources, rng)}, and serves the {sc.destination[1]} {join(data.destinations, rng)}.",
                    f"The logistics team at {data.company} decides how many {unit} of {sc.commodity} to send from each of its {sc.source[1]} to each {sc.destination[0]} it serves: {join(data.destinations, rng)}. The {sc.source[1]} are {join(data.sources, rng)}.",
                    f"Consider a distribution network run by {data.company}: {len(data.sources)} {sc.source[1]} ship {sc.commodity} to {len(data.destinations)} {sc.destination[1]}.",
                ),
            )
        )
        statement.add(
            present(
                rng,
                [capitalize(sc.source[0]), f"Available ({unit})"],
                [(s, data.supply[s]) for s in data.sources],
                lambda row: pick(
                    rng,
                    (
                        f"{row[0]} can ship at most {number(row[1])} {unit}",
                        f"{row[0]} has {number(row[1])} {unit} available",
                        f"the supply at {row[0]} is {number(row[1])} {unit}",
                    ),
                ),
                intro=(
                    f"Supply available at each {sc.source[0]}:",
                    f"The {sc.source[1]} have the following capacities:",
                    "Supplies:",
                ),
            )
        )
        need = "exactly" if data.exact_demand else "at least"
        statement.add(
            present(
                rng,
                [capitalize(sc.destination[0]), f"Required ({unit})"],
                [(d, data.demand[d]) for d in data.destinations],
                lambda row: pick(
                    rng,
                    (
                        f"{row[0]} needs {need} {number(row[1])} {unit}",
                        f"{row[0]} must receive {need} {number(row[1])} {unit}",
                        f"the requirement of {row[0]} is {need} {number(row[1])} {unit}",
                    ),
                ),
                intro=(
                    f"Each {sc.destination[0]} must receive {need} the amount below:",
                    f"Requirements ({need} these amounts):",
                    f"The {sc.destination[1]} require {need}:",
                ),
            )
        )
        statement.add(self._cost_text(data, rng))
        for (s, d), cap in data.route_cap.items():
            statement.add(
                pick(
                    rng,
                    (
                        f"No more than {number(cap)} {unit} can go from {s} to {d}, because {sc.cap_reason}.",
                        f"Because {sc.cap_reason}, the route from {s} to {d} carries at most {number(cap)} {unit}.",
                    ),
                )
            )
        if data.missing:
            pairs = join([f"{s} to {d}" for s, d in data.missing], rng)
            statement.add(pick(rng, (f"There is no route from {pairs}.", f"Shipments from {pairs} are not possible.")))
        if not data.exact_demand and rng.random() < 0.5:
            statement.add(
                pick(rng, ("Not all supply has to be used.", f"A {sc.source[0]} may keep part of its supply."))
            )
        statement.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        integer_hint = f" Shipments are whole {unit}." if sc.integer and rng.random() < 0.7 else ""
        statement.question = (
            integer_hint.strip()
            + " "
            + pick(
                rng,
                (
                    f"How many {unit} should be shipped on each route to minimize the total transportation cost? Report the minimum cost.",
                    "Find the shipping plan with the lowest total cost and state that cost.",
                    "What is the minimum total cost of meeting all requirements, and which shipments achieve it?",
                    f"Determine the cheapest way to supply the {sc.destination[1]}.",
                ),
            )
        )
        return statement.text()

    def _cost_text(self, data: TransportData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        if rng.random() < 0.6:
            rows = [
                [s, *(money(data.cost[s, d]) if (s, d) in data.cost else "–" for d in data.destinations)]
                for s in data.sources
            ]
            intro = pick(
                rng,
                (
                    f"The cost per {sc.unit[0]} shipped is:",
                    f"Shipping costs ({money.code} per {sc.unit[0]}):",
                    "Unit transportation costs:",
                ),
            )
            return intro + "\n\n" + table(["From \\ To", *data.destinations], rows)
        sentences = []
        for s in data.sources:
            parts = [f"{money(data.cost[s, d])} to {d}" for d in data.destinations if (s, d) in data.cost]
            sentences.append(
                pick(
                    rng,
                    (
                        f"Shipping one {sc.unit[0]} from {s} costs {join(parts, rng)}.",
                        f"From {s}, the cost per {sc.unit[0]} is {join(parts, rng)}.",
                    ),
                )
            )
        return " ".join(sentences)

    def decisions(self, data: TransportData, values: Mapping[str, float]) -> list[str]:
        lines = []
        for s, d in data.cost:
            sent = values[lp_name("ship", s, d)]
            if abs(sent) > 1e-6:
                lines.append(f"Ship {amount(sent, data.scenario.unit)} from {s} to {d}.")
        return lines

    def what_if(self, data: TransportData, rng: random.Random) -> WhatIf:
        unit = data.scenario.unit[1]
        choice = rng.randrange(4)
        if choice == 3 and len(data.cost) > len(data.destinations):  # structural: a route closes
            route = pick(rng, sorted(data.cost))
            return WhatIf(
                f"What if the route from {route[0]} to {route[1]} were closed for the period?",
                replace(
                    data,
                    cost={key: value for key, value in data.cost.items() if key != route},
                    route_cap={key: value for key, value in data.route_cap.items() if key != route},
                ),
                f"route[{route[0]},{route[1]}]",
                1.0,
                0.0,
                change=f"the route from {route[0]} to {route[1]} is removed",
            )
        if choice in (0, 3):
            s = pick(rng, data.sources)
            factor = pick(rng, (0.8, 0.9, 1.15, 1.25))
            new = scale(data.supply[s], factor)
            return WhatIf(
                f"What if the supply at {s} changes from {number(data.supply[s])} to {number(new)} {unit}?",
                replace(data, supply={**data.supply, s: new}),
                f"supply[{s}]",
                data.supply[s],
                new,
            )
        if choice == 1:
            route = pick(rng, sorted(data.cost))
            step = data.scenario.cost_range[2]
            new = scale(data.cost[route], pick(rng, (0.5, 0.7, 1.3, 1.6)), integer=False, step=step)
            return WhatIf(
                f"What if shipping from {route[0]} to {route[1]} cost {data.money(new)} per {data.scenario.unit[0]} instead of {data.money(data.cost[route])}?",
                replace(data, cost={**data.cost, route: new}),
                f"cost[{route[0]},{route[1]}]",
                data.cost[route],
                new,
            )
        d = pick(rng, data.destinations)
        new = scale(data.demand[d], pick(rng, (0.8, 1.1, 1.2)))
        return WhatIf(
            f"What if {d} needed {number(new)} {unit} instead of {number(data.demand[d])}?",
            replace(data, demand={**data.demand, d: new}),
            f"demand[{d}]",
            data.demand[d],
            new,
        )
