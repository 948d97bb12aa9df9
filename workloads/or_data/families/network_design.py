"""Multi-commodity network design: several commodities, each with its own origin, destination and
amount, share the capacity of a network's links; some links already exist, others can be built
at a fixed cost. Flow is conserved per commodity at every node, the commodities compete for each
link's capacity, and a candidate link carries nothing unless it is built (the fixed-charge
capacitated multi-commodity network design problem; Magnanti & Wong, "Network Design and
Transportation Planning", Transportation Science 18(1), 1984).
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
    operator: tuple[str, ...]
    network: str
    link: tuple[str, str]
    origins: tuple[str, ...]
    hubs: tuple[str, ...]
    destinations: tuple[str, ...]
    commodities: tuple[str, ...]
    unit: tuple[str, str]
    cost_range: tuple[float, float, float]
    build_range: tuple[float, float, float]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Baltic Logistics", "EuroHaul", "Danube Freight"),
        "regional freight network",
        ("lane", "lanes"),
        ("Port Gdansk", "Port Rostock", "Inland Port"),
        ("Hub Poznan", "Hub Berlin", "Cross-Dock Leipzig"),
        ("Prague", "Vienna", "Dresden", "Brno"),
        ("grain", "fertilizer", "machinery", "timber", "steel coils"),
        ("ton", "tons"),
        (4, 20, 1),
        (3000, 12000, 500),
        ("Lanes are reviewed every spring.", "Trucks carry GPS trackers."),
    ),
    Scenario(
        ("MetroNet", "FiberGrid", "OptiLink"),
        "metropolitan data network",
        ("fiber link", "fiber links"),
        ("Data Center North", "Data Center South"),
        ("Core Router A", "Core Router B", "Aggregation Site"),
        ("Campus East", "Business Park", "Hospital District", "Old Town"),
        ("video traffic", "backup traffic", "voice traffic", "sensor traffic"),
        ("Gbps", "Gbps"),
        (1, 8, 0.5),
        (2000, 9000, 250),
        ("Most traffic peaks in the evening.", "The operator leases dark fiber."),
    ),
    Scenario(
        ("Andes Rail", "Cordillera Cargo", "Pacific Lines"),
        "rail freight network",
        ("rail link", "rail links"),
        ("Mine Alta", "Mine Baja", "Quarry Sur"),
        ("Junction Norte", "Junction Centro", "Yard Oeste"),
        ("Port Valpo", "Smelter East", "Plant Norte", "Port Antofa"),
        ("copper ore", "lime", "sulfuric acid", "containers"),
        ("thousand tons", "thousand tons"),
        (2, 12, 0.5),
        (4000, 15000, 500),
        ("Trains run on diesel.", "The track gauge is 1,000 mm."),
    ),
)


@dataclass(frozen=True)
class DesignData:
    scenario: Scenario
    operator: str
    money: Currency
    nodes: tuple[str, ...]
    arcs: tuple[tuple[str, str], ...]
    capacity: dict[tuple[str, str], float]
    cost: dict[tuple[str, str], float]  # per unit of any commodity
    build_cost: dict[tuple[str, str], float]  # candidate links only
    commodities: tuple[str, ...]
    origin: dict[str, str]
    destination: dict[str, str]
    amount: dict[str, float]


def _big_m_words(data: DesignData) -> str:
    """What the capacity is as a big-M. It is the tightest one only when no candidate link could
    carry more than all commodities together; otherwise that total would be tighter (the tenth
    session's review #4: "the tightest big-M possible" for a 75-ton link when only 65 tons exist)."""
    total = sum(data.amount.values())
    looser = [arc for arc in data.build_cost if data.capacity[arc] > total + 1e-9]
    if not looser:
        return (
            "[the capacity itself is the tightest big-M possible here, as no candidate can carry more than all "
            "commodities together|no flow can exceed the capacity anyway, and no candidate's capacity is above "
            "all commodities together, so it is the natural big-M]."
        )
    unit = data.scenario.unit[1]
    return (
        f"the capacity is a valid big-M, as no flow can exceed it; where it is above the {number(total)} {unit} of "
        f"all commodities together ({join([f'{i} → {j}' for i, j in looser])}), that total would be a tighter one."
    )


class NetworkDesign(Family):
    name = "network_design"
    title = "Multi-commodity network design"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        origins = tuple(rng.sample(sc.origins, 2))
        hubs = tuple(rng.sample(sc.hubs, rng.randint(2, 3)))
        destinations = tuple(rng.sample(sc.destinations, rng.randint(2, 3)))
        nodes = origins + hubs + destinations
        arcs = {(o, h) for o in origins for h in rng.sample(hubs, rng.randint(1, len(hubs)))}
        arcs |= {(h, d) for h in hubs for d in rng.sample(destinations, rng.randint(1, len(destinations)))}
        arcs |= {(o, d) for o in origins for d in destinations if rng.random() < 0.25}  # direct links
        for h in hubs:  # every hub reachable from an origin and leading to a destination
            if not any(head == h for _, head in arcs):
                arcs.add((origins[0], h))
            if not any(tail == h for tail, _ in arcs):
                arcs.add((h, destinations[0]))
        for o in origins:
            if not any(tail == o for tail, _ in arcs):
                arcs.add((o, hubs[0]))
        for d in destinations:
            if not any(head == d for _, head in arcs):
                arcs.add((hubs[0], d))
        arc_list = tuple(sorted(arcs, key=lambda arc: (nodes.index(arc[0]), nodes.index(arc[1]))))
        count = rng.randint(2, min(4, len(sc.commodities)))
        commodities = tuple(rng.sample(sc.commodities, count))
        origin = {k: pick(rng, origins) for k in commodities}
        destination = {k: pick(rng, destinations) for k in commodities}
        amounts = {k: float(rng.randint(2, 12) * 5) for k in commodities}
        # a witness routing: each commodity along one path; capacities cover the witness
        load = {arc: 0.0 for arc in arc_list}
        for k in commodities:
            path = _path(origin[k], destination[k], arc_list, rng)
            if path is None:  # no route from this origin to that destination: send it elsewhere
                reachable = [d for d in destinations if _path(origin[k], d, arc_list, rng) is not None]
                destination[k] = pick(rng, reachable)
                path = _path(origin[k], destination[k], arc_list, rng)
            assert path is not None
            for arc in zip(path, path[1:], strict=False):
                load[arc] += amounts[k]
        capacity = {arc: float(max(load[arc] + 5 * rng.randint(0, 6), 5 * rng.randint(4, 16))) for arc in arc_list}
        cost = {arc: nice(rng, *sc.cost_range) for arc in arc_list}
        candidates = rng.sample(list(arc_list), max(1, len(arc_list) // 3))
        build_cost = {arc: nice(rng, *sc.build_range) for arc in arc_list if arc in candidates}
        data = DesignData(
            sc,
            pick(rng, sc.operator),
            currency(rng),
            nodes,
            arc_list,
            capacity,
            cost,
            build_cost,
            commodities,
            origin,
            destination,
            amounts,
        )
        if status == "infeasible":  # one commodity needs more than every link out of its origin can carry
            k = pick(rng, commodities)
            outgoing = sum(capacity[arc] for arc in arc_list if arc[0] == origin[k])
            new = float(int(outgoing * rng.uniform(1.05, 1.3) / 5 + 1) * 5)
            data = replace(data, amount={**amounts, k: new})
            note = (
                f"{number(new)} {sc.unit[1]} of {k} must leave {origin[k]}, but the {sc.link[1]} out of it can carry "
                f"only {number(outgoing)} together, even with every candidate built"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: DesignData) -> LinearModel:
        b = ModelBuilder("network_design")
        flow = {(k, *arc): b.var(lp_name("flow", k, *arc)) for k in data.commodities for arc in data.arcs}
        build = {arc: b.var(lp_name("build", *arc), "binary") for arc in data.build_cost}
        for k in data.commodities:
            for n in data.nodes:
                terms = {flow[(k, *arc)]: 1.0 for arc in data.arcs if arc[0] == n}
                terms.update({flow[(k, *arc)]: -1.0 for arc in data.arcs if arc[1] == n})
                supply = data.amount[k] if n == data.origin[k] else -data.amount[k] if n == data.destination[k] else 0.0
                b.row(lp_name("balance", k, n), terms, "==", supply)
        for arc in data.arcs:
            terms = {flow[(k, *arc)]: 1.0 for k in data.commodities}
            if arc in build:
                terms[build[arc]] = -data.capacity[arc]
                b.row(lp_name("capacity", *arc), terms, "<=", 0.0)
            else:
                b.row(lp_name("capacity", *arc), terms, "<=", data.capacity[arc])
        objective = {flow[(k, *arc)]: data.cost[arc] for k in data.commodities for arc in data.arcs}
        objective.update({build[arc]: data.build_cost[arc] for arc in build})
        b.minimize(objective)
        return b.build()

    def program(self, data: DesignData) -> str:
        sc = data.scenario
        body = f"""# flow[k, i, j]: {sc.unit[1]} of commodity k sent along the {sc.link[0]} from i to j
flow = {{
    (k, i, j): model.addVar(vtype="C", lb=0, name=f"flow[{{k}},{{i}},{{j}}]")
    for k in commodities
    for (i, j) in capacity
}}

# build[i, j] = 1 when the candidate {sc.link[0]} from i to j is built
build = {{(i, j): model.addVar(vtype="B", name=f"build[{{i}},{{j}}]") for (i, j) in build_cost}}

# balance: per commodity, what leaves a node minus what enters is its supply there; a demand is a negative supply
for k in commodities:
    for n in nodes:
        out_flow = quicksum(flow[k, i, j] for (i, j) in capacity if i == n)
        in_flow = quicksum(flow[k, i, j] for (i, j) in capacity if j == n)
        net = amount[k] if n == origin[k] else (-amount[k] if n == destination[k] else 0)
        model.addCons(out_flow - in_flow == net, name=f"balance[{{k}},{{n}}]")

# capacity: the commodities share each {sc.link[0]}; a candidate carries nothing unless built
for (i, j) in capacity:
    usable = capacity[i, j] * build[i, j] if (i, j) in build_cost else capacity[i, j]
    model.addCons(quicksum(flow[k, i, j] for k in commodities) <= usable, name=f"capacity[{{i}},{{j}}]")

# Objective: minimize routing cost plus the cost of the links built
model.setObjective(
    quicksum(cost[i, j] * flow[k, i, j] for (k, i, j) in flow) + quicksum(build_cost[a] * build[a] for a in build),
    sense="minimize",
)
"""
        values = [
            ("nodes", list(data.nodes)),
            ("commodities", list(data.commodities)),
            ("origin", data.origin),
            ("destination", data.destination),
            ("amount", data.amount),
            ("capacity", data.capacity),
            ("cost", data.cost),
            ("build_cost", data.build_cost),
        ]
        report = [
            "for (i, j), var in build.items():",
            '    show(f"build[{i}, {j}]", var)',
            "for (k, i, j), var in flow.items():",
            '    show(f"flow[{k}, {i}, {j}]", var)',
        ]
        return assemble("network_design", values, body, report)

    def math_model(self, data: DesignData) -> MathModel:
        sc, code = data.scenario, data.money.code
        arcs = tuple(f"({i}, {j})" for i, j in data.arcs)
        candidates = tuple(f"({i}, {j})" for i, j in data.arcs if (i, j) in data.build_cost)
        return MathModel(
            title="Fixed-charge multi-commodity network design model",
            sense="minimize",
            objective=r"\sum_{k \in K} \sum_{(i,j) \in A} c_{ij} x_{kij} + \sum_{(i,j) \in A^{new}} f_{ij} y_{ij}",
            objective_description="routing cost plus the cost of the links built",
            sets=(
                SetDef("N", "n", "nodes", data.nodes),
                SetDef("A", "(i,j)", f"{sc.link[1]} (directed arcs)", arcs),
                SetDef("A^{new}", "(i,j)", f"candidate {sc.link[1]} that can be built", candidates),
                SetDef("K", "k", "commodities", data.commodities),
            ),
            params=(
                ParamDef("o_k", "origin of commodity $k$", {k: data.origin[k] for k in data.commodities}, ("K",)),
                ParamDef(
                    "t_k", "destination of commodity $k$", {k: data.destination[k] for k in data.commodities}, ("K",)
                ),
                ParamDef("q_k", f"amount of commodity $k$ ({sc.unit[1]})", data.amount, ("K",)),
                ParamDef(
                    "u_{ij}",
                    f"capacity of the {sc.link[0]} from $i$ to $j$ ({sc.unit[1]})",
                    {f"({i}, {j})": value for (i, j), value in data.capacity.items()},
                    ("A",),
                ),
                ParamDef(
                    "c_{ij}",
                    f"cost per {sc.unit[0]} on the {sc.link[0]} from $i$ to $j$ ({code})",
                    {f"({i}, {j})": value for (i, j), value in data.cost.items()},
                    ("A",),
                ),
                ParamDef(
                    "f_{ij}",
                    f"cost of building the {sc.link[0]} from $i$ to $j$ ({code})",
                    {f"({i}, {j})": value for (i, j), value in data.build_cost.items()},
                    ("A^{new}",),
                ),
            ),
            variables=(
                VarDef(
                    "x_{kij}",
                    f"{sc.unit[1]} of commodity $k$ on arc $(i,j)$",
                    r"\ge 0",
                    "flow",
                    ("K", "A"),
                    noun=f"{sc.unit[1]} of each commodity to send along each {sc.link[0]}",
                ),
                VarDef(
                    "y_{ij}",
                    "1 if the candidate arc $(i,j)$ is built",
                    r"\in \{0, 1\}",
                    "build",
                    ("A^{new}",),
                    indicator=f"whether to build each candidate {sc.link[0]}",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Flow balance",
                    "per commodity, outflow minus inflow equals its supply at the node",
                    r"\sum_{(n,j) \in A} x_{knj} - \sum_{(i,n) \in A} x_{kin} = "
                    r"\begin{cases} q_k & n = o_k \\ -q_k & n = t_k \\ 0 & \text{otherwise} \end{cases}",
                    "balance",
                    ("K", "N"),
                    why="each commodity is a separate flow: it leaves its own origin, reaches its own destination "
                    "and [is neither created nor lost on the way|nothing of it appears or vanishes in between], so "
                    "[conservation must hold for every commodity at every node|every node needs one balance row per "
                    "commodity]",
                ),
                ConstraintDef(
                    "Capacity",
                    "all commodities together stay within a link's capacity; a candidate needs to be built",
                    r"\sum_{k \in K} x_{kij} \le u_{ij} \, [y_{ij} \text{ if } (i,j) \in A^{new}]",
                    "capacity",
                    ("A",),
                    why="the commodities [compete for the same links|share the links], so their total on a link "
                    "is limited, and a link that is not built [cannot carry anything|carries nothing]",
                    technique="[On a candidate link the capacity is multiplied by the build variable|A candidate "
                    "link's capacity carries the build variable as a factor]: with $y_{ij} = 0$ the right-hand side is 0 "
                    "and the link is closed, with $y_{ij} = 1$ its full capacity opens. [This linking constraint is "
                    "what charges the fixed cost whenever a link is used|Because of this link, no flow can use a "
                    "candidate without its fixed cost being paid]; " + _big_m_words(data),
                ),
            ),
        )

    def statement(self, data: DesignData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        unit, link = sc.unit, sc.link
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.operator} routes {len(data.commodities)} commodities through its {sc.network} and may "
                    f"build new {link[1]}.",
                    f"The planners of {data.operator}'s {sc.network} must route several flows at once and decide "
                    f"which new {link[1]} are worth building.",
                    f"{data.operator} runs a {sc.network} with {len(data.nodes)} nodes: {join(list(data.nodes))}.",
                    f"Several commodities share the {link[1]} of {data.operator}'s {sc.network}, and capacity "
                    "is tight.",
                    f"{data.operator} is deciding whether to extend its {sc.network} before the next season.",
                    f"How should {data.operator} move {join(list(data.commodities))} through its {sc.network}?",
                ),
            )
        )
        st.add(
            present(
                rng,
                ["Commodity", "From", "To", f"Amount ({unit[1]})"],
                [(k, data.origin[k], data.destination[k], number(data.amount[k])) for k in data.commodities],
                lambda row: pick(
                    rng,
                    (
                        f"{row[3]} {unit[1]} of {row[0]} must go from {row[1]} to {row[2]}",
                        f"{row[0]}: {row[3]} {unit[1]} from {row[1]} to {row[2]}",
                    ),
                ),
                intro=("The flows to route:", "Shipments this period:", "Commodities and their routes:"),
            )
        )
        existing = [arc for arc in data.arcs if arc not in data.build_cost]
        st.add(
            present(
                rng,
                [capitalize(link[0]), f"Capacity ({unit[1]})", f"Cost per {unit[0]}"],
                [(f"{i} → {j}", number(data.capacity[i, j]), money(data.cost[i, j])) for i, j in existing],
                lambda row: f"the {link[0]} {row[0]} carries up to {row[1]} {unit[1]} at {row[2]} per {unit[0]}",
                intro=(f"Existing {link[1]}:", f"The {link[1]} already in service:", f"Current {link[1]}:"),
            )
        )
        st.add(
            present(
                rng,
                [capitalize(link[0]), "Build cost", f"Capacity ({unit[1]})", f"Cost per {unit[0]}"],
                [
                    (f"{i} → {j}", money(data.build_cost[i, j]), number(data.capacity[i, j]), money(data.cost[i, j]))
                    for i, j in data.arcs
                    if (i, j) in data.build_cost
                ],
                lambda row: (
                    f"building {row[0]} would cost {row[1]} and give {row[2]} {unit[1]} of capacity at "
                    f"{row[3]} per {unit[0]}"
                ),
                intro=(
                    f"Candidate {link[1]} (built at a one-time cost):",
                    f"New {link[1]} that could be built:",
                    "Possible extensions:",
                ),
            )
        )
        st.add(
            pick(
                rng,
                (
                    f"All commodities share a {link[0]}'s capacity; flows may be split over several routes.",
                    f"The capacity of a {link[0]} is shared by everything sent along it, and any commodity may use "
                    "several paths.",
                ),
            )
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"Which {link[1]} should be built, and how should each commodity be routed, to minimize total cost?",
                "Find the network extension and routing with the lowest total cost.",
                "What is the minimum total cost of building and routing, and which plan achieves it?",
                f"Decide the new {link[1]} and the flows so that every shipment arrives at least cost.",
                "Determine the cheapest combination of new links and routes.",
                f"Plan the {link[1]} to build and the routing of every commodity at minimum cost.",
            ),
        )
        return st.text()

    def decisions(self, data: DesignData, values: Mapping[str, float]) -> list[str]:
        unit, link = data.scenario.unit, data.scenario.link
        lines = []
        built = [arc for arc in data.build_cost if values.get(lp_name("build", *arc), 0.0) > 0.5]
        for i, j in built:
            lines.append(f"Build the {link[0]} {i} → {j}.")
        if not built and data.build_cost:
            lines.append(f"Build no new {link[0]}.")
        for k in data.commodities:
            legs = [
                f"{amount(values[lp_name('flow', k, *arc)], unit)} on {arc[0]} → {arc[1]}"
                for arc in data.arcs
                if values.get(lp_name("flow", k, *arc), 0.0) > 1e-6
            ]
            if legs:
                lines.append(f"{capitalize(k)}: {join(legs)}.")
        return lines

    def what_if(self, data: DesignData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        choice = rng.randrange(3)
        if choice == 0 and data.build_cost:
            arc = pick(rng, sorted(data.build_cost))
            new = scale(data.build_cost[arc], pick(rng, (0.5, 0.75, 1.5)), integer=False, step=sc.build_range[2])
            return WhatIf(
                f"What if building {arc[0]} → {arc[1]} cost {data.money(new)} instead of "
                f"{data.money(data.build_cost[arc])}?",
                replace(data, build_cost={**data.build_cost, arc: new}),
                f"build_cost[{arc[0]},{arc[1]}]",
                data.build_cost[arc],
                new,
            )
        if choice == 1:
            k = pick(rng, data.commodities)
            new = scale(data.amount[k], pick(rng, (0.8, 1.2, 1.4)), step=5)
            return WhatIf(
                f"What if {number(new)} {sc.unit[1]} of {k} had to be moved instead of {number(data.amount[k])}?",
                replace(data, amount={**data.amount, k: new}),
                f"amount[{k}]",
                data.amount[k],
                new,
            )
        arc = pick(rng, list(data.arcs))
        new = scale(data.capacity[arc], pick(rng, (0.6, 0.8, 1.3)), step=5)
        return WhatIf(
            f"What if the {sc.link[0]} {arc[0]} → {arc[1]} could carry {number(new)} {sc.unit[1]} instead of "
            f"{number(data.capacity[arc])}?",
            replace(data, capacity={**data.capacity, arc: new}),
            f"capacity[{arc[0]},{arc[1]}]",
            data.capacity[arc],
            new,
        )


def _path(start: str, goal: str, arcs, rng: random.Random) -> list[str] | None:
    """A random simple path from `start` to `goal` along `arcs` (depth-first, shuffled), or None."""
    stack = [[start]]
    while stack:
        path = stack.pop()
        if path[-1] == goal:
            return path
        nexts = [head for tail, head in arcs if tail == path[-1] and head not in path]
        rng.shuffle(nexts)
        stack.extend(path + [head] for head in nexts)
    return None
