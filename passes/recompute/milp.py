"""The recompute choice as a mixed-integer program, solved with SCIP (pyscipopt).

Why a MILP and not a min-cut: with a memory budget the problem is a budgeted cut (minimise
recompute time subject to saved bytes <= B), which is NP-hard in general (it contains knapsack:
independent values each either saved for its bytes or recomputed for its time). A single min-cut
(what `min_cut_rematerialization_partition` solves) minimises one weighted sum, so sweeping its
weights only reaches the points on the convex hull of the trade-off; the MILP reaches every budget
exactly, and SCIP's LP relaxation of these flow-like constraints is tight enough that layer-sized
instances solve in well under a second. Checkmate (Jain et al., MLSys 2020) poses rematerialisation
as an ILP too; this is its single-recompute special case over the forward/backward partition.

Variables, per kind (the representative block; objective and bytes weighted by the kind's count):
  r_v = 1: tag forward value v MUST_RECOMPUTE (only for recomputable values)
  z_g = 1: storage group g is held from forward to backward (saving any view of it costs its bytes
           once, so "v is saved" is z of v's storage)
  e_x = 1: external value x (read from outside the block) is saved
Constraints:
  z_g(v) + r_v >= 1         v is read by the backward
  z_g(u) + r_u >= r_v       u is read by a recomputed v (an external u: e_u >= r_v)
  sum count * bytes * (z, e) <= budget
Objective: sum count * seconds_v * r_v, plus a tie-break of saved bytes small enough never to trade
against recompute time (between equal-time answers it picks the smaller one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyscipopt import quicksum

from trex.passes.recompute.problem import Kind, RecomputeProblem

# SCIP stops once its answer is proven within this fraction of the optimum: closing the last 0.1% on
# a knapsack-like budget row costs more root cutting rounds than the rest of the solve.
RELATIVE_GAP = 1e-3
# Past this, the best feasible answer found is used and the decisions say so (with its gap).
DEFAULT_TIME_LIMIT_S = 10.0


@dataclass
class KindChoice:
    recompute: set[int] = field(default_factory=set)  # positions tagged MUST_RECOMPUTE
    saved: set[int] = field(default_factory=set)  # positions saved (tensors)
    saved_external: set[int] = field(default_factory=set)  # indices into Block.external
    saved_bytes: int = 0  # per block
    recompute_seconds: float = 0.0  # per block


@dataclass
class Solution:
    status: str  # "optimal", "time_limit" (best feasible answer found in time), "infeasible"
    choices: list[KindChoice]
    seconds: float
    objective_seconds: float  # total recompute time, all blocks
    saved_bytes: int  # total modelled saved bytes, all blocks
    gap: float = 0.0

    @property
    def feasible(self) -> bool:
        return self.status in ("optimal", "time_limit")


def solve(
    problem: RecomputeProblem,
    budget_bytes: float,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    minimize_bytes: bool = False,
    scip_params: dict | None = None,
) -> Solution:
    """The least-recompute choice within `budget_bytes` (or, with `minimize_bytes`, the least bytes)."""
    from pyscipopt import Model

    started = time.perf_counter()
    model = Model("trex-recompute")
    model.hideOutput(quiet=not (scip_params or {}).get("display/verblevel"))
    model.setParam("limits/gap", RELATIVE_GAP)
    model.setParam("separating/maxroundsroot", 3)  # a few rounds of knapsack cover cuts; branching does the rest faster
    for key, value in (scip_params or {}).items():
        model.setParam(key, value)
    total_bytes = max(1, problem.save_everything_bytes)
    positive = [v.seconds for k in problem.kinds for v in k.representative.values if v.seconds > 0]
    smallest = min(positive) if positive else 1.0
    tie_break = 1e-3 * smallest * 1e6 / total_bytes  # objective in microseconds

    variables = []
    time_terms, byte_terms = [], []
    for number, kind in enumerate(problem.kinds):
        r, z, e = _kind_variables(model, kind, number)
        variables.append((r, z, e))
        _kind_constraints(model, kind, r, z, e)
        block = kind.representative
        time_terms += [kind.count * block.values[p].seconds * 1e6 * var for p, var in r.items()]
        byte_terms += [
            kind.count * block.values[p].replay_bytes * var for p, var in r.items() if block.values[p].replay_bytes
        ]
        sizes = {v.storage: v.storage_bytes for v in block.values}
        byte_terms += [kind.count * sizes[g] * var for g, var in z.items() if sizes[g]]
        byte_terms += [
            kind.count * block.external[x].storage_bytes * var
            for x, var in e.items()
            if block.external[x].storage_bytes
        ]
    saved = quicksum(byte_terms) if byte_terms else 0
    if minimize_bytes:
        model.setObjective(saved + 1e-9 * quicksum(time_terms) if time_terms else saved, "minimize")
    else:
        if byte_terms:
            model.addCons(saved <= budget_bytes, name="memory_budget")
        model.setObjective(quicksum(time_terms) + tie_break * saved if time_terms else saved, "minimize")
    _add_recompute_everything_start(model, problem, variables, None if minimize_bytes else budget_bytes)
    model.setParam("limits/time", max(0.05, time_limit_s - (time.perf_counter() - started)))
    model.optimize()
    status = model.getStatus()
    seconds = time.perf_counter() - started
    if model.getNSols() == 0:
        return Solution("infeasible" if status == "infeasible" else f"no answer ({status})", [], seconds, 0.0, 0)
    best = model.getBestSol()
    choices = [_read_choice(model, best, kind, *vars_) for kind, vars_ in zip(problem.kinds, variables)]
    total_seconds = sum(k.count * c.recompute_seconds for k, c in zip(problem.kinds, choices))
    total_bytes_saved = sum(k.count * c.saved_bytes for k, c in zip(problem.kinds, choices))
    label = "optimal" if status in ("optimal", "gaplimit") else "time_limit"
    return Solution(label, choices, seconds, total_seconds, total_bytes_saved, gap=float(model.getGap()))


def _kind_variables(model, kind: Kind, number: int):
    block = kind.representative
    r = {v.position: model.addVar(f"r{number}_{v.position}", vtype="B") for v in block.values if v.recomputable}
    z = {g: model.addVar(f"z{number}_{g}", vtype="B") for g in {v.storage for v in block.values if v.is_tensor}}
    e = {x: model.addVar(f"e{number}_{x}", vtype="B") for x in range(len(block.external))}
    return r, z, e


def _available(block, position: int, r: dict, z: dict) -> list:
    """The terms that make value `position` available to the backward: its storage held, or recomputed."""
    v = block.values[position]
    return ([z[v.storage]] if v.is_tensor else []) + ([r[position]] if position in r else [])


def _kind_constraints(model, kind: Kind, r: dict, z: dict, e: dict) -> None:
    block = kind.representative
    for v in block.values:
        if v.backward_reads:
            available = _available(block, v.position, r, z)
            if available:
                model.addCons(quicksum(available) >= 1)
        if v.position in r:
            for u in v.inputs:
                model.addCons(quicksum(_available(block, u, r, z)) >= r[v.position])
            for x in v.external_inputs:
                model.addCons(e[x] >= r[v.position])


def _add_recompute_everything_start(
    model, problem: RecomputeProblem, variables: list, budget_bytes: float | None
) -> None:
    """Hand SCIP a feasible answer to improve on: recompute every recomputable value the backward
    needs, keep the rest. Its bytes are near the minimum, so it fits every budget but the tightest,
    and SCIP's primal heuristics need not find a first answer under the knapsack row by themselves."""
    solution = model.createSol()
    total = 0
    for kind, (r, z, e) in zip(problem.kinds, variables):
        block = kind.representative
        needed = _needed(block, set(r))
        kept_groups: dict[int, int] = {}
        externals: set[int] = set()
        for v in block.values:
            if v.position in r:
                model.setSolVal(solution, r[v.position], 1.0 if v.position in needed else 0.0)
            if v.position in needed and v.position not in r and v.is_tensor:
                kept_groups[v.storage] = v.storage_bytes
            if v.position in needed and v.position in r:
                externals.update(v.external_inputs)
        for g, var in z.items():
            model.setSolVal(solution, var, 1.0 if g in kept_groups else 0.0)
        for x, var in e.items():
            model.setSolVal(solution, var, 1.0 if x in externals else 0.0)
        replay = sum(block.values[p].replay_bytes for p in needed if p in r)
        total += kind.count * (
            sum(kept_groups.values()) + sum(block.external[x].storage_bytes for x in externals) + replay
        )
    if budget_bytes is None or total <= budget_bytes:
        model.addSol(solution, free=True)


