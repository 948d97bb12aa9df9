"""Network flow: move a commodity through a directed network with arc capacities. Two
structures: minimum-cost flow from supply to demand nodes through transshipment points, and
maximum flow from a source to a sink."""

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
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Scenario:
    operator: tuple[str, ...]
    commodity: str
    network: str  # "pipeline network"
    node_names: tuple[str, ...]
    link: tuple[str, str]  # ("pipeline", "pipelines")
    unit: tuple[str, str]
    integer: bool
    cost_range: tuple[float, float, float]
    cap_range: tuple[int, int]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Gulf Pipelines", "TransOil", "Northern Gas Grid"),
        "crude oil",
        "pipeline network",
        (
            "Terminal A",
            "Terminal B",
            "Pump Station 1",
            "Pump Station 2",
            "Junction X",
            "Junction Y",
            "Refinery East",
            "Refinery West",
            "Storage Hub",
        ),
        ("pipeline", "pipelines"),
        ("thousand barrels", "thousand barrels"),
        False,
        (1, 9, 0.5),
        (20, 120),
        (
            "Pipelines are inspected by drones.",
            "The network was built in the 1980s.",
            "Crude prices are volatile this year.",
        ),
    ),
    Scenario(
        ("RailFreight Co", "CargoLink", "Continental Rail"),
        "containers",
        "rail freight network",
        (
            "Port North",
            "Port South",
            "Yard 1",
            "Yard 2",
            "Hub Central",
            "Inland Depot",
            "City Terminal",
            "Border Terminal",
            "Lake Terminal",
        ),
        ("rail link", "rail links"),
        ("container", "containers"),
        True,
        (40, 260, 10),
        (10, 60),
        ("Trains run on electricity.", "Each wagon carries two containers.", "Timetables change in December."),
    ),
    Scenario(
        ("NetCore", "FiberWay", "BackboneX"),
        "data traffic",
        "backbone network",
        (
            "Datacenter 1",
            "Datacenter 2",
            "Router A",
            "Router B",
            "Router C",
            "Exchange North",
            "Exchange South",
            "Edge Site 1",
            "Edge Site 2",
        ),
        ("fiber link", "fiber links"),
        ("Gbps", "Gbps"),
        False,
        (0.5, 6, 0.5),
        (10, 100),
        ("Links are leased for ten years.", "Traffic peaks at 9 p.m.", "The network carries video mostly."),
    ),
    Scenario(
        ("AquaFlow", "City Water Works", "Valley Water"),
        "water",
        "water distribution network",
        (
            "Reservoir",
            "Treatment Plant",
            "Pump House",
            "Valve 1",
            "Valve 2",
            "Tank Hill",
            "District North",
            "District South",
            "Industrial Zone",
        ),
        ("main", "mains"),
        ("megaliter", "megaliters"),
        False,
        (0.2, 3, 0.1),
        (5, 40),
        (
            "The treatment plant uses UV disinfection.",
            "Pipes are being replaced in the old town.",
            "Water meters are read monthly.",
        ),
    ),
)


@dataclass(frozen=True)
class NetworkData:
    scenario: Scenario
    operator: str
    money: Currency
    structure: str  # "min_cost" | "max_flow"
    nodes: tuple[str, ...]
    arcs: tuple[tuple[str, str], ...]
    capacity: dict[tuple[str, str], float]
    cost: dict[tuple[str, str], float]  # min_cost only
    balance: dict[str, float]  # min_cost: supply (+) / demand (-), 0 for transshipment
    source: str  # max_flow
    sink: str


