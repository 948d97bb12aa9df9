"""Set covering and maximum coverage: choose sites so that zones are within reach. Two
structures: cover every zone (some twice) at least cost, or cover as much population as a budget
allows."""

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
    capitalize,
    currency,
    generic_distractors,
    join,
    number,
    pick,
    present,
)
from trex.workloads.or_data.program import assemble, identifier
from trex.workloads.or_data.prose import article


@dataclass(frozen=True)
class Scenario:
    planner: tuple[str, ...]
    site: tuple[str, str]
    zone: tuple[str, str]
    sites: tuple[str, ...]
    zones: tuple[str, ...]
    reach: str  # "within a 10-minute drive"
    cost_range: tuple[float, float, float]
    population_range: tuple[int, int]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("The county fire department", "A regional safety board", "The city's emergency office"),
        ("fire station", "fire stations"),
        ("neighborhood", "neighborhoods"),
        (
            "Elm Street",
            "Harbor",
            "Hill Road",
            "Market Square",
            "North Gate",
            "Old Town",
            "Park Lane",
            "Quarry",
            "Ridge",
            "Station Road",
        ),
        (
            "Ashgrove",
            "Beacon",
            "Cedar Hill",
            "Dockside",
            "Eastfield",
            "Foxley",
            "Greenway",
            "Highbury",
            "Ivy Bank",
            "Juniper",
            "Kingsmead",
            "Larkfield",
        ),
        "within an eight-minute drive",
        (1.5, 6, 0.1),
        (2000, 25000),
        (
            "The department has 140 firefighters.",
            "Response times are published monthly.",
            "A new ladder truck was bought last year.",
        ),
    ),
    Scenario(
        ("A mobile operator", "TelcoNet", "A rural broadband program"),
        ("cell tower", "cell towers"),
        ("village", "villages"),
        (
            "Hilltop A",
            "Hilltop B",
            "Water Tower",
            "Church Spire",
            "Silo",
            "Ridge Mast",
            "Farm Mast",
            "Quarry Mast",
            "Forest Edge",
        ),
        (
            "Alder",
            "Birchwood",
            "Coldbrook",
            "Dunmoor",
            "Eskdale",
            "Fernhill",
            "Gorse",
            "Hawthorn",
            "Ingleby",
            "Kelso",
            "Linton",
        ),
        "in radio range",
        (80, 350, 5),
        (300, 6000),
        (
            "Towers are inspected twice a year.",
            "Most customers use prepaid plans.",
            "The operator launched 5G last year.",
        ),
    ),
    Scenario(
        ("The ambulance service", "A health authority", "An emergency-care planner"),
        ("ambulance base", "ambulance bases"),
        ("district", "districts"),
        (
            "Central",
            "Bridgeport",
            "Mill Lane",
            "Riverside",
            "Summit",
            "Westgate",
            "Bayfront",
            "Orchard",
            "Canal Street",
        ),
        (
            "Ardley",
            "Bexford",
            "Carrow",
            "Denholm",
            "Elston",
            "Farrow",
            "Gilling",
            "Harlow",
            "Ixworth",
            "Jarrow",
            "Kirby",
        ),
        "reachable within 12 minutes",
        (0.4, 2.5, 0.05),
        (3000, 40000),
        ("Crews work twelve-hour shifts.", "Calls peak on Friday nights.", "Each base has two vehicles."),
    ),
    Scenario(
        ("A retail chain", "A parcel-locker company", "A bike-sharing operator"),
        ("kiosk site", "kiosk sites"),
        ("block", "blocks"),
        (
            "Mall Entrance",
            "Metro Exit",
            "Library",
            "Gym",
            "Supermarket",
            "Bus Hub",
            "Campus Gate",
            "Office Park",
            "Stadium",
        ),
        (
            "Block 1",
            "Block 2",
            "Block 3",
            "Block 4",
            "Block 5",
            "Block 6",
            "Block 7",
            "Block 8",
            "Block 9",
            "Block 10",
            "Block 11",
        ),
        "within a five-minute walk",
        (5, 30, 0.5),
        (200, 3000),
        ("Kiosks are restocked at night.", "The app has 50,000 users.", "Rent is paid quarterly."),
    ),
)


@dataclass(frozen=True)
class CoverData:
    scenario: Scenario
    planner: str
    money: Currency
    money_scale: str  # "million", "thousand", ""
    structure: str  # "cover" | "max_coverage"
    sites: tuple[str, ...]
    zones: tuple[str, ...]
    covers: dict[str, tuple[str, ...]]  # site -> zones it reaches
    cost: dict[str, float]
    required: dict[str, int]  # cover: zone -> times it must be covered
    population: dict[str, float]  # max_coverage
    budget: float  # max_coverage

    def reaching(self, zone: str) -> list[str]:
        return [s for s in self.sites if zone in self.covers[s]]


