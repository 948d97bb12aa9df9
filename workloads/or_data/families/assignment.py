"""Assignment: give every task to a qualified worker at least cost (or most value), each worker
taking at most a given number of tasks (the generalized form when that number exceeds one)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, nice, scale
from trex.workloads.or_data.linear_model import LinearModel, ModelBuilder, lp_name
from trex.workloads.or_data.math_model import ConstraintDef, MathModel, ParamDef, SetDef, VarDef
from trex.workloads.or_data.phrasing import Statement, capitalize, generic_distractors, join, number, pick, table
from trex.workloads.or_data.program import assemble, identifier


@dataclass(frozen=True)
class Scenario:
    organization: tuple[str, ...]
    worker: tuple[str, str]
    task: tuple[str, str]
    workers: tuple[str, ...]
    tasks: tuple[str, ...]
    measure: str  # "hours", "cost in dollars", "quality score"
    unit: str  # "hours", "", "points"
    maximize: bool
    value_range: tuple[float, float, float]
    unqualified: str  # why a pair is impossible
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("LinguaPro", "Babel Services", "Wordsmith Agency"),
        ("translator", "translators"),
        ("document", "documents"),
        ("Ana", "Bruno", "Chen", "Dana", "Emre", "Farah", "Gita"),
        ("contract", "manual", "brochure", "website", "patent", "report", "subtitles"),
        "hours needed",
        "hours",
        False,
        (3, 20, 1),
        "does not read the source language",
        ("The agency works in 14 languages.", "Most clients are law firms.", "Invoices are sent monthly."),
    ),
    Scenario(
        ("St. Mary's Hospital", "City Clinic", "Riverside Medical Center"),
        ("nurse", "nurses"),
        ("ward", "wards"),
        ("Nurse Adams", "Nurse Brooks", "Nurse Costa", "Nurse Diaz", "Nurse Evans", "Nurse Fox"),
        ("ICU", "pediatrics", "maternity", "oncology", "emergency", "surgery"),
        "placement cost",
        "dollars",
        False,
        (120, 480, 10),
        "lacks the required certification",
        ("The hospital has 320 beds.", "Visiting hours end at 8 p.m.", "The cafeteria was renovated recently."),
    ),
    Scenario(
        ("FastFleet", "Metro Deliveries", "QuickRoute"),
        ("driver", "drivers"),
        ("route", "routes"),
        ("Ivan", "Jade", "Kofi", "Lena", "Marco", "Nadia", "Omar"),
        ("north loop", "harbor run", "airport shuttle", "downtown", "suburbs east", "industrial park"),
        "hours to complete",
        "hours",
        False,
        (2, 9, 0.5),
        "has no licence for that vehicle",
        ("Vans are washed every Friday.", "Drivers start at 7 a.m.", "The depot has 40 parking spaces."),
    ),
    Scenario(
        ("Apex Consulting", "Brightpath Advisors", "Keystone Partners"),
        ("consultant", "consultants"),
        ("client project", "client projects"),
        ("Avery", "Blake", "Casey", "Devon", "Emery", "Finley"),
        ("bank audit", "retail strategy", "IT migration", "supply chain review", "merger study", "pricing study"),
        "expected client rating",
        "points",
        True,
        (55, 98, 1),
        "has a conflict of interest with that client",
        (
            "The firm was founded by two former engineers.",
            "Consultants travel on Mondays.",
            "The office is in a converted warehouse.",
        ),
    ),
    Scenario(
        ("Precision Works", "Alloy Machining", "Delta Fabrication"),
        ("machine", "machines"),
        ("job", "jobs"),
        ("lathe 1", "lathe 2", "mill A", "mill B", "CNC center", "grinder"),
        ("shaft", "bracket", "gear blank", "housing", "flange", "spindle", "bushing"),
        "processing cost",
        "dollars",
        False,
        (40, 260, 5),
        "cannot hold that part",
        ("The shop floor is 2,000 square meters.", "Coolant is changed monthly.", "Two apprentices joined this year."),
    ),
)


@dataclass(frozen=True)
class AssignmentData:
    scenario: Scenario
    organization: str
    workers: tuple[str, ...]
    tasks: tuple[str, ...]
    value: dict[tuple[str, str], float]  # only qualified pairs
    capacity: int  # tasks per worker at most

    @property
    def forbidden(self) -> list[tuple[str, str]]:
        return [(w, t) for w in self.workers for t in self.tasks if (w, t) not in self.value]


def _unqualified(sc: Scenario) -> str:
    """Why a worker cannot take a task, after its pronoun: people are "they", and "they" takes the
    plural verb ("they lack the required certification", not "they lacks", the tenth session's review #2)."""
    if sc.worker[0] not in ("translator", "nurse", "driver", "consultant"):
        return f"it {sc.unqualified}"
    first, _, rest = sc.unqualified.partition(" ")
    plural = {"has": "have", "does": "do", "is": "are"}.get(first) or (first[:-1] if first.endswith("s") else first)
    return f"they {plural} {rest}".rstrip()


def _load_reason(data: AssignmentData) -> str:
    """Why the load row is there, from the prompt's own rule (a count of tasks per worker), not from
    time the story never mentions (the Seventh review's #38, #42, #46)."""
    sc = data.scenario
    worker, task, tasks = sc.worker[0], sc.task[0], sc.task[1]
    if data.capacity == 1 and len(data.tasks) == len(data.workers):
        return (
            f"the rules give each {worker} exactly one {task}; with as many {tasks} as {sc.worker[1]} and every "
            f"{task} covered, [a cap of one {task} per {worker}|at most one {task} per {worker}] already forces "
            f"exactly one each, and without it one {worker} could take every {task}"
        )
    cap = "one" if data.capacity == 1 else number(data.capacity)
    return (
        f"the rules let one {worker} take at most {cap} {task if data.capacity == 1 else tasks}; [without the cap|"
        f"without this row] one {worker} could take every {task}"
    )


class Assignment(Family):
    name = "assignment"
    title = "Assignment"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        capacity = 2 if rng.random() < 0.3 else 1
        n_workers = rng.randint(3, min(6, len(sc.workers)))
        n_tasks = rng.randint(max(3, n_workers - 1), min(len(sc.tasks), n_workers * capacity))
        workers = tuple(rng.sample(sc.workers, n_workers))
        tasks = tuple(rng.sample(sc.tasks, n_tasks))
        value = {(w, t): nice(rng, *sc.value_range) for w in workers for t in tasks}
        # a witness assignment stays qualified; only other pairs may be ruled out
        slots = [w for w in workers for _ in range(capacity)]
        rng.shuffle(slots)
        witness = set(zip(slots, tasks, strict=False))  # more slots than tasks
        for pair in rng.sample(sorted(value), min(len(value) // 5, rng.randint(0, 3))):
            if pair not in witness:
                del value[pair]
        data = AssignmentData(sc, pick(rng, sc.organization), workers, tasks, value, capacity)
        if status == "infeasible":
            workers = workers[: max(1, (len(tasks) - 1) // capacity)]
            value = {(w, t): v for (w, t), v in value.items() if w in workers}
            data = replace(data, workers=workers, value=value)
            note = f"there are {len(tasks)} {sc.task[1]} but the {len(workers)} {sc.worker[1]} can take at most {len(workers) * capacity} of them ({capacity} each)"
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: AssignmentData) -> LinearModel:
        b = ModelBuilder("assignment")
        assign = {pair: b.var(lp_name("assign", *pair), "binary") for pair in data.value}
        for t in data.tasks:
            b.row(lp_name("cover", t), {assign[w, t]: 1 for w in data.workers if (w, t) in assign}, "==", 1)
        for w in data.workers:
            b.row(lp_name("load", w), {assign[w, t]: 1 for t in data.tasks if (w, t) in assign}, "<=", data.capacity)
        terms = {assign[pair]: v for pair, v in data.value.items()}
        b.maximize(terms) if data.scenario.maximize else b.minimize(terms)
        return b.build()

    def program(self, data: AssignmentData) -> str:
        sc = data.scenario
        ws, ts = identifier(sc.worker[1]), identifier(sc.task[1])
        sense = "maximize" if sc.maximize else "minimize"
        body = f'''# assign[w, t] = 1 when {sc.worker[0]} w takes {sc.task[0]} t (qualified pairs only)
assign = {{(w, t): model.addVar(vtype="B", name=f"assign[{{w}},{{t}}]") for (w, t) in value}}

# cover: every {sc.task[0]} goes to exactly one {sc.worker[0]}
for t in {ts}:
    model.addCons(quicksum(assign[w, t] for w in {ws} if (w, t) in value) == 1, name=f"cover[{{t}}]")

# load: a {sc.worker[0]} takes at most max_per_{identifier(sc.worker[0])} {sc.task[1]}
for w in {ws}:
    model.addCons(quicksum(assign[w, t] for t in {ts} if (w, t) in value) <= max_per_{identifier(sc.worker[0])}, name=f"load[{{w}}]")

# Objective: {sense} the total {sc.measure}
model.setObjective(quicksum(value[w, t] * assign[w, t] for (w, t) in value), sense="{sense}")
'''
        values = [
            (ws, list(data.workers)),
            (ts, list(data.tasks)),
            ("value", data.value),
            (f"max_per_{identifier(sc.worker[0])}", data.capacity),
        ]
        return assemble(
            "assignment", values, body, ["for (w, t), var in assign.items():", '    show(f"assign[{w}, {t}]", var)']
        )

    def math_model(self, data: AssignmentData) -> MathModel:
        sc = data.scenario
        pairs = tuple(f"({w}, {t})" for (w, t) in data.value)
        missing = ", ".join(f"({w}, {t})" for (w, t) in data.forbidden)
        return MathModel(
            title="Assignment model",
            sense="maximize" if sc.maximize else "minimize",
            objective=r"\sum_{(w,t) \in A} v_{wt} x_{wt}",
            objective_description=f"total {sc.measure}",
            sets=(
                SetDef("W", "w", sc.worker[1], data.workers),
                SetDef("T", "t", sc.task[1], data.tasks),
                SetDef(
                    "A",
                    "(w,t)",
                    "qualified pairs",
                    pairs,
                    display=r"$W \times T$" + (f" without {missing}" if missing else ""),
                ),
            ),
            params=(
                ParamDef(
                    "v_{wt}",
                    f"{sc.measure} when $w$ takes $t$" + (" (– = not qualified)" if data.forbidden else ""),
                    data.value,
                    ("W", "T"),
                ),
                ParamDef("k", f"most {sc.task[1]} per {sc.worker[0]}", data.capacity),
            ),
            variables=(
                VarDef(
                    "x_{wt}",
                    f"1 if {sc.worker[0]} $w$ takes {sc.task[0]} $t$",
                    r"\in \{0, 1\}",
                    "assign",
                    ("A",),
                    indicator=f"which {sc.task[1]} each {sc.worker[0]} takes"
                    + (" (among the pairs that are allowed)" if data.forbidden else ""),
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Cover",
                    f"each {sc.task[0]} is assigned exactly once",
                    r"\sum_{w:(w,t) \in A} x_{wt} = 1",
                    "cover",
                    ("T",),
                    why=f"every {sc.task[0]} has to be done, and [done by one {sc.worker[0]} only|by exactly one {sc.worker[0]}], "
                    "so [the choices for it sum to exactly one|its yes/no choices add up to exactly one"
                    "|exactly one of its assignment variables is 1]",
                ),
                ConstraintDef(
                    "Load",
                    f"each {sc.worker[0]} takes at most $k$ {sc.task[1]}",
                    r"\sum_{t:(w,t) \in A} x_{wt} \le k",
                    "load",
                    ("W",),
                    why=_load_reason(data),
                ),
            ),
        )

    def statement(self, data: AssignmentData, rng: random.Random) -> str:
        sc = data.scenario
        st = Statement(rng)
        limit = (
            "exactly one"
            if data.capacity == 1 and len(data.tasks) == len(data.workers)
            else ("at most one" if data.capacity == 1 else f"at most {data.capacity}")
        )
        st.add(
            pick(
                rng,
                (
                    f"{data.organization} must assign {len(data.tasks)} {sc.task[1]} ({join(data.tasks, rng)}) to its {len(data.workers)} {sc.worker[1]}: {join(data.workers, rng)}.",
                    f"At {data.organization}, {len(data.workers)} {sc.worker[1]} are available this week: {join(data.workers, rng)}. They have to cover the {sc.task[1]} {join(data.tasks, rng)}.",
                    f"The scheduler at {data.organization} pairs {sc.worker[1]} with {sc.task[1]}. Today there are {len(data.tasks)} {sc.task[1]} and {len(data.workers)} {sc.worker[1]}.",
                ),
            )
        )
        st.add(
            pick(
                rng,
                (
                    f"Every {sc.task[0]} must be handled by exactly one {sc.worker[0]}, and each {sc.worker[0]} can take {limit} {sc.task[0] if data.capacity == 1 else sc.task[1]}.",
                    f"Each {sc.worker[0]} handles {limit} {sc.task[0] if data.capacity == 1 else sc.task[1]}; no {sc.task[0]} may be left unassigned or split.",
                ),
            )
        )
        # a measure that already names its unit ("hours to complete") gets no "(hours)" after it
        unit = f" ({sc.unit})" if sc.unit and sc.unit not in sc.measure.split() else ""
        rows = [
            [w, *(number(data.value[w, t]) if (w, t) in data.value else "–" for t in data.tasks)] for w in data.workers
        ]
        intro = pick(
            rng,
            (
                f"The table gives the {sc.measure}{unit} for each pair:",
                f"{capitalize(sc.measure)}{unit} by {sc.worker[0]} and {sc.task[0]}:",
            ),
        )
        if data.forbidden:
            intro = intro.removesuffix(":") + pick(
                rng, (" (a dash means the pairing is impossible):", " (– marks pairs that cannot be used):")
            )
        st.add(intro + "\n\n" + table([f"{capitalize(sc.worker[0])} \\ {sc.task[0]}", *data.tasks], rows))
        if data.forbidden and rng.random() < 0.6:
            w, t = data.forbidden[0]
            st.add(f"For example, {w} cannot take the {t} {sc.task[0]} because {_unqualified(sc)}.")
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        goal = "maximizes the total" if sc.maximize else "minimizes the total"
        st.question = pick(
            rng,
            (
                f"Find the assignment that {goal} {sc.measure}.",
                f"Which {sc.worker[0]} should take which {sc.task[0]}? Report the optimal total {sc.measure}.",
                f"Formulate and solve the assignment problem; what is the best achievable total {sc.measure}?",
            ),
        )
        return st.text()

    def decisions(self, data: AssignmentData, values: Mapping[str, float]) -> list[str]:
        sc = data.scenario
        return [
            f"{capitalize(w)} takes the {t} {sc.task[0]} ({number(data.value[w, t])}{' ' + sc.unit if sc.unit else ''})."
            for (w, t) in data.value
            if values[lp_name("assign", w, t)] > 0.5
        ]

    def what_if(self, data: AssignmentData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        pair = pick(rng, sorted(data.value))
        new = scale(data.value[pair], pick(rng, (0.5, 0.7, 1.3, 1.6)), integer=False, step=sc.value_range[2])
        return WhatIf(
            f"What if the {sc.measure} for {pair[0]} on the {pair[1]} {sc.task[0]} were {number(new)} instead of {number(data.value[pair])}?",
            replace(data, value={**data.value, pair: new}),
            f"value[{pair[0]},{pair[1]}]",
            data.value[pair],
            new,
        )
