"""Single-machine scheduling in a time-indexed formulation: one binary per job and possible start
time, each job starts once, at most one job runs in any time slot, and the total weighted
completion time is minimized; jobs have release times and some have deadlines.

Unlike the disjunctive big-M model of `scheduling` (order variables between job pairs), the
time-indexed model needs no big-M and has a much stronger LP relaxation, at the price of one
variable per job and time slot (Sousa & Wolsey, "A time indexed formulation of non-preemptive
single machine scheduling problems", Math. Programming 54, 1992).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.families.base import Family, Generated, WhatIf
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
)
from trex.workloads.or_data.program import assemble


@dataclass(frozen=True)
class Scenario:
    owner: tuple[str, ...]
    machine: str
    job_kind: tuple[str, str]
    jobs: tuple[str, ...]
    slot: tuple[str, str]  # ("hour", "hours")
    weight_meaning: str  # what a job's weight stands for
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("Precision Parts", "Kestrel Machining", "Apex Tooling"),
        "CNC mill",
        ("order", "orders"),
        ("bracket", "housing", "shaft", "flange", "gear blank", "manifold", "valve body"),
        ("hour", "hours"),
        "the penalty per hour the order waits, set by customer priority",
        ("The mill was serviced last month.", "Coolant is changed weekly."),
    ),
    Scenario(
        ("Sunrise Print Shop", "Colorpress", "Folio Printers"),
        "large-format printer",
        ("print job", "print jobs"),
        ("banner", "poster run", "trade-show wall", "vehicle wrap", "window film", "floor graphics", "menu boards"),
        ("half hour", "half hours"),
        "how urgently the client needs it",
        ("The shop opens at 7 a.m.", "Inks are solvent-free."),
    ),
    Scenario(
        ("Genomics Core Lab", "BioSeq Facility", "Helix Research"),
        "sequencer",
        ("sample batch", "sample batches"),
        (
            "tumor panel",
            "exome",
            "RNA-seq",
            "microbiome",
            "cell-free DNA",
            "pathogen panel",
            "methylation",
        ),
        ("hour", "hours"),
        "the cost per hour of delay for the requesting group",
        ("The lab is accredited.", "Reagents are kept at -80 °C."),
    ),
)


@dataclass(frozen=True)
class TimeIndexedData:
    scenario: Scenario
    owner: str
    jobs: tuple[str, ...]
    duration: dict[str, int]
    release: dict[str, int]
    weight: dict[str, int]
    deadline: dict[str, int]  # only some jobs
    horizon: int

    def windows(self) -> list[tuple[str, int]]:
        """(job, start time) pairs: from the release, finishing by the deadline or the horizon."""
        return [
            (j, t)
            for j in self.jobs
            for t in range(self.release[j], self.deadline.get(j, self.horizon) - self.duration[j] + 1)
        ]


class TimeIndexedScheduling(Family):
    name = "time_indexed_scheduling"
    title = "Time-indexed single-machine scheduling"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        jobs = tuple(rng.sample(sc.jobs, rng.randint(4, 6)))
        duration = {j: rng.randint(1, 5) for j in jobs}
        release = {j: 0 if k == 0 else rng.choice((0, 0, rng.randint(1, 6))) for k, j in enumerate(jobs)}
        weight = {j: rng.randint(1, 9) for j in jobs}
        horizon = sum(duration.values()) + max(release.values())
        deadline: dict[str, int] = {}
        for j in jobs[1:]:  # the first job (released at 0, no deadline) keeps every slot usable
            if rng.random() < 0.35:
                deadline[j] = min(horizon, release[j] + duration[j] + rng.randint(2, 8))
        data = TimeIndexedData(sc, pick(rng, sc.owner), jobs, duration, release, weight, deadline, horizon)
        if status == "infeasible":  # two jobs released at 0 that must both finish before their joint deadline
            a, b = jobs[1], jobs[2]
            tight = (
                duration[a]
                + duration[b]
                - rng.randint(1, max(1, min(duration[a], duration[b]) - 1) if min(duration[a], duration[b]) > 1 else 1)
            )
            tight = max(tight, duration[a], duration[b])
            if tight >= duration[a] + duration[b]:
                duration = {**duration, a: duration[a] + 1}
            data = replace(
                data,
                duration=duration,
                release={**release, a: 0, b: 0},
                deadline={**deadline, a: tight, b: tight},
                horizon=sum(duration.values()) + max(release.values()),
            )
            note = (
                f"the {a} {sc.job_kind[0]} and the {b} {sc.job_kind[0]} both have to be finished by "
                f"{sc.slot[0]} {tight}, but together they need "
                f"{duration[a] + duration[b]} {sc.slot[1]} on the one {sc.machine}"
            )
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: TimeIndexedData) -> LinearModel:
        b = ModelBuilder("time_indexed_scheduling")
        start = {(j, t): b.var(lp_name("start", j, t), "binary") for j, t in data.windows()}
        for j in data.jobs:
            b.row(lp_name("once", j), {start[key]: 1.0 for key in start if key[0] == j}, "==", 1.0)
        for s in range(data.horizon):
            terms = {start[j, t]: 1.0 for j, t in start if t <= s < t + data.duration[j]}
            b.row(lp_name("machine", s), terms, "<=", 1.0)
        b.minimize({start[j, t]: float(data.weight[j] * (t + data.duration[j])) for j, t in start})
        return b.build()

    def program(self, data: TimeIndexedData) -> str:
        body = """# start[j, t] = 1 when job j starts at time t (from its release; done by its deadline or the horizon)