class SetCovering(Family):
    name = "set_covering"
    title = "Set covering and maximum coverage"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        sites = draw(rng, sc.sites, 5, 8)
        zones = draw(rng, sc.zones, 6, 10)
        covers = {s: set(rng.sample(zones, rng.randint(2, max(2, len(zones) // 2)))) for s in sites}
        for z in zones:  # every zone is reached by at least one site (two for some)
            while sum(z in covers[s] for s in sites) < 1:
                covers[pick(rng, sites)].add(z)
        cost = {s: nice(rng, *sc.cost_range) for s in sites}
        structure = "cover" if status == "infeasible" or rng.random() < 0.6 else "max_coverage"
        required = {z: 1 for z in zones}
        for z in rng.sample(zones, rng.randint(0, 2)):
            if sum(z in covers[s] for s in sites) >= 2:
                required[z] = 2
        population = {z: nice(rng, *sc.population_range, 100 if sc.population_range[1] > 5000 else 10) for z in zones}
        budget = float(round(sum(cost.values()) * rng.uniform(0.3, 0.55), 2))
        scale_word = {
            "fire station": "million",
            "ambulance base": "million",
            "cell tower": "thousand",
            "kiosk site": "thousand",
        }[sc.site[0]]
        data = CoverData(
            sc,
            pick(rng, sc.planner),
            currency(rng),
            scale_word,
            structure,
            sites,
            zones,
            {s: tuple(z for z in zones if z in covers[s]) for s in sites},
            cost,
            required if structure == "cover" else {},
            population if structure == "max_coverage" else {},
            budget if structure == "max_coverage" else 0.0,
        )
        if status == "infeasible":
            z = next((zone for zone in zones if len(data.reaching(zone)) == 1), None)
            if z is None:
                z = pick(rng, zones)
                keep = data.reaching(z)[0]
                data = replace(
                    data,
                    covers={s: tuple(x for x in reached if x != z or s == keep) for s, reached in data.covers.items()},
                )
            data = replace(data, required={**data.required, z: 2})
            note = (
                f"{z} must be covered twice, but only one candidate {sc.site[0]} ({data.reaching(z)[0]}) can reach it"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: CoverData) -> LinearModel:
        b = ModelBuilder("set_covering")
        build = {s: b.var(lp_name("build", s), "binary") for s in data.sites}
        if data.structure == "cover":
            for z in data.zones:
                b.row(lp_name("cover", z), {build[s]: 1 for s in data.reaching(z)}, ">=", data.required[z])
            b.minimize({build[s]: data.cost[s] for s in data.sites})
        else:
            covered = {z: b.var(lp_name("covered", z), "binary") for z in data.zones}
            for z in data.zones:
                terms = {build[s]: -1 for s in data.reaching(z)}
                terms[covered[z]] = 1
                b.row(lp_name("reach", z), terms, "<=", 0)
            b.row("budget", {build[s]: data.cost[s] for s in data.sites}, "<=", data.budget)
            b.maximize({covered[z]: data.population[z] for z in data.zones})
        return b.build()

    def program(self, data: CoverData) -> str:
        sc = data.scenario
        sites, zones = identifier(sc.site[1]), identifier(sc.zone[1])
        if data.structure == "cover":
            body = f"""# build[s] = 1 when {article(sc.site[0])} is built at s
build = {{s: model.addVar(vtype="B", name=f"build[{{s}}]") for s in {sites}}}

# cover: each {sc.zone[0]} is reached by as many {sc.site[1]} as it requires
for z in {zones}:
    model.addCons(quicksum(build[s] for s in {sites} if z in reaches[s]) >= required[z], name=f"cover[{{z}}]")

# Objective: minimize the total building cost
model.setObjective(quicksum(cost[s] * build[s] for s in {sites}), sense="minimize")
"""
            values: list[tuple[str, object]] = [
                (sites, list(data.sites)),
                (zones, list(data.zones)),
                ("reaches", {s: list(z) for s, z in data.covers.items()}),
                ("cost", data.cost),
                ("required", data.required),
            ]
            report = ["for s, var in build.items():", '    show(f"build[{s}]", var)']
        else:
            body = f"""# build[s] = 1 when {article(sc.site[0])} is built at s
build = {{s: model.addVar(vtype="B", name=f"build[{{s}}]") for s in {sites}}}

# covered[z] = 1 when {sc.zone[0]} z is within reach of a built {sc.site[0]}
covered = {{z: model.addVar(vtype="B", name=f"covered[{{z}}]") for z in {zones}}}

# reach: {article(sc.zone[0])} counts as covered only if some built {sc.site[0]} reaches it
for z in {zones}:
    model.addCons(covered[z] <= quicksum(build[s] for s in {sites} if z in reaches[s]), name=f"reach[{{z}}]")

# budget: the building cost stays within the budget
model.addCons(quicksum(cost[s] * build[s] for s in {sites}) <= budget, name="budget")

# Objective: maximize the population covered
model.setObjective(quicksum(population[z] * covered[z] for z in {zones}), sense="maximize")
"""
            values = [
                (sites, list(data.sites)),
                (zones, list(data.zones)),
                ("reaches", {s: list(z) for s, z in data.covers.items()}),
                ("cost", data.cost),
                ("population", data.population),
                ("budget", data.budget),
            ]
            report = [
                "for s, var in build.items():",
                '    show(f"build[{s}]", var)',
                "for z, var in covered.items():",
                '    show(f"covered[{z}]", var)',
            ]
        return assemble("set_covering", values, body, report)

    def math_model(self, data: CoverData) -> MathModel:
        sc = data.scenario
        sets = (
            SetDef("S", "s", f"candidate {sc.site[1]}", data.sites),
            SetDef("Z", "z", sc.zone[1], data.zones),
        )
        reaching = {z: "{" + ", ".join(data.reaching(z)) + "}" for z in data.zones}
        reach_param = ParamDef("N_z", f"the {sc.site[1]} that reach {sc.zone[0]} $z$", reaching, ("Z",))
        money = f"{data.money.code} {data.money_scale}".strip()
        if data.structure == "cover":
            return MathModel(
                title="Set covering model",
                sense="minimize",
                objective=r"\sum_{s \in S} c_s y_s",
                objective_description="total building cost",
                sets=sets,
                params=(
                    ParamDef("c_s", f"cost of building at $s$ ({money})", data.cost, ("S",)),
                    ParamDef("r_z", f"how many {sc.site[1]} must reach $z$", data.required, ("Z",)),
                    reach_param,
                ),
                variables=(
                    VarDef(
                        "y_s",
                        f"1 if {article(sc.site[0])} is built at $s$",
                        r"\in \{0, 1\}",
                        "build",
                        ("S",),
                        indicator=f"whether to build {article(sc.site[0])} at each candidate site",
                    ),
                ),
                constraints=(
                    ConstraintDef(
                        "Coverage",
                        f"each {sc.zone[0]} is reached often enough",
                        r"\sum_{s \in N_z} y_s \ge r_z",
                        "cover",
                        ("Z",),
                        why=f"{article(sc.zone[0])} counts as covered only if enough of the built {sc.site[1]} are {sc.reach}; "
                        "[counting the built sites among those that reach it gives that number|the sum of the build "
                        "variables over the sites that reach it is that number]",
                    ),
                ),
            )
        return MathModel(
            title="Maximum coverage model",
            sense="maximize",
            objective=r"\sum_{z \in Z} p_z u_z",
            objective_description="population covered",
            sets=sets,
            params=(
                ParamDef("c_s", f"cost of building at $s$ ({money})", data.cost, ("S",)),
                ParamDef("p_z", f"population of {sc.zone[0]} $z$", data.population, ("Z",)),
                ParamDef("B", f"budget ({money})", data.budget),
                reach_param,
            ),
            variables=(
                VarDef(
                    "y_s",
                    f"1 if {article(sc.site[0])} is built at $s$",
                    r"\in \{0, 1\}",
                    "build",
                    ("S",),
                    indicator=f"whether to build {article(sc.site[0])} at each candidate site",
                ),
                VarDef(
                    "u_z",
                    f"1 if {sc.zone[0]} $z$ is covered",
                    r"\in \{0, 1\}",
                    "covered",
                    ("Z",),
                    indicator=f"whether each {sc.zone[0]} counts as covered",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Reach",
                    f"{article(sc.zone[0])} is covered only by a built site that reaches it",
                    r"u_z \le \sum_{s \in N_z} y_s",
                    "reach",
                    ("Z",),
                    why=f"[the objective rewards covered population|covered population is what the objective counts], so "
                    f"without this link every {sc.zone[0]} would [claim to be covered|count as covered for free]",
                    technique=f"[This is a linking constraint|The row links two kinds of decision]: the coverage indicator "
                    f"may be 1 only when at least one built {sc.site[0]} reaches the zone, [which ties the yes/no "
                    "coverage flag to the building decisions|so coverage cannot be claimed without building].",
                ),
                ConstraintDef(
                    "Budget",
                    "building costs stay within budget",
                    r"\sum_{s \in S} c_s y_s \le B",
                    "budget",
                    (),
                    why="[there is only a fixed amount of money for construction|the money for construction is limited"
                    "|the building budget is fixed]",
                ),
            ),
        )

    def statement(self, data: CoverData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        scale_word = f" {data.money_scale}" if data.money_scale else ""
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.planner} is choosing where to build {sc.site[1]} to serve {len(data.zones)} {sc.zone[1]}: {join(data.zones, rng)}.",
                    f"{data.planner} has {len(data.sites)} candidate sites for new {sc.site[1]} ({join(data.sites, rng)}).",
                    f"There are {len(data.zones)} {sc.zone[1]} that {data.planner[0].lower() + data.planner[1:]} wants to serve with new {sc.site[1]}.",
                ),
            )
        )
        st.add(
            pick(
                rng,
                (
                    f"{capitalize(article(sc.zone[0]))} is covered by {article(sc.site[0])} if it is {sc.reach} of it.",
                    f"Coverage means being {sc.reach}.",
                ),
            )
        )
        st.add(
            present(
                rng,
                ["Site", f"Cost ({money.code}{scale_word})", f"{capitalize(sc.zone[1])} covered"],
                [(s, number(data.cost[s]), ", ".join(data.covers[s])) for s in data.sites],
                lambda row: pick(
                    rng,
                    (
                        f"{article(sc.site[0])} at {row[0]} would cost {row[1]}{scale_word} {money.code} and cover {row[2]}",
                        f"{row[0]} costs {row[1]}{scale_word} {money.code} and reaches {row[2]}",
                    ),
                ),
                intro=("Candidate sites:", f"Costs and coverage of the candidate {sc.site[1]}:"),
            )
        )
        if data.structure == "cover":
            twice = [z for z, r in data.required.items() if r > 1]
            st.add(
                pick(
                    rng,
                    (
                        f"Every {sc.zone[0]} must be covered by at least one {sc.site[0]}.",
                        f"All {sc.zone[1]} need coverage.",
                    ),
                )
            )
            if twice:
                st.add(
                    pick(
                        rng,
                        (
                            f"Because of {'its' if len(twice) == 1 else 'their'} size, {join(twice, rng)} must be covered by at least two {sc.site[1]}.",
                            f"{capitalize(join(twice, rng))} {'needs' if len(twice) == 1 else 'need'} backup coverage: two {sc.site[1]} within reach.",
                        ),
                    )
                )
            question = (
                f"Which sites should be chosen to cover all {sc.zone[1]} at minimum cost?",
                "What is the cheapest set of sites meeting every coverage requirement, and its cost?",
            )
        else:
            st.add(
                present(
                    rng,
                    [capitalize(sc.zone[0]), "Population"],
                    [(z, number(data.population[z])) for z in data.zones],
                    lambda row: f"{row[0]} has {row[1]} residents",
                    intro=("Populations:", f"The {sc.zone[1]} have these populations:"),
                    allowed=("list", "table", "prose"),
                )
            )
            st.add(
                pick(
                    rng,
                    (
                        f"The budget is {number(data.budget)}{scale_word} {money.code}.",
                        f"No more than {number(data.budget)}{scale_word} {money.code} can be spent.",
                    ),
                )
            )
            question = (
                "Which sites should be built to cover as many residents as possible within the budget?",
                "How many residents can be covered at most, and with which sites?",
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(rng, question)
        return st.text()

    def decisions(self, data: CoverData, values: Mapping[str, float]) -> list[str]:
        built = [s for s in data.sites if values[lp_name("build", s)] > 0.5]
        lines = (
            [f"Build {data.scenario.site[1] if len(built) > 1 else 'a ' + data.scenario.site[0]} at {join(built)}."]
            if built
            else ["Build nothing."]
        )
        if data.structure == "max_coverage":
            covered = [z for z in data.zones if values[lp_name("covered", z)] > 0.5]
            lines.append(f"This covers {join(covered)}." if covered else "No zone is covered.")
        return lines

    def what_if(self, data: CoverData, rng: random.Random) -> WhatIf:
        if data.structure == "max_coverage" and rng.random() < 0.6:
            new = float(round(data.budget * pick(rng, (0.75, 0.9, 1.2, 1.4)), 2))
            return WhatIf(
                f"What if the budget were {number(new)} instead of {number(data.budget)}?",
                replace(data, budget=new),
                "budget",
                data.budget,
                new,
            )
        s = pick(rng, data.sites)
        new = scale(data.cost[s], pick(rng, (0.5, 0.75, 1.3, 1.6)), integer=False, step=data.scenario.cost_range[2])
        return WhatIf(
            f"What if building at {s} cost {number(new)} instead of {number(data.cost[s])}?",
            replace(data, cost={**data.cost, s: new}),
            f"cost[{s}]",
            data.cost[s],
            new,
        )
