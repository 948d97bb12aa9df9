"""Machine scheduling as a MILP. Two structures: jobs on unrelated parallel machines minimizing
the makespan (optionally within a shift length), and one machine sequencing jobs with release
times to minimize the total weighted completion time (disjunctive big-M formulation)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import combinations

from trex.workloads.or_data.families.base import Family, Generated, WhatIf, draw, nice, scale
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
    shop: tuple[str, ...]
    job: tuple[str, str]
    jobs: tuple[str, ...]
    machine: tuple[str, str]
    machines: tuple[str, ...]
    time_unit: str
    time_range: tuple[float, float, float]
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("A print shop", "PrintHub", "Inkwell Press"),
        ("print job", "print jobs"),
        ("flyers", "posters", "booklets", "business cards", "banners", "catalogs", "menus", "invitations", "labels"),
        ("press", "presses"),
        ("offset press", "digital press", "large-format printer"),
        "minutes",
        (15, 120, 5),
        ("The shop opened in 1998.", "Paper is delivered on Tuesdays.", "Two presses were bought second-hand."),
    ),
    Scenario(
        ("A machine shop", "Precision Parts", "Ironworks"),
        ("part order", "part orders"),
        ("gearbox housings", "shafts", "brackets", "flanges", "valve bodies", "pump covers", "axles", "pistons"),
        ("CNC machine", "CNC machines"),
        ("Haas VF-2", "DMG Mori", "Mazak QT"),
        "hours",
        (1, 9, 0.5),
        ("The shop is ISO certified.", "Coolant is recycled.", "A new apprentice started this month."),
    ),
    Scenario(
        ("A clinical laboratory", "A hospital lab", "BioAssay Services"),
        ("sample batch", "sample batches"),
        (
            "blood panels",
            "urine tests",
            "PCR batch",
            "allergy panel",
            "hormone assay",
            "culture set",
            "DNA extraction",
            "toxicology screen",
        ),
        ("analyzer", "analyzers"),
        ("analyzer A", "analyzer B", "analyzer C"),
        "minutes",
        (20, 150, 5),
        (
            "The lab processes about 3,000 samples a day.",
            "Results are sent electronically.",
            "Reagents are kept at 4 °C.",
        ),
    ),
    Scenario(
        ("A cloud team", "A rendering farm", "A data-science group"),
        ("compute job", "compute jobs"),
        (
            "model training",
            "video render",
            "ETL run",
            "simulation",
            "backup",
            "report build",
            "index rebuild",
            "genome alignment",
        ),
        ("server", "servers"),
        ("gpu-1", "gpu-2", "cpu-large"),
        "hours",
        (0.5, 7, 0.5),
        ("The servers run Linux.", "Jobs are submitted through a web form.", "Electricity is billed monthly."),
    ),
)


@dataclass(frozen=True)
class SchedulingData:
    scenario: Scenario
    shop: str
    structure: str  # "makespan" | "weighted"
    jobs: tuple[str, ...]
    machines: tuple[str, ...]
    time: dict[tuple[str, str], float]  # makespan: (job, machine) -> time, absent = incompatible
    horizon: float | None  # makespan: the shift length the schedule must fit in
    duration: dict[str, float]  # weighted: processing time
    release: dict[str, float]
    weight: dict[str, float]

    @property
    def big_m(self) -> float:
        return max(self.release.values(), default=0.0) + sum(self.duration.values())


class MachineScheduling(Family):
    name = "machine_scheduling"
    title = "Machine scheduling (MILP)"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        structure = "makespan" if status == "infeasible" or rng.random() < 0.55 else "weighted"
        if structure == "makespan":
            jobs = draw(rng, sc.jobs, 5, 8)
            machines = draw(rng, sc.machines, 2)
            time = {}
            for j in jobs:
                base = nice(rng, *sc.time_range)
                for m in machines:
                    time[j, m] = max(
                        sc.time_range[2], round(base * rng.uniform(0.7, 1.4) / sc.time_range[2]) * sc.time_range[2]
                    )
            for j in rng.sample(jobs, rng.randint(0, 2)):  # some jobs cannot run everywhere
                time.pop((j, pick(rng, machines)), None)
            horizon = None
            if rng.random() < 0.35:
                greedy = sum(min(t for (job, _), t in time.items() if job == j) for j in jobs)
                horizon = float(
                    round(
                        max(max(min(t for (job, _), t in time.items() if job == j) for j in jobs), greedy)
                        * rng.uniform(0.9, 1.2)
                    )
                )
            data = SchedulingData(sc, pick(rng, sc.shop), structure, jobs, machines, time, horizon, {}, {}, {})
            if status == "infeasible":
                least = sum(min(t for (job, _), t in time.items() if job == j) for j in jobs)
                horizon = float(max(1, int(least / len(machines) * rng.uniform(0.6, 0.9))))
                data = replace(data, horizon=horizon)
                note = (
                    f"even on their fastest {sc.machine[1]} the {sc.job[1]} need {number(least)} {sc.time_unit} of work in total, "
                    f"more than the {len(machines)} {sc.machine[1]} provide in {number(horizon)} {sc.time_unit} ({number(horizon * len(machines))})"
                )
                return Generated(data, "infeasible", note)
            return Generated(data, "optimal")
        jobs = tuple(rng.sample(sc.jobs, rng.randint(4, 6)))
        duration = {j: nice(rng, *sc.time_range) for j in jobs}
        total = sum(duration.values())
        release = {
            j: (
                0.0
                if rng.random() < 0.5
                else float(round(rng.uniform(0, total * 0.5) / sc.time_range[2]) * sc.time_range[2])
            )
            for j in jobs
        }
        weight = {j: float(rng.randint(1, 5)) for j in jobs}
        return Generated(
            SchedulingData(
                sc, pick(rng, sc.shop), structure, jobs, (sc.machines[0],), {}, None, duration, release, weight
            ),
            "optimal",
        )

    def linear_model(self, data: SchedulingData) -> LinearModel:
        b = ModelBuilder("machine_scheduling")
        if data.structure == "makespan":
            assign = {pair: b.var(lp_name("assign", *pair), "binary") for pair in data.time}
            makespan = b.var("makespan", upper=data.horizon)
            for j in data.jobs:
                b.row(lp_name("once", j), {assign[j, m]: 1 for m in data.machines if (j, m) in assign}, "==", 1)
            for m in data.machines:
                terms = {assign[j, m]: data.time[j, m] for j in data.jobs if (j, m) in assign}
                terms[makespan] = -1
                b.row(lp_name("load", m), terms, "<=", 0)
            b.minimize({makespan: 1})
            return b.build()
        start = {j: b.var(lp_name("start", j), lower=data.release[j]) for j in data.jobs}
        before = {(i, j): b.var(lp_name("before", i, j), "binary") for i, j in combinations(data.jobs, 2)}
        big = data.big_m
        for (i, j), order in before.items():
            # order = 1: i runs before j; order = 0: j runs before i
            b.row(lp_name("i_first", i, j), {start[i]: 1, start[j]: -1, order: big}, "<=", big - data.duration[i])
            b.row(lp_name("j_first", i, j), {start[j]: 1, start[i]: -1, order: -big}, "<=", -data.duration[j])
        finish = {j: b.var(lp_name("finish", j)) for j in data.jobs}
        for j in data.jobs:
            b.row(lp_name("completion", j), {finish[j]: 1, start[j]: -1}, "==", data.duration[j])
        b.minimize({finish[j]: data.weight[j] for j in data.jobs})
        return b.build()

    def program(self, data: SchedulingData) -> str:
        if data.structure == "makespan":
            body = (
                """# assign[j, m] = 1 when job j runs on machine m (only where it can run)