def _read_choice(model, solution, kind: Kind, r: dict, z: dict, e: dict) -> KindChoice:
    block = kind.representative
    choice = KindChoice()
    choice.recompute = {p for p, var in r.items() if model.getSolVal(solution, var) > 0.5}
    held = {g for g, var in z.items() if model.getSolVal(solution, var) > 0.5}
    needed = _needed(block, choice.recompute)
    choice.saved = {
        v.position for v in block.values if v.position in needed and v.position not in choice.recompute and v.is_tensor
    }
    choice.saved_external = {x for x, var in e.items() if model.getSolVal(solution, var) > 0.5}
    sizes = {v.storage: v.storage_bytes for v in block.values}
    held &= {block.values[p].storage for p in choice.saved}
    choice.saved_bytes = sum(sizes[g] for g in held) + sum(
        block.external[x].storage_bytes for x in choice.saved_external
    )
    choice.recompute &= needed
    choice.saved_bytes += sum(block.values[p].replay_bytes for p in choice.recompute)
    choice.recompute_seconds = sum(block.values[p].seconds for p in choice.recompute)
    return choice


def _needed(block, recompute: set[int]) -> set[int]:
    """Values the backward needs: those it reads, and the inputs of every needed recomputed value."""
    needed: set[int] = set()
    stack = [v.position for v in block.values if v.backward_reads]
    while stack:
        p = stack.pop()
        if p in needed:
            continue
        needed.add(p)
        if p in recompute:
            stack += block.values[p].inputs
    return needed
