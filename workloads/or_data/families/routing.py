"""Capacitated vehicle routing: vehicles of one capacity leave a depot, serve every customer's demand
exactly once and return, at the least total distance.

The two-index formulation with Miller-Tucker-Zemlin load variables (Miller, Tucker and Zemlin 1960;
the load form after Desrochers and Laporte 1991): a binary `arc` per ordered pair of locations, one
arc into and one out of every customer, at most K routes from the depot, and a load `u_j` (what the
vehicle has delivered up to and including customer j) that grows by each demand along a route. The
load rows are big-M rows with the capacity as M; they also cut every subtour that misses the depot.
The aggregate fleet inequality (at least ceil(total demand / capacity) routes) is valid for every
plan and tightens the LP relaxation; an instance whose demand exceeds what the fleet carries is
infeasible already in the relaxation, so a Farkas combination proves it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, draw, scale
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, lp_name
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import (
    Statement,
    capitalize,
    generic_distractors,
    join,
    number,
    pick,
    present,
    table,
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Scenario:
    company: tuple[str, ...]
    depots: tuple[str, ...]
    customer: tuple[str, str]  # ("café", "cafés")
    customers: tuple[str, ...]
    vehicle: tuple[str, str]  # ("van", "vans")
    load: tuple[str, str]  # ("crate", "crates")
    goods: str  # what is delivered, for the story
    demand_range: tuple[int, int]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Hearth & Grain Bakery", "Morning Loaf Co.", "Stonemill Bakers"),
        ("Central Bakery", "Riverside Bakehouse", "Old Town Ovens"),
        ("café", "cafés"),
        (
            "Café Rosa",
            "Bean Street",
            "Corner Cup",
            "Lindenhof",
            "Harbor Café",
            "Petit Jour",
            "Blue Kettle",
            "Mocha Hall",
        ),
        ("van", "vans"),
        ("crate", "crates"),
        "fresh bread",
        (2, 9),
        (
            "The bakery starts baking at 3 a.m.",
            "Sourdough is its best seller.",
            "Two new ovens were installed in spring.",
        ),
    ),
    Scenario(
        ("MediSupply", "Apex Pharma Logistics", "CareLine Wholesale"),
        ("North Warehouse", "Ringway Depot", "Eastgate Hub"),
        ("pharmacy", "pharmacies"),
        ("Greenfield", "Hillcrest", "Market Square", "Oakridge", "Parkview", "Westbrook", "Elm Court", "Kingsway"),
        ("truck", "trucks"),
        ("box", "boxes"),
        "medicines",
        (3, 12),
        ("Orders close at 6 p.m. the day before.", "Some medicines must stay below 8 degrees.", "The fleet is leased."),
    ),
    Scenario(
        ("City Food Bank", "Harvest Share", "Open Table Network"),
        ("Main Pantry", "Dockside Store", "Northside Depot"),
        ("shelter", "shelters"),
        ("St. Anne", "Hope House", "Bridge Street", "Maple Lodge", "Safe Harbor", "Unity Hall", "Cedar Place"),
        ("minibus", "minibuses"),
        ("pallet", "pallets"),
        "food parcels",
        (1, 6),
        ("Volunteers drive most of the routes.", "Donations peak in December.", "The charity has 3 part-time staff."),
    ),
    Scenario(
        ("Alpine Spring Water", "ClearFlow Drinks", "Summit Beverages"),
        ("Bottling Plant", "Valley Depot", "Lakeside Yard"),
        ("office", "offices"),
        (
            "Tower One",
            "Media Park",
            "Quayside",
            "Tech Campus",
            "City Hall",
            "Law Courts",
            "Guild House",
            "Harbor Point",
        ),
        ("lorry", "lorries"),
        ("water cooler bottle", "water cooler bottles"),
        "water cooler bottles",
        (4, 15),
        ("Empty bottles are collected on Fridays.", "The spring was bought in 1998.", "Drivers also do minor repairs."),
    ),
)


@dataclass(frozen=True)
class RoutingData:
    scenario: Scenario
    company: str
    depot: str
    customers: tuple[str, ...]
    demand: dict[str, float]
    distance: dict[tuple[str, str], float]  # every ordered pair of distinct locations, km
    capacity: float
    vehicles: int

    @property
    def locations(self) -> tuple[str, ...]:
        return (self.depot, *self.customers)

    @property
    def total_demand(self) -> float:
        return sum(self.demand.values())

    @property
    def routes_needed(self) -> int:
        """At least this many routes leave the depot: each carries at most the capacity."""
        return max(1, math.ceil(round(self.total_demand / self.capacity, 9)))


def _first_fit_decreasing(demands: list[float], capacity: float) -> int:
    bins: list[float] = []
    for demand in sorted(demands, reverse=True):
        for index, used in enumerate(bins):
            if used + demand <= capacity:
                bins[index] += demand
                break
        else:
            bins.append(demand)
    return len(bins)


class VehicleRouting(Family):
    name = "vehicle_routing"
    title = "Capacitated vehicle routing"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        customers = draw(rng, sc.customers, 4, 7)
        depot = pick(rng, sc.depots)
        demand = {c: float(rng.randint(*sc.demand_range)) for c in customers}
        total = sum(demand.values())
        # a capacity that needs two to four routes, never below the largest demand
        capacity = float(max(max(demand.values()), math.ceil(total / rng.choice((2, 2, 3, 4)))) + rng.randint(0, 3))
        points = {name: (rng.uniform(0, 20), rng.uniform(0, 20)) for name in (depot, *customers)}
        distance = {
            (a, b): float(max(1, round(math.dist(points[a], points[b])))) for a in points for b in points if a != b
        }
        for a, b in list(distance):  # symmetric road distances
            distance[b, a] = distance[a, b]
        vehicles = _first_fit_decreasing(list(demand.values()), capacity) + rng.randint(0, 1)
        data = RoutingData(sc, pick(rng, sc.company), depot, customers, demand, distance, capacity, vehicles)
        if status == "infeasible":
            needed = data.routes_needed
            if needed < 2:  # make the demand outgrow one vehicle first
                data = replace(data, capacity=float(max(max(demand.values()), math.ceil(total / 2))))
                needed = data.routes_needed
            data = replace(data, vehicles=needed - 1)
            note = (
                f"the {sc.customer[1]} need {number(total)} {sc.load[1]} in total, but {data.vehicles} "
                f"{sc.vehicle[0] if data.vehicles == 1 else sc.vehicle[1]} of {number(data.capacity)} {sc.load[1]} "
                f"carry at most {number(data.vehicles * data.capacity)}"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: RoutingData) -> LinearModel:
        b = ModelBuilder("vehicle_routing")
        arc = {pair: b.var(lp_name("arc", *pair), "binary") for pair in data.distance}
        load = {c: b.var(lp_name("load", c), lower=data.demand[c], upper=data.capacity) for c in data.customers}
        for j in data.customers:
            b.row(lp_name("enter", j), {arc[i, j]: 1 for i in data.locations if i != j}, "==", 1)
        for j in data.customers:
            b.row(lp_name("leave", j), {arc[j, k]: 1 for k in data.locations if k != j}, "==", 1)
        starts = {arc[data.depot, j]: 1 for j in data.customers}
        b.row("fleet", starts, "<=", data.vehicles)
        b.row("routes_needed", starts, ">=", data.routes_needed)
        for i in data.customers:
            for j in data.customers:
                if i != j:
                    # u_j - u_i - Q x_ij >= d_j - Q
                    b.row(
                        lp_name("load", i, j),
                        {load[j]: 1, load[i]: -1, arc[i, j]: -data.capacity},
                        ">=",
                        data.demand[j] - data.capacity,
                    )
        b.minimize({arc[pair]: km for pair, km in data.distance.items()})
        return b.build()

    def program(self, data: RoutingData) -> str:
        sc = data.scenario
        body = f"""# arc[i, j] = 1 when a {sc.vehicle[0]} drives from i straight to j