assign = {(j, m): model.addVar(vtype="B", name=f"assign[{j},{m}]") for (j, m) in proc_time}

# makespan: the time the last machine finishes"""
                + (" (within the shift)" if data.horizon is not None else "")
                + """
makespan = model.addVar(vtype="C", lb=0, ub="""
                + ("shift_length" if data.horizon is not None else "None")
                + """, name="makespan")

# once: every job runs on exactly one machine
for j in jobs:
    model.addCons(quicksum(assign[j, m] for m in machines if (j, m) in proc_time) == 1, name=f"once[{j}]")

# load: no machine is busy past the makespan
for m in machines:
    model.addCons(quicksum(proc_time[j, m] * assign[j, m] for j in jobs if (j, m) in proc_time) <= makespan, name=f"load[{m}]")

# Objective: minimize the makespan
model.setObjective(makespan, sense="minimize")
"""
            )
            values: list[tuple[str, object]] = [
                ("jobs", list(data.jobs)),
                ("machines", list(data.machines)),
                ("proc_time", data.time),
            ]
            if data.horizon is not None:
                values.append(("shift_length", data.horizon))
            report = [
                'print(f"makespan = {model.getVal(makespan):.10g}")',
                "for (j, m), var in assign.items():",
                '    show(f"assign[{j}, {m}]", var)',
            ]
            return assemble("machine_scheduling", values, body, report)
        body = """# start[j]: when job j starts, not before its release time
start = {j: model.addVar(vtype="C", lb=release[j], name=f"start[{j}]") for j in jobs}

# before[i, j] = 1 when job i runs before job j (one variable per pair)
pairs = [(jobs[a], jobs[b]) for a in range(len(jobs)) for b in range(a + 1, len(jobs))]
before = {(i, j): model.addVar(vtype="B", name=f"before[{i},{j}]") for (i, j) in pairs}

# big_m: longer than any schedule, so a disjunction is inactive when its order is not chosen
big_m = max(release.values()) + sum(duration.values())

# no_overlap: for each pair, one job finishes before the other starts
for (i, j) in pairs:
    model.addCons(start[i] + duration[i] <= start[j] + big_m * (1 - before[i, j]), name=f"i_first[{i},{j}]")
    model.addCons(start[j] + duration[j] <= start[i] + big_m * before[i, j], name=f"j_first[{i},{j}]")

# completion: a job finishes its duration after it starts
finish = {j: model.addVar(vtype="C", lb=0, name=f"finish[{j}]") for j in jobs}
for j in jobs:
    model.addCons(finish[j] == start[j] + duration[j], name=f"completion[{j}]")

# Objective: minimize the total weighted completion time
model.setObjective(quicksum(weight[j] * finish[j] for j in jobs), sense="minimize")
"""
        values = [
            ("jobs", list(data.jobs)),
            ("duration", data.duration),
            ("release", data.release),
            ("weight", data.weight),
        ]
        report = ["for j, var in start.items():", '    print(f"start[{j}] = {model.getVal(var):.10g}")']
        return assemble("machine_scheduling", values, body, report)

    def math_model(self, data: SchedulingData) -> MathModel:
        sc = data.scenario
        if data.structure == "makespan":
            pairs = tuple(f"({j}, {m})" for (j, m) in data.time)
            params = [
                ParamDef(
                    "p_{jm}",
                    f"processing time of $j$ on $m$ ({sc.time_unit}; – = cannot run there)",
                    data.time,
                    ("J", "M"),
                )
            ]
            domain = r"\ge 0"
            if data.horizon is not None:
                params.append(ParamDef("H", f"shift length ({sc.time_unit})", data.horizon))
                domain = r"\in [0, H]"
            return MathModel(
                title="Makespan minimization on unrelated parallel machines",
                sense="minimize",
                objective="C",
                objective_description="makespan",
                sets=(
                    SetDef("J", "j", sc.job[1], data.jobs),
                    SetDef("M", "m", sc.machine[1], data.machines),
                    SetDef("A", "(j,m)", "allowed job-machine pairs", pairs, display=r"pairs with a processing time"),
                ),
                params=tuple(params),
                variables=(
                    VarDef(
                        "x_{jm}",
                        "1 if job $j$ runs on machine $m$",
                        r"\in \{0, 1\}",
                        "assign",
                        ("A",),
                        indicator=f"which {sc.machine[0]} each {sc.job[0]} runs on",
                    ),
                    VarDef(
                        "C",
                        f"makespan ({sc.time_unit})",
                        domain,
                        "makespan",
                        (),
                        noun=f"finishing time of the last {sc.machine[0]} ({sc.time_unit})",
                    ),
                ),
                constraints=(
                    ConstraintDef(
                        "Assignment",
                        "each job runs on exactly one machine",
                        r"\sum_{m:(j,m) \in A} x_{jm} = 1",
                        "once",
                        ("J",),
                        why=f"every {sc.job[0]} must be processed, in one piece, on one {sc.machine[0]} that can run it",
                    ),
                    ConstraintDef(
                        "Load",
                        "each machine finishes by the makespan",
                        r"\sum_{j:(j,m) \in A} p_{jm} x_{jm} \le C",
                        "load",
                        ("M",),
                        why=f"the makespan is the latest finishing time, a maximum over {sc.machine[1]}",
                        technique="[Minimizing a maximum is linearised this way|This is the standard way to minimize a "
                        "maximum linearly]: one variable is required to be at least every machine's total load, and "
                        "minimizing it pushes it down onto the largest load.",
                    ),
                ),
            )
        pairs = tuple(f"({i}, {j})" for i, j in combinations(data.jobs, 2))
        count = len(pairs)
        return MathModel(
            title="Single-machine scheduling with release times (disjunctive formulation)",
            sense="minimize",
            objective=r"\sum_{j \in J} w_j C_j",
            objective_description="total weighted completion time",
            sets=(
                SetDef("J", "j", sc.job[1], data.jobs),
                SetDef("K", "(i,j)", "pairs of jobs, $i$ listed before $j$", pairs),
            ),
            params=(
                ParamDef("p_j", f"processing time ({sc.time_unit})", data.duration, ("J",)),
                ParamDef("r_j", f"release time ({sc.time_unit})", data.release, ("J",)),
                ParamDef("w_j", "weight (priority)", data.weight, ("J",)),
                ParamDef("M", "a big constant: latest release plus all processing", data.big_m),
            ),
            variables=(
                VarDef(
                    "S_j",
                    "start time of job $j$",
                    r"\ge r_j",
                    "start",
                    ("J",),
                    noun=f"start time of each {sc.job[0]} ({sc.time_unit})",
                ),
                VarDef(
                    "y_{ij}",
                    "1 if $i$ runs before $j$",
                    r"\in \{0, 1\}",
                    "before",
                    ("K",),
                    indicator=f"which {sc.job[0]} of each pair goes first",
                ),
                VarDef(
                    "C_j",
                    "completion time of job $j$",
                    r"\ge 0",
                    "finish",
                    ("J",),
                    noun=f"completion time of each {sc.job[0]} ({sc.time_unit})",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Order (first before second)",
                    "if $y_{ij}=1$, $i$ ends before $j$ starts",
                    r"S_i + p_i \le S_j + M (1 - y_{ij})",
                    "i_first",
                    ("K",),
                    count,
                    why=f"the machine handles one {sc.job[0]} at a time, so of any two {sc.job[1]} one must finish "
                    "before the other starts",
                    technique="[This is a big-M disjunction|The either-or rule is written with a big-M]: when the "
                    "order indicator says the first job goes first, the term with M vanishes and the precedence is "
                    "enforced; otherwise M (the latest release plus all processing, so no schedule can exceed it) "
                    "makes the inequality hold trivially.",
                ),
                ConstraintDef(
                    "Order (second before first)",
                    "if $y_{ij}=0$, $j$ ends before $i$ starts",
                    r"S_j + p_j \le S_i + M y_{ij}",
                    "j_first",
                    ("K",),
                    count,
                    why="it is the other half of the same either-or choice, active exactly when the first half is "
                    "[switched off|inactive]",
                ),
                ConstraintDef(
                    "Completion",
                    "a job finishes its processing time after it starts",
                    r"C_j = S_j + p_j",
                    "completion",
                    ("J",),
                    why=f"a {sc.job[0]} runs without interruption, so it ends its processing time after it starts",
                ),
            ),
        )

    def statement(self, data: SchedulingData, rng: random.Random) -> str:
        sc = data.scenario
        st = Statement(rng)
        if data.structure == "makespan":
            st.add(
                pick(
                    rng,
                    (
                        f"{data.shop} has {len(data.jobs)} {sc.job[1]} ({join(data.jobs, rng)}) to run on {len(data.machines)} {sc.machine[1]}: {join(data.machines, rng)}.",
                        f"Today {data.shop} must process these {sc.job[1]}: {join(data.jobs, rng)}. It has {len(data.machines)} {sc.machine[1]}, which work in parallel.",
                    ),
                )
            )
            st.add(
                pick(
                    rng,
                    (
                        f"Each {sc.job[0]} runs on exactly one {sc.machine[0]}, without interruption; a {sc.machine[0]} handles its {sc.job[1]} one after another.",
                        f"A {sc.job[0]} cannot be split between {sc.machine[1]}.",
                    ),
                )
            )
            rows = [
                [j, *(number(data.time[j, m]) if (j, m) in data.time else "–" for m in data.machines)]
                for j in data.jobs
            ]
            intro = pick(
                rng,
                (
                    f"Processing times ({sc.time_unit}) depend on the {sc.machine[0]}:",
                    f"Time needed ({sc.time_unit}) for each {sc.job[0]} on each {sc.machine[0]}:",
                ),
            )
            if any((j, m) not in data.time for j in data.jobs for m in data.machines):
                intro = intro.removesuffix(":") + " (a dash means the job cannot run on that machine):"
            st.add(intro + "\n\n" + table([capitalize(sc.job[0]), *data.machines], rows))
            if data.horizon is not None:
                st.add(
                    pick(
                        rng,
                        (
                            f"All work must be finished within a shift of {number(data.horizon)} {sc.time_unit}.",
                            f"The {sc.machine[1]} are available for {number(data.horizon)} {sc.time_unit} today.",
                        ),
                    )
                )
            st.question = pick(
                rng,
                (
                    f"Assign the {sc.job[1]} to {sc.machine[1]} so that all work finishes as early as possible. What is the minimum makespan?",
                    f"How should the {sc.job[1]} be distributed to minimize the time at which the last {sc.machine[0]} finishes?",
                ),
            )
        else:
            machine = data.scenario.machines[0]
            st.add(
                pick(
                    rng,
                    (
                        f"{data.shop} runs {len(data.jobs)} {sc.job[1]} on a single {sc.machine[0]} ({machine}), one at a time and without interruption.",
                        f"Only one {sc.machine[0]}, the {machine}, is available at {data.shop}, and {len(data.jobs)} {sc.job[1]} are waiting.",
                    ),
                )
            )
            st.add(
                present(
                    rng,
                    [
                        capitalize(sc.job[0]),
                        f"Duration ({sc.time_unit})",
                        f"Available from ({sc.time_unit})",
                        "Priority weight",
                    ],
                    [(j, number(data.duration[j]), number(data.release[j]), number(data.weight[j])) for j in data.jobs],
                    lambda row: (
                        f"{row[0]} takes {row[1]} {sc.time_unit}, can start at time {row[2]} or later, and has weight {row[3]}"
                    ),
                    intro=(f"Job data (times in {sc.time_unit} from now):", f"The {sc.job[1]}:"),
                )
            )
            st.add(
                pick(
                    rng,
                    (
                        "A job's completion time is its start time plus its duration.",
                        "Jobs cannot start before they are available.",
                    ),
                )
            )
            st.question = pick(
                rng,
                (
                    f"In which order should the {sc.job[1]} run to minimize the sum of weighted completion times?",
                    "Find a schedule minimizing the total weighted completion time, and that total.",
                ),
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        return st.text()

    def decisions(self, data: SchedulingData, values: Mapping[str, float]) -> list[str]:
        unit = data.scenario.time_unit
        if data.structure == "makespan":
            lines = []
            for m in data.machines:
                mine = [j for j in data.jobs if (j, m) in data.time and values[lp_name("assign", j, m)] > 0.5]
                load = sum(data.time[j, m] for j in mine)
                lines.append(f"{capitalize(m)} runs {join(mine) if mine else 'nothing'} ({number(load)} {unit}).")
            return lines
        order = sorted(data.jobs, key=lambda j: values[lp_name("start", j)])
        return [
            f"Run {j} from {number(round(values[lp_name('start', j)], 4))} to {number(round(values[lp_name('start', j)] + data.duration[j], 4))} {unit}."
            for j in order
        ]

    def what_if(self, data: SchedulingData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        if data.structure == "makespan":
            pair = pick(rng, sorted(data.time))
            new = scale(data.time[pair], pick(rng, (0.6, 0.8, 1.25, 1.5)), integer=False, step=sc.time_range[2])
            return WhatIf(
                f"What if {pair[0]} took {number(new)} {sc.time_unit} on {pair[1]} instead of {number(data.time[pair])}?",
                replace(data, time={**data.time, pair: new}),
                f"proc_time[{pair[0]},{pair[1]}]",
                data.time[pair],
                new,
            )
        j = pick(rng, data.jobs)
        new = float(data.weight[j] + pick(rng, (-1, 1, 2))) if data.weight[j] > 1 else data.weight[j] + 2
        return WhatIf(
            f"What if {j} had priority weight {number(new)} instead of {number(data.weight[j])}?",
            replace(data, weight={**data.weight, j: new}),
            f"weight[{j}]",
            data.weight[j],
            new,
        )