class NetworkFlow(Family):
    name = "network_flow"
    title = "Network flow"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        nodes = draw(rng, sc.node_names, 6, 8)
        structure = "min_cost" if status == "infeasible" or rng.random() < 0.6 else "max_flow"
        # layered network: sources -> middle -> sinks; the witness flow travels along random paths
        n_sources = 1 if structure == "max_flow" else rng.randint(1, 2)
        n_sinks = 1 if structure == "max_flow" else rng.randint(2, 3)
        sources, sinks = nodes[:n_sources], nodes[len(nodes) - n_sinks :]
        middle = nodes[n_sources : len(nodes) - n_sinks]
        arcs: set[tuple[str, str]] = set()
        for s in sources:
            arcs.update((s, m) for m in rng.sample(middle, min(len(middle), rng.randint(2, 3))))
        for m in middle:
            arcs.update((m, t) for t in rng.sample(sinks, rng.randint(1, len(sinks))))
            for other in rng.sample(middle, min(len(middle), rng.randint(0, 2))):
                if other != m and (other, m) not in arcs:
                    arcs.add((m, other))
        for m in middle:  # every middle node is reachable and can reach a sink
            if not any(head == m for _, head in arcs):
                arcs.add((pick(rng, sources), m))
        arc_list = sorted(arcs)  # a set's order changes with the hash seed; draws must not
        witness = {arc: 0.0 for arc in arc_list}
        balance = {node: 0.0 for node in nodes}
        low, high = sc.cap_range
        for _ in range(rng.randint(3, 6)):
            path = _random_path(rng, sources, sinks, arc_list)
            if path is None:
                continue
            amount_ = float(rng.randint(max(1, low // 2), max(2, high // 2)))
            for arc in zip(path, path[1:], strict=False):
                witness[arc] += amount_
            balance[path[0]] += amount_
            balance[path[-1]] -= amount_
        capacity = {
            arc: float(max(witness[arc] + rng.randint(0, high // 3), rng.randint(low, high))) for arc in arc_list
        }
        cost = {arc: nice(rng, *sc.cost_range) for arc in arc_list}
        ordered = tuple(sorted(arc_list, key=lambda arc: (nodes.index(arc[0]), nodes.index(arc[1]))))
        data = NetworkData(
            sc,
            pick(rng, sc.operator),
            currency(rng),
            structure,
            nodes,
            ordered,
            capacity,
            cost if structure == "min_cost" else {},
            balance if structure == "min_cost" else {},
            sources[0],
            sinks[0],
        )
        if structure == "min_cost" and all(value == 0 for value in balance.values()):
            return self.generate(rng, status)  # no path was drawn; draw again
        if status == "infeasible":
            sink = min((node for node in sinks if balance[node] < 0), key=lambda node: balance[node])
            incoming = [arc for arc in ordered if arc[1] == sink]
            inflow = sum(capacity[arc] for arc in incoming)
            extra = float(int(inflow - (-balance[sink])) + rng.randint(5, 20))
            source = pick(rng, sources)
            new_balance = {**balance, sink: balance[sink] - extra, source: balance[source] + extra}
            data = replace(data, balance=new_balance)
            note = (
                f"{sink} must receive {number(-new_balance[sink])} {sc.unit[1]}, but the {sc.link[1]} into it can carry at most "
                f"{number(inflow)} together"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: NetworkData) -> LinearModel:
        b = ModelBuilder("network_flow")
        kind = "integer" if data.scenario.integer else "continuous"
        flow = {arc: b.var(lp_name("flow", *arc), kind, 0.0, data.capacity[arc]) for arc in data.arcs}
        if data.structure == "min_cost":
            for node in data.nodes:
                terms = {flow[arc]: 1.0 for arc in data.arcs if arc[0] == node}
                for arc in data.arcs:
                    if arc[1] == node:
                        terms[flow[arc]] = -1.0
                b.row(lp_name("balance", node), terms, "==", data.balance[node])
            b.minimize({flow[arc]: data.cost[arc] for arc in data.arcs})
            return b.build()
        total = b.var("throughput", kind)
        for node in data.nodes:
            terms = {flow[arc]: 1.0 for arc in data.arcs if arc[0] == node}
            for arc in data.arcs:
                if arc[1] == node:
                    terms[flow[arc]] = -1.0
            if node == data.source:
                terms[total] = -1.0
            elif node == data.sink:
                terms[total] = 1.0
            b.row(lp_name("balance", node), terms, "==", 0.0)
        b.maximize({total: 1.0})
        return b.build()

    def program(self, data: NetworkData) -> str:
        sc = data.scenario
        vtype = "I" if sc.integer else "C"
        head = f'''# flow[i, j]: {sc.unit[1]} sent along the {sc.link[0]} from i to j, up to its capacity
flow = {{(i, j): model.addVar(vtype="{vtype}", lb=0, ub=capacity[i, j], name=f"flow[{{i}},{{j}}]") for (i, j) in capacity}}
'''
        if data.structure == "min_cost":
            body = (
                head
                + """
# balance: what leaves a node minus what enters equals its supply; a demand is a negative supply
for n in nodes:
    out_flow = quicksum(flow[i, j] for (i, j) in capacity if i == n)
    in_flow = quicksum(flow[i, j] for (i, j) in capacity if j == n)
    model.addCons(out_flow - in_flow == supply[n], name=f"balance[{n}]")

# Objective: minimize the total transport cost
model.setObjective(quicksum(cost[i, j] * flow[i, j] for (i, j) in capacity), sense="minimize")
"""
            )
            values: list[tuple[str, object]] = [
                ("nodes", list(data.nodes)),
                ("supply", data.balance),
                ("capacity", data.capacity),
                ("cost", data.cost),
            ]
            return assemble(
                "network_flow", values, body, ["for (i, j), var in flow.items():", '    show(f"flow[{i}, {j}]", var)']
            )
        body = (
            head
            + f'''
# throughput: what leaves the source (and reaches the sink)
throughput = model.addVar(vtype="{vtype}", lb=0, name="throughput")

# balance: flow is conserved at every node; the source emits and the sink absorbs the throughput
for n in nodes:
    out_flow = quicksum(flow[i, j] for (i, j) in capacity if i == n)
    in_flow = quicksum(flow[i, j] for (i, j) in capacity if j == n)
    net = throughput if n == source else (-throughput if n == sink else 0)
    model.addCons(out_flow - in_flow == net, name=f"balance[{{n}}]")

# Objective: maximize the throughput
model.setObjective(throughput, sense="maximize")
'''
        )
        values = [
            ("nodes", list(data.nodes)),
            ("source", data.source),
            ("sink", data.sink),
            ("capacity", data.capacity),
        ]
        return assemble(
            "network_flow", values, body, ["for (i, j), var in flow.items():", '    show(f"flow[{i}, {j}]", var)']
        )

    def math_model(self, data: NetworkData) -> MathModel:
        sc = data.scenario
        domain = r"\in \mathbb{Z}, \; 0 \le x_{ij} \le u_{ij}" if sc.integer else r"\in [0, u_{ij}]"
        arcs = tuple(f"({i}, {j})" for i, j in data.arcs)
        capacity = ParamDef(
            "u_{ij}",
            f"capacity of the {sc.link[0]} from $i$ to $j$ ({sc.unit[1]})",
            {f"({i}, {j})": value for (i, j), value in data.capacity.items()},
            ("A",),
        )
        sets = (SetDef("N", "n", "nodes", data.nodes), SetDef("A", "(i,j)", f"{sc.link[1]} (directed arcs)", arcs))
        flow = VarDef(
            "x_{ij}",
            f"{sc.unit[1]} sent along arc $(i,j)$",
            domain,
            "flow",
            ("A",),
            noun=f"{sc.unit[1]} to send along each {sc.link[0]}",
            whole=f"a fraction of a {sc.unit[0]} cannot be sent" if sc.integer else "",
        )
        conservation = r"\sum_{(n,j) \in A} x_{nj} - \sum_{(i,n) \in A} x_{in}"
        if data.structure == "min_cost":
            return MathModel(
                title="Minimum-cost flow model",
                sense="minimize",
                objective=r"\sum_{(i,j) \in A} c_{ij} x_{ij}",
                objective_description="total transport cost",
                sets=sets,
                params=(
                    ParamDef("b_n", "supply (positive) or demand (negative) at node $n$", data.balance, ("N",)),
                    capacity,
                    ParamDef(
                        "c_{ij}",
                        f"cost per {sc.unit[0]} on arc $(i,j)$ ({data.money.code})",
                        {f"({i}, {j})": value for (i, j), value in data.cost.items()},
                        ("A",),
                    ),
                ),
                variables=(flow,),
                constraints=(
                    ConstraintDef(
                        "Flow balance",
                        "outflow minus inflow equals the node's supply",
                        f"{conservation} = b_n",
                        "balance",
                        ("N",),
                        why="[flow is neither created nor lost at a node|nothing is created or lost at a node]: what leaves "
                        "minus what arrives is the node's own supply (positive), its demand (negative) or zero at a "
                        "pass-through point",
                    ),
                ),
            )
        return MathModel(
            title="Maximum flow model",
            sense="maximize",
            objective="F",
            objective_description=f"throughput from {data.source} to {data.sink}",
            sets=sets,
            params=(
                capacity,
                ParamDef(
                    "s, t",
                    f"source {data.source}, sink {data.sink}",
                    {"source": data.source, "sink": data.sink},
                    ("N",),
                ),
            ),
            variables=(
                flow,
                VarDef(
                    "F",
                    "throughput",
                    r"\ge 0",
                    "throughput",
                    (),
                    noun=f"total {sc.unit[1]} moved from {data.source} to {data.sink}",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Flow balance",
                    "flow is conserved; the source emits and the sink absorbs $F$",
                    f"{conservation} = " + r"\begin{cases} F & n = s \\ -F & n = t \\ 0 & \text{otherwise} \end{cases}",
                    "balance",
                    ("N",),
                    why="flow is conserved at every intermediate node, so everything that leaves the source arrives at the "
                    "sink; [the throughput variable measures that amount|that amount is what the throughput variable "
                    "measures], and [each arc's capacity bounds its flow|no arc carries more than its capacity]",
                ),
            ),
        )

    def statement(self, data: NetworkData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.operator} operates a {sc.network} with {len(data.nodes)} nodes ({join(data.nodes, rng)}) connected by one-way {sc.link[1]}.",
                    f"The {sc.network} of {data.operator} moves {sc.commodity} between {len(data.nodes)} locations: {join(data.nodes, rng)}.",
                    f"{data.operator} has to plan how to route {sc.commodity} through its {sc.network}, whose nodes are {join(data.nodes, rng)}.",
                    f"In the {sc.network} run by {data.operator}, {sc.commodity} can only travel along the {sc.link[1]} listed below.",
                ),
            )
        )
        if data.structure == "min_cost":
            supplies = [(n, v) for n, v in data.balance.items() if v > 0]
            demands = [(n, -v) for n, v in data.balance.items() if v < 0]
            st.add(
                pick(
                    rng,
                    (
                        f"{capitalize(join([f'{n} supplies {amount(v, sc.unit)}' for n, v in supplies], rng))}, and {join([f'{n} needs {amount(v, sc.unit)}' for n, v in demands], rng)}.",
                        f"{'The sources are' if len(supplies) > 1 else 'The only source is'} {join([f'{n} ({amount(v, sc.unit)})' for n, v in supplies], rng)}; {'the destinations require' if len(demands) > 1 else 'the one destination is'} {join([f'{n} ({amount(v, sc.unit)})' for n, v in demands], rng)}. All supply must be shipped and all demand met exactly.",
                    ),
                )
            )
            transit = [n for n, v in data.balance.items() if v == 0]
            if transit:
                st.add(
                    f"{capitalize(join(transit, rng))} only pass{'es' if len(transit) == 1 else ''} {sc.commodity} on."
                )
            rows = [(f"{i} → {j}", number(data.capacity[i, j]), money(data.cost[i, j])) for i, j in data.arcs]
            st.add(
                present(
                    rng,
                    [capitalize(sc.link[0]), f"Capacity ({sc.unit[1]})", f"Cost per {sc.unit[0]}"],
                    rows,
                    lambda row: pick(
                        rng,
                        (
                            f"the {sc.link[0]} {row[0]} carries up to {row[1]} {sc.unit[1]} at {row[2]} per {sc.unit[0]}",
                            f"{row[0]}: capacity {row[1]} {sc.unit[1]}, cost {row[2]} per {sc.unit[0]}",
                            f"shipping along {row[0]} costs {row[2]} per {sc.unit[0]}, for at most {row[1]} {sc.unit[1]}",
                        ),
                    ),
                    intro=(
                        f"The {sc.link[1]}:",
                        "Arc data:",
                        f"Available {sc.link[1]} (direction, capacity, cost):",
                        f"Each {sc.link[0]} runs in one direction only:",
                    ),
                )
            )
            st.question = pick(
                rng,
                (
                    f"How should the {sc.commodity} be routed to meet every requirement at minimum cost?",
                    "Find the cheapest feasible flow and its total cost.",
                    f"What is the minimum cost of moving the {sc.commodity}, and along which {sc.link[1]}?",
                ),
            )
        else:
            rows = [(f"{i} → {j}", number(data.capacity[i, j])) for i, j in data.arcs]
            st.add(
                present(
                    rng,
                    [capitalize(sc.link[0]), f"Capacity ({sc.unit[1]})"],
                    rows,
                    lambda row: pick(
                        rng,
                        (
                            f"the {sc.link[0]} {row[0]} can carry {row[1]} {sc.unit[1]}",
                            f"{row[0]} has a capacity of {row[1]} {sc.unit[1]}",
                            f"at most {row[1]} {sc.unit[1]} fit through {row[0]}",
                        ),
                    ),
                    intro=(
                        f"The {sc.link[1]} and their capacities:",
                        "Arc capacities:",
                        f"Capacities of the one-way {sc.link[1]}:",
                    ),
                )
            )
            st.add(
                pick(
                    rng,
                    (
                        f"{sc.commodity.capitalize()} enters at {data.source} and must end at {data.sink}; intermediate nodes store nothing.",
                        f"All flow starts at {data.source} and ends at {data.sink}. What enters an intermediate node also leaves it.",
                    ),
                )
            )
            st.question = pick(
                rng,
                (
                    f"What is the largest amount of {sc.commodity} that can be sent from {data.source} to {data.sink}?",
                    f"Find the maximum flow from {data.source} to {data.sink}.",
                ),
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        return st.text()

    def decisions(self, data: NetworkData, values: Mapping[str, float]) -> list[str]:
        unit = data.scenario.unit
        lines = []
        for i, j in data.arcs:
            sent = values[lp_name("flow", i, j)]
            if sent > 1e-6:
                lines.append(f"Send {amount(sent, unit)} from {i} to {j}.")
        return lines

    def what_if(self, data: NetworkData, rng: random.Random) -> WhatIf:
        arc = pick(rng, data.arcs)
        if data.structure == "min_cost" and rng.random() < 0.5:
            new = scale(
                data.cost[arc], pick(rng, (0.5, 0.8, 1.3, 1.7)), integer=False, step=data.scenario.cost_range[2]
            )
            return WhatIf(
                f"What if the cost on {arc[0]} → {arc[1]} were {data.money(new)} per {data.scenario.unit[0]} instead of {data.money(data.cost[arc])}?",
                replace(data, cost={**data.cost, arc: new}),
                f"cost[{arc[0]},{arc[1]}]",
                data.cost[arc],
                new,
            )
        new = scale(data.capacity[arc], pick(rng, (0.5, 0.75, 1.25, 1.5)))
        return WhatIf(
            f"What if the capacity of {arc[0]} → {arc[1]} were {number(new)} {data.scenario.unit[1]} instead of {number(data.capacity[arc])}?",
            replace(data, capacity={**data.capacity, arc: new}),
            f"capacity[{arc[0]},{arc[1]}]",
            data.capacity[arc],
            new,
        )


def _random_path(
    rng: random.Random, sources: tuple[str, ...], sinks: tuple[str, ...], arcs: list[tuple[str, str]]
) -> list[str] | None:
    node = pick(rng, sources)
    path = [node]
    for _ in range(8):
        if node in sinks:
            return path
        options = [head for tail, head in arcs if tail == node and head not in path]
        if not options:
            return None
        node = pick(rng, options)
        path.append(node)
    return path if node in sinks else None
