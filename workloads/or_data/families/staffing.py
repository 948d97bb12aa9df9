"""Workforce (shift) scheduling: how many people to put on each shift pattern so every period
is staffed, at least cost. Two structures: overlapping shifts of consecutive blocks around the
clock (wrapping past midnight), and weekly patterns of five consecutive working days."""

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
    capitalize,
    currency,
    generic_distractors,
    join,
    number,
    pick,
    present,
)
from trex.workloads.or_data.program import assemble

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
BLOCKS = ("00:00-04:00", "04:00-08:00", "08:00-12:00", "12:00-16:00", "16:00-20:00", "20:00-24:00")


@dataclass(frozen=True)
class Scenario:
    organization: tuple[str, ...]
    staff: tuple[str, str]
    structure: str  # "blocks" | "week"
    need_range: tuple[int, int]
    cost_range: tuple[float, float, float]  # per person per shift (blocks) or per week
    facts: tuple[str, ...]


SCENARIOS = (
    Scenario(
        ("A call center", "The support desk of Telvia", "An insurance hotline"),
        ("agent", "agents"),
        "blocks",
        (4, 40),
        (90, 180, 5),
        (
            "The center answers calls in four languages.",
            "Average call length is six minutes.",
            "Headsets were replaced in March.",
        ),
    ),
    Scenario(
        ("A city police district", "A campus security office", "A port authority"),
        ("officer", "officers"),
        "blocks",
        (3, 22),
        (150, 320, 10),
        (
            "The district covers 40 square kilometers.",
            "Patrol cars are serviced monthly.",
            "A new radio system is being tested.",
        ),
    ),
    Scenario(
        ("A hospital emergency department", "A nursing home", "A children's hospital"),
        ("nurse", "nurses"),
        "week",
        (6, 30),
        (900, 1500, 25),
        ("The hospital has 12 operating rooms.", "Visiting hours end at 8 p.m.", "Staff can use a free gym."),
    ),
    Scenario(
        ("A bus company", "A regional rail operator", "A ferry line"),
        ("driver", "drivers"),
        "week",
        (8, 45),
        (700, 1200, 25),
        ("The fleet has 60 vehicles.", "Tickets can be bought in an app.", "Routes were redesigned two years ago."),
    ),
    Scenario(
        ("A restaurant chain", "A hotel kitchen", "A stadium caterer"),
        ("cook", "cooks"),
        "blocks",
        (2, 16),
        (70, 140, 5),
        ("The menu changes every season.", "The kitchen has two walk-in freezers.", "Most orders are placed online."),
    ),
)


@dataclass(frozen=True)
class StaffingData:
    scenario: Scenario
    organization: str
    money: Currency
    periods: tuple[str, ...]
    shifts: tuple[str, ...]
    covers: dict[str, tuple[str, ...]]  # shift -> periods it works
    need: dict[str, float]
    cost: dict[str, float]
    cap: dict[str, float]  # most people on a shift (absent = no limit)


def _block_shifts(length: int) -> dict[str, tuple[str, ...]]:
    shifts = {}
    for start in range(len(BLOCKS)):
        blocks = tuple(BLOCKS[(start + k) % len(BLOCKS)] for k in range(length))
        shifts[f"{BLOCKS[start][:5]} shift"] = blocks
    return shifts


def _week_patterns() -> dict[str, tuple[str, ...]]:
    patterns = {}
    for start in range(7):
        days = tuple(DAYS[(start + k) % 7] for k in range(5))
        patterns[f"{DAYS[start][:3]}-{DAYS[(start + 4) % 7][:3]} rota"] = days  # a noun: "the Mon-Fri rota costs"
    return patterns