arc = {{(i, j): model.addVar(vtype="B", name=f"arc[{{i}},{{j}}]") for (i, j) in distance}}

# load[j] = {sc.load[1]} delivered on the route up to and including j (its own demand up to the capacity)
load = {{j: model.addVar(vtype="C", lb=demand[j], ub=capacity, name=f"load[{{j}}]") for j in customers}}

# enter: every {sc.customer[0]} is reached exactly once
for j in customers:
    model.addCons(quicksum(arc[i, j] for i in locations if i != j) == 1, name=f"enter[{{j}}]")

# leave: and left exactly once
for j in customers:
    model.addCons(quicksum(arc[j, k] for k in locations if k != j) == 1, name=f"leave[{{j}}]")

# fleet: at most one route per {sc.vehicle[0]} starts at the depot
model.addCons(quicksum(arc[depot, j] for j in customers) <= vehicles, name="fleet")

# routes_needed: the demand needs at least this many routes, a valid inequality
model.addCons(quicksum(arc[depot, j] for j in customers) >= routes_needed, name="routes_needed")

# load: the amount delivered grows by each demand along a route; the capacity is the big-M
for i in customers:
    for j in customers:
        if i != j:
            model.addCons(load[j] >= load[i] + demand[j] - capacity * (1 - arc[i, j]), name=f"load[{{i}},{{j}}]")