start = {
    (j, t): model.addVar(vtype="B", name=f"start[{j},{t}]")
    for j in jobs
    for t in range(release[j], deadline.get(j, horizon) - duration[j] + 1)
}

# once: every job starts exactly once
for j in jobs:
    model.addCons(quicksum(start[k, t] for (k, t) in start if k == j) == 1, name=f"once[{j}]")

# machine: in every time slot at most one job is running
for s in range(horizon):
    model.addCons(quicksum(start[j, t] for (j, t) in start if t <= s < t + duration[j]) <= 1, name=f"machine[{s}]")

# Objective: minimize the total weighted completion time
model.setObjective(quicksum(weight[j] * (t + duration[j]) * start[j, t] for (j, t) in start), sense="minimize")
"""
        values = [
            ("jobs", list(data.jobs)),
            ("duration", data.duration),
            ("release", data.release),
            ("weight", data.weight),
            ("deadline", data.deadline),
            ("horizon", data.horizon),
        ]
        report = ["for (j, t), var in start.items():", '    show(f"start[{j}, {t}]", var)']
        return assemble("time_indexed_scheduling", values, body, report)

    def math_model(self, data: TimeIndexedData) -> MathModel:
        sc = data.scenario
        windows = data.windows()
        return MathModel(
            title="Time-indexed single-machine scheduling model",
            sense="minimize",
            objective=r"\sum_{(j,t) \in W} w_j (t + p_j) x_{jt}",
            objective_description="total weighted completion time",
            sets=(
                SetDef("J", "j", sc.job_kind[1], data.jobs),
                SetDef(
                    "T",
                    "s",
                    f"time slots ({sc.slot[1]} 0 to {data.horizon - 1})",
                    tuple(str(s) for s in range(data.horizon)),
                    member=sc.slot[0],
                ),
                SetDef(
                    "W",
                    "(j,t)",
                    "allowed (job, start time) pairs",
                    tuple(f"({j}, {t})" for j, t in windows),
                    display=r"$t$ from $r_j$ to $\min(D_j, H) - p_j$",
                ),
            ),
            params=(
                ParamDef("p_j", f"processing time of job $j$ ({sc.slot[1]})", data.duration, ("J",)),
                ParamDef("r_j", "release time of job $j$", data.release, ("J",)),
                ParamDef("w_j", f"weight of job $j$ ({sc.weight_meaning})", data.weight, ("J",)),
                ParamDef("D_j", "deadline of job $j$ (where it has one)", data.deadline),
                ParamDef("H", "horizon (sum of processing times plus the latest release)", data.horizon),
            ),
            variables=(
                VarDef(
                    "x_{jt}",
                    "1 if job $j$ starts at time $t$",
                    r"\in \{0, 1\}",
                    "start",
                    ("W",),
                    indicator="whether each job starts in each allowed time slot",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Start once",
                    "every job starts exactly once",
                    r"\sum_{t: (j,t) \in W} x_{jt} = 1",
                    "once",
                    ("J",),
                    why=f"each {sc.job_kind[0]} has to be done, and it runs in one piece, so exactly one start time "
                    "is chosen",
                ),
                ConstraintDef(
                    "Machine",
                    "at most one job runs in any time slot",
                    r"\sum_{(j,t) \in W: \, t \le s < t + p_j} x_{jt} \le 1",
                    "machine",
                    ("T",),
                    why=f"the {sc.machine} handles one job at a time, and a job started at $t$ occupies every slot "
                    "until it finishes",
                    technique="[Time is cut into slots and a start variable exists for every job and slot, so the|With "
                    "time cut into slots and one start variable per job and slot, the] 'no overlap' rule becomes a "
                    "simple count per slot and the completion time is a constant per variable; this needs no big-M, "
                    "and its LP relaxation is much tighter than that of the disjunctive model, at the price of one "
                    "variable per job and slot.",
                ),
            ),
        )

    def statement(self, data: TimeIndexedData, rng: random.Random) -> str:
        sc = data.scenario
        slot, kind = sc.slot, sc.job_kind
        st = Statement(rng)
        st.add(
            pick(
                rng,
                (
                    f"{data.owner} has {len(data.jobs)} {kind[1]} waiting for its single {sc.machine}.",
                    f"The {sc.machine} at {data.owner} can work on only one {kind[0]} at a time, and "
                    f"{len(data.jobs)} are queued.",
                    f"Tomorrow {data.owner} must run {join(list(data.jobs))} on its {sc.machine}.",
                    f"{data.owner} wants to sequence the {kind[1]} on its {sc.machine} so that important work "
                    "finishes early.",
                    f"A scheduler at {data.owner} is planning the next shift of the {sc.machine}.",
                    f"Which {kind[0]} should the {sc.machine} at {data.owner} run first?",
                ),
            )
        )
        st.add(
            present(
                rng,
                [capitalize(kind[0]), f"Duration ({slot[1]})", "Available from", "Weight", "Deadline"],
                [
                    (
                        j,
                        str(data.duration[j]),
                        str(data.release[j]),
                        str(data.weight[j]),
                        str(data.deadline.get(j, "-")),
                    )
                    for j in data.jobs
                ],
                lambda row: (
                    f"the {row[0]} {kind[0]} takes {row[1]} {slot[0] if row[1] == '1' else slot[1]}, can start from "
                    f"{slot[0]} {row[2]}, has weight {row[3]}"
                    + (f" and must be finished by {slot[0]} {row[4]}" if row[4] != "-" else "")
                ),
                intro=(f"The {kind[1]}:", "Job data:", f"Details of each {kind[0]}:"),
            )
        )
        st.add(
            f"Time is counted in whole {slot[1]} from 0. A {kind[0]} runs without interruption once started, and a "
            f"{kind[0]}'s weight reflects {sc.weight_meaning}."
        )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"When should each {kind[0]} start so that the total weighted completion time is as small as possible?",
                "Find the schedule that minimizes the weighted sum of completion times.",
                f"In which order and at what times should the {kind[1]} run? Minimize the total weighted "
                "completion time.",
                "What is the minimum total weighted completion time, and which schedule reaches it?",
                f"Schedule the {kind[1]} on the {sc.machine}, minimizing the weighted completion times.",
                "Give start times for all jobs that minimize the sum of weight times completion time.",
            ),
        )
        return st.text()

    def decisions(self, data: TimeIndexedData, values: Mapping[str, float]) -> list[str]:
        slot, kind = data.scenario.slot, data.scenario.job_kind[0]
        chosen = sorted(
            ((t, j) for j, t in data.windows() if values.get(lp_name("start", j, t), 0.0) > 0.5), key=lambda item: item
        )
        return [
            f"Start the {j} {kind} "
            + ("at the very start" if t == 0 else f"after {_count(t, slot)}")
            + f"; it finishes after {_count(t + data.duration[j], slot)}."
            for t, j in chosen
        ]

    def what_if(self, data: TimeIndexedData, rng: random.Random) -> WhatIf:
        j = pick(rng, data.jobs)
        choice = rng.randrange(2)
        if choice == 0:
            new = data.weight[j] + pick(rng, (-2, 2, 4)) if data.weight[j] > 2 else data.weight[j] + 3
            return WhatIf(
                f"What if the {j} {data.scenario.job_kind[0]} had weight {new} instead of {data.weight[j]}?",
                replace(data, weight={**data.weight, j: new}),
                f"weight[{j}]",
                float(data.weight[j]),
                float(new),
            )
        new = data.duration[j] + 1
        horizon = data.horizon + 1
        deadline = dict(data.deadline)
        if j in deadline:  # keep the job's window open: its deadline moves with it
            deadline[j] = min(horizon, deadline[j] + 1)
        return WhatIf(
            f"What if the {j} {data.scenario.job_kind[0]} took {number(new)} {data.scenario.slot[1]} instead of "
            f"{data.duration[j]}?",
            replace(data, duration={**data.duration, j: new}, horizon=horizon, deadline=deadline),
            f"duration[{j}]",
            float(data.duration[j]),
            float(new),
        )


def _count(value: int, unit: tuple[str, str]) -> str:
    """ "0 hours", "1 hour", "5 half hours": a time point counted from the start of the horizon."""
    return f"{value} {unit[0] if value == 1 else unit[1]}"