class ShiftScheduling(Family):
    name = "shift_scheduling"
    title = "Workforce shift scheduling"

    def generate(self, rng: random.Random, status: str) -> Generated:
        sc = pick(rng, SCENARIOS)
        if sc.structure == "blocks":
            periods, covers = BLOCKS, _block_shifts(2)
        else:
            periods, covers = DAYS, _week_patterns()
        need = {p: float(rng.randint(*sc.need_range)) for p in periods}
        base = nice(rng, *sc.cost_range)
        cost = {}
        for shift, worked in covers.items():
            premium = 0.0
            if sc.structure == "blocks" and any(b in worked for b in ("00:00-04:00", "20:00-24:00")):
                premium = nice(rng, 10, 40, 5)
            if sc.structure == "week" and any(d in worked for d in ("Saturday", "Sunday")):
                premium = nice(rng, 25, 150, 25)
            cost[shift] = base + premium
        # caps leave room for a witness: every period's need is coverable by the capped shifts
        cap = {}
        for shift in rng.sample(sorted(covers), rng.randint(0, 2)):
            cap[shift] = float(rng.randint(2, max(3, sc.need_range[1] // 3)))
        for p in periods:
            reachable = sum(cap.get(shift, float("inf")) for shift, worked in covers.items() if p in worked)
            if reachable < need[p]:
                cap = {shift: c for shift, c in cap.items() if p not in covers[shift]}
        data = StaffingData(
            sc, pick(rng, sc.organization), currency(rng), periods, tuple(covers), covers, need, cost, cap
        )
        if status == "infeasible":
            p = pick(rng, periods)
            covering = [shift for shift, worked in covers.items() if p in worked]
            limit = {shift: float(max(1, int(need[p] / len(covering) * rng.uniform(0.4, 0.8)))) for shift in covering}
            total = sum(limit.values())
            need = {**need, p: max(need[p], total + rng.randint(1, 4))}  # small needs: the caps alone would cover them
            data = replace(data, cap={**cap, **limit}, need=need)
            note = f"{p} needs {number(need[p])} {sc.staff[1]}, but the shifts that work then ({join(covering)}) may hold at most {number(total)} {sc.staff[1]} together"
            return Generated(data, "infeasible", note)
        return Generated(data, "optimal")

    def linear_model(self, data: StaffingData) -> LinearModel:
        b = ModelBuilder("shift_scheduling")
        staff = {s: b.var(lp_name("staff", s), "integer", 0.0, data.cap.get(s)) for s in data.shifts}
        for p in data.periods:
            b.row(lp_name("need", p), {staff[s]: 1 for s in data.shifts if p in data.covers[s]}, ">=", data.need[p])
        b.minimize({staff[s]: data.cost[s] for s in data.shifts})
        return b.build()

    def program(self, data: StaffingData) -> str:
        sc = data.scenario
        body = f"""# staff[s]: {sc.staff[1]} working shift s (whole people, at most the shift's cap)
staff = {{s: model.addVar(vtype="I", lb=0, ub=cap.get(s), name=f"staff[{{s}}]") for s in shifts}}

# need: every period is staffed by the shifts working in it
for p in periods:
    model.addCons(quicksum(staff[s] for s in shifts if p in works[s]) >= need[p], name=f"need[{{p}}]")

# Objective: minimize the total wage cost
model.setObjective(quicksum(cost[s] * staff[s] for s in shifts), sense="minimize")
"""
        values = [
            ("periods", list(data.periods)),
            ("shifts", list(data.shifts)),
            ("works", {s: list(p) for s, p in data.covers.items()}),
            ("need", data.need),
            ("cost", data.cost),
            ("cap", data.cap),
        ]
        return assemble(
            "shift_scheduling", values, body, ["for s, var in staff.items():", '    show(f"staff[{s}]", var)']
        )

    def math_model(self, data: StaffingData) -> MathModel:
        sc = data.scenario
        works = {s: "{" + ", ".join(p) + "}" for s, p in data.covers.items()}
        params = [
            ParamDef("n_p", f"{sc.staff[1]} needed in period $p$", data.need, ("P",)),
            ParamDef("c_s", f"cost of one {sc.staff[0]} on shift $s$ ({data.money.code})", data.cost, ("S",)),
            ParamDef("W_s", "the periods shift $s$ works", works, ("S",)),
        ]
        domain = r"\in \mathbb{Z}_{\ge 0}"
        if data.cap:
            params.append(ParamDef("u_s", f"most {sc.staff[1]} on shift $s$ (no limit where absent)", data.cap, ("S",)))
            domain += r", \; x_s \le u_s"
        return MathModel(
            title="Shift scheduling model",
            sense="minimize",
            objective=r"\sum_{s \in S} c_s x_s",
            objective_description="total wage cost",
            sets=(SetDef("P", "p", "periods", data.periods), SetDef("S", "s", "shifts", data.shifts)),
            params=tuple(params),
            variables=(
                VarDef(
                    "x_s",
                    f"{sc.staff[1]} assigned to shift $s$",
                    domain,
                    "staff",
                    ("S",),
                    noun=f"{sc.staff[1]} to put on each shift",
                    whole=f"{sc.staff[1]} are people and cannot be split",
                ),
            ),
            constraints=(
                ConstraintDef(
                    "Coverage",
                    "each period has enough staff",
                    r"\sum_{s \in S: p \in W_s} x_s \ge n_p",
                    "need",
                    ("P",),
                    why="shifts overlap several periods, so [the staff present in a period is the sum over the shifts "
                    "working then|the staff on duty in a period is the sum over the shifts that cover it], and that "
                    "sum must reach the period's need",
                ),
            ),
        )

    def statement(self, data: StaffingData, rng: random.Random) -> str:
        sc, money = data.scenario, data.money
        st = Statement(rng)
        if sc.structure == "blocks":
            st.add(
                pick(
                    rng,
                    (
                        f"{data.organization} divides the day into six four-hour blocks and needs a minimum number of {sc.staff[1]} in each.",
                        f"{data.organization} must staff its operation around the clock. The day is split into blocks of four hours.",
                    ),
                )
            )
            st.add(
                pick(
                    rng,
                    (
                        f"Each {sc.staff[0]} works one eight-hour shift, i.e. two consecutive blocks; shifts start at the beginning of any block, and the 20:00 shift runs past midnight into the first block.",
                        "A shift lasts eight hours (two consecutive blocks) and can start at 00:00, 04:00, 08:00, 12:00, 16:00 or 20:00; the last one ends at 04:00 the next day.",
                    ),
                )
            )
            unit = "per shift"
        else:
            st.add(
                pick(
                    rng,
                    (
                        f"{data.organization} needs a minimum number of {sc.staff[1]} on duty each day of the week.",
                        f"{data.organization} is planning the weekly roster of its {sc.staff[1]}.",
                    ),
                )
            )
            st.add(
                pick(
                    rng,
                    (
                        f"Every {sc.staff[0]} works five consecutive days and then has two days off; the pattern can start on any day and repeats every week.",
                        "Contracts require five consecutive working days followed by two rest days, starting on any day of the week.",
                    ),
                )
            )
            unit = "per week"
        st.add(
            present(
                rng,
                ["Period", f"{capitalize(sc.staff[1])} needed"],
                [(p, number(data.need[p])) for p in data.periods],
                lambda row: pick(
                    rng,
                    (
                        f"{row[0]} requires {row[1]} {sc.staff[1]}",
                        f"at least {row[1]} {sc.staff[1]} are needed for {row[0]}",
                    ),
                ),
                intro=("Minimum staffing:", f"The {sc.staff[1]} required are:", "Requirements:"),
            )
        )
        costs = sorted(set(data.cost.values()))
        if len(costs) == 1:
            st.add(f"Every {sc.staff[0]} costs {money(costs[0])} {unit}.")
        else:
            st.add(
                present(
                    rng,
                    ["Shift", f"Cost {unit}"],
                    [(s, money(data.cost[s])) for s in data.shifts],
                    lambda row: f"the {row[0]} costs {row[1]} {unit} per {sc.staff[0]}",
                    intro=(
                        f"Wages differ by shift because of premiums ({unit}, per {sc.staff[0]}):",
                        "Cost per person:",
                    ),
                )
            )
        for s, limit in data.cap.items():
            st.add(
                pick(
                    rng,
                    (
                        f"At most {number(limit)} {sc.staff[1]} can be assigned to the {s}.",
                        f"The {s} has room for no more than {number(limit)} {sc.staff[1]}.",
                    ),
                )
            )
        st.distract([*sc.facts, *generic_distractors(rng, 2)], 0, 2)
        st.question = pick(
            rng,
            (
                f"How many {sc.staff[1]} should start each shift to meet all requirements at minimum cost?",
                "Find the cheapest roster and its total cost.",
                f"What is the minimum total cost of staffing, and how many {sc.staff[1]} work each shift?",
            ),
        )
        return st.text()

    def decisions(self, data: StaffingData, values: Mapping[str, float]) -> list[str]:
        sc = data.scenario
        lines = []
        for s in data.shifts:
            count = round(values[lp_name("staff", s)])
            if count:
                lines.append(f"Put {count} {sc.staff[0] if count == 1 else sc.staff[1]} on the {s}.")
        return lines

    def what_if(self, data: StaffingData, rng: random.Random) -> WhatIf:
        sc = data.scenario
        if rng.random() < 0.6:
            p = pick(rng, data.periods)
            new = scale(data.need[p], pick(rng, (0.7, 1.25, 1.5)))
            return WhatIf(
                f"What if {p} needed {number(new)} {sc.staff[1]} instead of {number(data.need[p])}?",
                replace(data, need={**data.need, p: new}),
                f"need[{p}]",
                data.need[p],
                new,
            )
        s = pick(rng, data.shifts)
        new = scale(data.cost[s], pick(rng, (0.85, 1.15, 1.3)), step=sc.cost_range[2])
        return WhatIf(
            f"What if a {sc.staff[0]} on the {s} cost {data.money(new)} instead of {data.money(data.cost[s])}?",
            replace(data, cost={**data.cost, s: new}),
            f"cost[{s}]",
            data.cost[s],
            new,
        )