# Objective: minimize the total distance driven
model.setObjective(quicksum(distance[i, j] * arc[i, j] for (i, j) in distance), sense="minimize")
"""
        values: list[tuple[str, object]] = [
            ("depot", data.depot),
            ("customers", list(data.customers)),
            ("locations", list(data.locations)),
            ("demand", data.demand),
            ("distance", data.distance),
            ("capacity", data.capacity),
            ("vehicles", data.vehicles),
            ("routes_needed", data.routes_needed),
        ]
        return assemble(
            "vehicle_routing", values, body, ["for (i, j), var in arc.items():", '    show(f"arc[{i},{j}]", var)']
        )

    def math_model(self, data: RoutingData) -> MathModel:
        sc = data.scenario
        n = len(data.customers)
        return MathModel(
            title="Capacitated vehicle routing model (two-index, MTZ load constraints)",
            sense="minimize",
            objective=r"\sum_{(i,j) \in A} c_{ij} x_{ij}",
            objective_description="total distance driven",
            sets=(
                SetDef(
                    "V", "i", f"locations: the depot {data.depot} (index 0), then the {sc.customer[1]}", data.locations
                ),
                SetDef("C", "j", sc.customer[1], data.customers),
                SetDef(
                    "A",
                    "(i,j)",
                    "arcs (ordered pairs of distinct locations)",
                    tuple(f"({a}, {b})" for a, b in data.distance),
                    display=r"$\{(i,j) \in V \times V : i \ne j\}$",
                ),
                SetDef(
                    "P",
                    "(i,j)",
                    f"ordered pairs of distinct {sc.customer[1]}",
                    tuple(f"({a}, {b})" for a in data.customers for b in data.customers if a != b),
                    display=r"$\{(i,j) \in C \times C : i \ne j\}$",
                ),
            ),
            params=(
                ParamDef("c_{ij}", "distance from $i$ to $j$ (km)", data.distance, ("V", "V")),
                ParamDef("d_j", f"demand of {sc.customer[0]} $j$ ({sc.load[1]})", data.demand, ("C",)),
                ParamDef("Q", f"capacity of a {sc.vehicle[0]} ({sc.load[1]})", data.capacity),
                ParamDef("K", f"{sc.vehicle[1]} available", data.vehicles),
                ParamDef("m", r"routes the demand needs at least, $\lceil \sum_j d_j / Q \rceil$", data.routes_needed),
            ),
            variables=(
                VarDef(
                    "x_{ij}",
                    f"1 if a {sc.vehicle[0]} drives from $i$ straight to $j$",
                    r"\in \{0, 1\}",
                    "arc",
                    ("A",),
                    indicator=f"whether a {sc.vehicle[0]} drives straight from each location to each other one",
                ),
                VarDef(
                    "u_j",
                    f"{sc.load[1]} delivered on the route up to and including $j$",
                    r"\in [d_j, Q]",
                    "load",
                    ("C",),
                    noun=f"{sc.load[1]} delivered on the route so far when each {sc.customer[0]} is served",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Enter",
                    f"every {sc.customer[0]} is reached exactly once",
                    r"\sum_{i \in V,\, i \ne j} x_{ij} = 1",
                    "enter",
                    ("C",),
                    why=f"each {sc.customer[0]} is served by one visit, so exactly one arc [leads into it|enters it]",
                ),
                ConstraintDef(
                    "Leave",
                    f"every {sc.customer[0]} is left exactly once",
                    r"\sum_{k \in V,\, k \ne j} x_{jk} = 1",
                    "leave",
                    ("C",),
                    why=f"the {sc.vehicle[0]} that arrives has to drive on, so exactly one arc leaves it; with Enter "
                    "this makes the chosen arcs a set of paths and cycles",
                ),
                ConstraintDef(
                    "Fleet",
                    "at most $K$ routes start at the depot",
                    r"\sum_{j \in C} x_{0j} \le K",
                    "fleet",
                    why=f"every route needs a {sc.vehicle[0]} of its own and only {data.vehicles} [are available|can be used]",
                ),
                ConstraintDef(
                    "Routes needed",
                    "at least $m$ routes start at the depot",
                    r"\sum_{j \in C} x_{0j} \ge m",
                    "routes_needed",
                    why=f"a route carries at most {number(data.capacity)} {sc.load[1]}, so the "
                    f"{number(data.total_demand)} {sc.load[1]} of demand need at least {data.routes_needed} routes",
                    technique="Every feasible plan satisfies it already; [stating it adds no restriction but closes "
                    "part of the gap between the LP relaxation and the integer optimum|it removes no plan, yet it "
                    "narrows the gap between the LP relaxation and the integer optimum], and it [exposes at once a "
                    "fleet too small for the demand|shows at once when the fleet is too small for the demand].",
                ),
                ConstraintDef(
                    "Load",
                    "the amount delivered grows by each demand along a route",
                    r"u_j \ge u_i + d_j - Q\,(1 - x_{ij})",
                    "load",
                    ("P",),
                    count=n * (n - 1),
                    why=f"what a {sc.vehicle[0]} has delivered after a {sc.customer[0]} is what it had delivered "
                    "before plus that demand, and it can never exceed the capacity; a cycle among the "
                    f"{sc.customer[1]} that skips the depot would need the load to grow all the way round, so "
                    "these rows also rule out such subtours",
                    technique=(
                        "This is a big-M constraint whose big-M value is the capacity: when the arc is not used "
                        "the term switches the row off (the amount delivered up to any stop lies between its "
                        "demand and the capacity, so the row always holds), and when it is used the row reads "
                        "exactly 'the next load is the previous one plus the demand'. A larger big-M value "
                        "would be correct too, but would weaken the LP relaxation."
                    ),
                ),
            ),
        )

    def statement(self, data: RoutingData, rng: random.Random) -> str:
        sc = data.scenario
        st = Statement(rng)
        count = len(data.customers)
        st.add(
            pick(
                rng,
                (
                    f"{data.company} delivers {sc.goods} from {data.depot} to {count} {sc.customer[1]}: "
                    f"{join(data.customers, rng)}.",
                    f"Every morning {data.company} sends its {sc.vehicle[1]} out of {data.depot} with {sc.goods} "
                    f"for {count} {sc.customer[1]} ({join(data.customers, rng)}).",
                    f"{data.company} has to plan tomorrow's delivery rounds: {count} {sc.customer[1]} "
                    f"({join(data.customers, rng)}) are waiting for {sc.goods} from {data.depot}.",
                    f"The dispatcher at {data.company} plans the routes of its {sc.vehicle[1]}, which start and end "
                    f"at {data.depot} and serve {count} {sc.customer[1]}.",
                    f"From {data.depot}, {data.company} supplies {count} {sc.customer[1]} with {sc.goods}.",
                ),
            )
        )
        fleet = f"{data.vehicles} {sc.vehicle[0] if data.vehicles == 1 else sc.vehicle[1]}"
        st.add(
            pick(
                rng,
                (
                    f"There are {fleet}, each able to carry {number(data.capacity)} {sc.load[1]}.",
                    f"The fleet has {fleet} with room for {number(data.capacity)} {sc.load[1]} each.",
                    f"Each {sc.vehicle[0]} holds at most {number(data.capacity)} {sc.load[1]}, and {fleet} "
                    f"{'is' if data.vehicles == 1 else 'are'} available.",
                ),
            )
            + " "
            + pick(
                rng,
                (
                    f"Every {sc.vehicle[0]} that is used drives one round that starts and ends at the depot.",
                    f"A {sc.vehicle[0]} makes at most one round, returning to {data.depot} at the end.",
                    f"Each route begins and ends at {data.depot}.",
                ),
            )
        )
        st.add(
            present(
                rng,
                [capitalize(sc.customer[0]), f"Demand ({sc.load[1]})"],
                [[c, number(data.demand[c])] for c in data.customers],
                lambda row: f"{row[0]} needs {row[1]} {sc.load[1] if row[1] != '1' else sc.load[0]}",
                intro=(
                    f"Orders ({sc.load[1]}):",
                    f"What each {sc.customer[0]} ordered:",
                    f"The demand of each {sc.customer[0]} in {sc.load[1]}:",
                ),
            )
        )
        st.add(
            pick(
                rng,
                (
                    "Road distances in km (the same in both directions):",
                    "The distances between the locations, in kilometers:",
                    "Driving distances (km):",
                ),
            )
            + "\n\n"
            + table(
                ["km", *data.locations],
                [
                    [a, *("–" if a == b else number(data.distance[a, b]) for b in data.locations)]
                    for a in data.locations
                ],
            )
        )
        st.add(
            pick(
                rng,
                (
                    f"Every {sc.customer[0]} must be served by exactly one visit, and no {sc.vehicle[0]} may carry "
                    "more than its capacity.",
                    f"An order cannot be split between two {sc.vehicle[1]}, and no {sc.vehicle[0]} may be loaded "
                    "beyond its capacity.",
                    f"Each {sc.customer[0]} is visited once, by one {sc.vehicle[0]}, which brings its whole order.",
                ),
            )
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                "Plan the routes that serve every order with the least total distance.",
                f"Which {sc.customer[1]} should each {sc.vehicle[0]} visit, and in which order, to drive as few "
                "kilometers as possible?",
                "Find the delivery rounds of minimum total length and report that length.",
                f"Design the {sc.vehicle[0]} routes and give the shortest possible total distance.",
                "How should the rounds be planned to minimize the kilometers driven?",
            ),
        )
        return st.text()

    def decisions(self, data: RoutingData, values: Mapping[str, float]) -> list[str]:
        sc = data.scenario
        successor = {a: b for (a, b) in data.distance if values[lp_name("arc", a, b)] > 0.5 and a != data.depot}
        starts = [b for b in data.customers if values[lp_name("arc", data.depot, b)] > 0.5]
        lines = []
        for number_, first in enumerate(starts, start=1):
            stops, current = [first], first
            while successor.get(current, data.depot) != data.depot and len(stops) <= len(data.customers):
                current = successor[current]
                stops.append(current)
            path = [data.depot, *stops, data.depot]
            km = sum(data.distance[a, b] for a, b in zip(path, path[1:], strict=False))
            load = sum(data.demand[stop] for stop in stops)
            lines.append(
                f"{capitalize(sc.vehicle[0])} {number_} drives {' → '.join(path)}, delivering {number(load)} "
                f"{sc.load[1] if load != 1 else sc.load[0]} over {number(km)} km."
            )
        return lines

    def what_if(self, data: RoutingData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        if rng.random() < 0.5:
            new = scale(data.capacity, pick(rng, (1.25, 1.5, 2.0)))
            return WhatIf(
                f"What if every {sc.vehicle[0]} could carry {number(new)} {sc.load[1]} instead of "
                f"{number(data.capacity)}?",
                replace(data, capacity=new),
                "capacity",
                data.capacity,
                new,
            )
        customer = pick(rng, data.customers)
        new = min(data.capacity, scale(data.demand[customer], pick(rng, (0.5, 1.5, 2.0))))
        if new == data.demand[customer]:
            new = max(1.0, data.demand[customer] - 1)
        return WhatIf(
            f"What if {customer} ordered {number(new)} {sc.load[1] if new != 1 else sc.load[0]} instead of "
            f"{number(data.demand[customer])}?",
            replace(data, demand={**data.demand, customer: new}),
            f"demand[{customer}]",
            data.demand[customer],
            new,
        )
