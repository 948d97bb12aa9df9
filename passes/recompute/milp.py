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
  e_x = 1: external value x that no block decides (rare: not a graph input, not a block's value) is saved
Constraints, with avail(v) = z_g(v) + r_v (for a free view, avail(v) = r_v: see below):
  avail(v) >= 1             v is read by the backward
  avail(u) >= r_v           u is read by a recomputed v; a u from another block uses that block's
                            kind's variables (one constraint per block of v's kind, as the decision is tiled)
  sum count * bytes * (z, e) <= budget
Objective: sum count * seconds_v * r_v, plus a tie-break of saved bytes small enough never to trade
against recompute time (between equal-time answers it picks the smaller one).

Free views. Without the budget row these constraints are differences between availability and
recompute variables (a min-cut's, whose LP is integral) - except where several values share one
storage variable z_g: a buffer and its views. There the LP may hold the buffer "half" and recompute
each view "half", and its bound fell ~17% under the optimum on V4-Flash's CSA+MoE layer, which left
SCIP branching for seconds. A view that costs nothing to recompute from its own buffer (every op on
the way is free and recomputable, e.g. `view`, `transpose`, `split` + `getitem`) loses nothing by
being made available only by recomputation: if its buffer is held, recomputing it is free. So a free
view gets no z term: avail(view) = r_view, and r_view needs its buffer available, through the
buffer's own z. The integer optimum is unchanged; the LP without the budget row is integral again,
and only the budget row's knapsack gap is left for branching.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyscipopt import quicksum

from trex.passes.recompute.problem import Kind, RecomputeProblem

# SCIP stops once its answer is proven within this fraction of the optimum: closing the last 0.1% on
# a knapsack-like budget row costs more root cutting rounds than the rest of the solve.
RELATIVE_GAP = 1e-3
# Past this much CPU time (SCIP's CPU clock: a shared, loaded machine does not shorten the search),
# the best feasible answer found is used and the decisions say so (with its proven gap).
DEFAULT_TIME_LIMIT_S = 2.0


@dataclass
class KindChoice:
    recompute: set[int] = field(default_factory=set)  # positions tagged MUST_RECOMPUTE
    saved: set[int] = field(default_factory=set)  # positions saved (tensors)
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
    cpu_seconds: float = 0.0  # CPU time of this process during the solve (model build + SCIP)

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
    views_by_recompute: bool = True,
) -> Solution:
    """The least-recompute choice within `budget_bytes` (or, with `minimize_bytes`, the least bytes).

    `views_by_recompute=False` gives free views their own storage term again (the plain formulation,
    same integer optimum, weaker LP): kept so tests can check the two agree."""
    from pyscipopt import Model

    started, cpu_started = time.perf_counter(), time.process_time()
    model = Model("trex-recompute")
    model.hideOutput(quiet=not (scip_params or {}).get("display/verblevel"))
    model.setParam("limits/gap", RELATIVE_GAP)
    model.setParam("timing/clocktype", 1)  # CPU time
    model.setParam("separating/maxroundsroot", 3)  # a few rounds of knapsack cover cuts; branching does the rest faster
    for key, value in (scip_params or {}).items():
        model.setParam(key, value)
    total_bytes = max(1, problem.save_everything_bytes)
    positive = [v.seconds for k in problem.kinds for v in k.representative.values if v.seconds > 0]
    smallest = min(positive) if positive else 1.0
    tie_break = 1e-3 * smallest * 1e6 / total_bytes  # objective in microseconds

    variables = [_kind_variables(model, kind, number, views_by_recompute) for number, kind in enumerate(problem.kinds)]
    kind_of = _kind_of_blocks(problem)
    time_terms, byte_terms = [], []
    for number, kind in enumerate(problem.kinds):
        r, z, e, _ = variables[number]
        _kind_constraints(model, problem, number, variables, kind_of)
        block = kind.representative
        time_terms += [kind.count * block.values[p].seconds * 1e6 * var for p, var in r.items()]
        byte_terms += [
            kind.count * block.values[p].replay_bytes * var for p, var in r.items() if block.values[p].replay_bytes
        ]
        sizes = {v.storage: v.storage_bytes for v in block.values}
        byte_terms += [kind.count * sizes[g] * var for g, var in z.items() if sizes[g]]
        byte_terms += [kind.blocks[b].external[x].storage_bytes * var for (b, x), var in e.items()]
    saved = quicksum(byte_terms) if byte_terms else 0
    if minimize_bytes:
        model.setObjective(saved + 1e-9 * quicksum(time_terms) if time_terms else saved, "minimize")
    else:
        if byte_terms:
            model.addCons(saved <= budget_bytes, name="memory_budget")
        model.setObjective(quicksum(time_terms) + tie_break * saved if time_terms else saved, "minimize")
    _add_recompute_everything_start(model, problem, variables, None if minimize_bytes else budget_bytes)
    model.setParam("limits/time", max(0.05, time_limit_s - (time.process_time() - cpu_started)))
    model.optimize()
    status = model.getStatus()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if model.getNSols() == 0:
        label = "infeasible" if status == "infeasible" else f"no answer ({status})"
        return Solution(label, [], seconds, 0.0, 0, cpu_seconds=cpu)
    best = model.getBestSol()
    choices = _read_choices(model, best, problem, variables, kind_of)
    total_seconds = sum(k.count * c.recompute_seconds for k, c in zip(problem.kinds, choices))
    total_bytes_saved = sum(k.count * c.saved_bytes for k, c in zip(problem.kinds, choices))
    label = "optimal" if status in ("optimal", "gaplimit") else "time_limit"
    return Solution(
        label, choices, seconds, total_seconds, total_bytes_saved, gap=float(model.getGap()), cpu_seconds=cpu
    )


def _kind_variables(model, kind: Kind, number: int, views_by_recompute: bool = True):
    block = kind.representative
    r = {v.position: model.addVar(f"r{number}_{v.position}", vtype="B") for v in block.values if v.recomputable}
    z = {g: model.addVar(f"z{number}_{g}", vtype="B") for g in {v.storage for v in block.values if v.is_tensor}}
    e = {
        (b, x): model.addVar(f"e{number}_{b}_{x}", vtype="B")
        for b, member in enumerate(kind.blocks)
        for x, external in enumerate(member.external)
        if external.home is None and not external.is_input and external.storage_bytes
    }
    return r, z, e, free_views(block) if views_by_recompute else set()


def free_views(block) -> set[int]:
    """Positions of the values that alias a buffer of the block (not its first value) and are
    recomputed from it for free: every op from a value of that buffer to them costs nothing and may
    be recomputed, through non-tensor steps only (a `split`'s tuple, then `getitem`). See the module
    docstring for why they get no storage variable of their own."""
    first: dict[int, int] = {}
    for v in block.values:
        if v.is_tensor and v.storage_bytes:
            first.setdefault(v.storage, v.position)
    memo: dict[tuple[int, int], bool] = {}

    def derived(position: int, storage: int) -> bool:
        key = (position, storage)
        if key not in memo:
            v = block.values[position]
            memo[key] = (
                v.recomputable
                and v.seconds == 0
                and not v.replay_bytes
                and not v.external_inputs
                and bool(v.inputs)
                and all(
                    (u.is_tensor and u.storage == storage) or (not u.is_tensor and derived(u.position, storage))
                    for u in (block.values[i] for i in v.inputs)
                )
            )
        return memo[key]

    return {
        v.position
        for v in block.values
        if v.is_tensor and v.storage in first and first[v.storage] != v.position and derived(v.position, v.storage)
    }


def _kind_of_blocks(problem: RecomputeProblem) -> dict[int, int]:
    """id(block) -> the number of its kind."""
    return {id(block): number for number, kind in enumerate(problem.kinds) for block in kind.blocks}


def _available(block, position: int, r: dict, z: dict, views: set[int]) -> list:
    """The terms that make value `position` available to the backward: its storage held (not for a
    free view: it is recomputed from its held buffer), or recomputed."""
    v = block.values[position]
    return ([z[v.storage]] if v.is_tensor and position not in views else []) + ([r[position]] if position in r else [])


def _kind_constraints(model, problem: RecomputeProblem, number: int, variables: list, kind_of: dict[int, int]) -> None:
    kind = problem.kinds[number]
    block = kind.representative
    r, z, e, views = variables[number]
    for v in block.values:
        if v.backward_reads:
            available = _available(block, v.position, r, z, views)
            if available:
                model.addCons(quicksum(available) >= 1)
        if v.position in r:
            for u in v.inputs:
                model.addCons(quicksum(_available(block, u, r, z, views)) >= r[v.position])
            homes = set()
            for b, member in enumerate(kind.blocks):
                for x in member.values[v.position].external_inputs:
                    external = member.external[x]
                    if (b, x) in e:
                        model.addCons(e[b, x] >= r[v.position])
                    elif external.home is not None:
                        homes.add((kind_of[id(external.home[0])], external.home[1]))
            for home_kind, position in homes:  # another block's value: its own kind decides it
                home_r, home_z, _, home_views = variables[home_kind]
                home_block = problem.kinds[home_kind].representative
                available = _available(home_block, position, home_r, home_z, home_views)
                model.addCons(quicksum(available) >= r[v.position])


def _add_recompute_everything_start(
    model, problem: RecomputeProblem, variables: list, budget_bytes: float | None
) -> None:
    """Hand SCIP a feasible answer to improve on: recompute every recomputable value the backward
    needs, keep the rest. Its bytes are near the minimum, so it fits every budget but the tightest,
    and SCIP's primal heuristics need not find a first answer under the knapsack row by themselves."""
    solution = model.createSol()
    recompute = [set(r) for r, _, _, _ in variables]
    needed = _needed(problem, recompute)
    total = 0
    for number, (kind, (r, z, e, _)) in enumerate(zip(problem.kinds, variables)):
        choice = _choice(kind, number, recompute[number], needed)
        for p, var in r.items():
            model.setSolVal(solution, var, 1.0 if p in choice.recompute else 0.0)
        held = {kind.representative.values[p].storage for p in choice.saved}
        for g, var in z.items():
            model.setSolVal(solution, var, 1.0 if g in held else 0.0)
        for (b, x), var in e.items():
            used = any(x in kind.blocks[b].values[p].external_inputs for p in choice.recompute)
            model.setSolVal(solution, var, 1.0 if used else 0.0)
            total += kind.blocks[b].external[x].storage_bytes if used else 0
        total += kind.count * choice.saved_bytes
    if budget_bytes is None or total <= budget_bytes:
        model.addSol(solution, free=True)


def _read_choices(model, solution, problem: RecomputeProblem, variables: list, kind_of) -> list[KindChoice]:
    recompute = [{p for p, var in r.items() if model.getSolVal(solution, var) > 0.5} for r, _, _, _ in variables]
    needed = _needed(problem, recompute)
    choices = []
    for number, (kind, (_, _, e, _)) in enumerate(zip(problem.kinds, variables)):
        choice = _choice(kind, number, recompute[number], needed)
        choice.saved_bytes += sum(  # undecided externals, charged per block that reads them (rounded up per block)
            -(-kind.blocks[b].external[x].storage_bytes // kind.count)
            for (b, x), var in e.items()
            if model.getSolVal(solution, var) > 0.5
        )
        choices.append(choice)
    return choices


def _choice(kind: Kind, number: int, recompute: set[int], needed: set[tuple[int, int]]) -> KindChoice:
    """A kind's choice from the values it recomputes and the values needed anywhere (kind, position)."""
    block = kind.representative
    mine = {p for k, p in needed if k == number}
    choice = KindChoice()
    choice.recompute = recompute & mine
    choice.saved = {p for p in mine if p not in recompute and block.values[p].is_tensor}
    sizes = {v.storage: v.storage_bytes for v in block.values}
    choice.saved_bytes = sum(sizes[g] for g in {block.values[p].storage for p in choice.saved})
    choice.saved_bytes += sum(block.values[p].replay_bytes for p in choice.recompute)
    choice.recompute_seconds = sum(block.values[p].seconds for p in choice.recompute)
    return choice


def _needed(problem: RecomputeProblem, recompute: list[set[int]]) -> set[tuple[int, int]]:
    """(kind, position) of every value the backward needs: those it reads, and the inputs of every
    needed recomputed value (in its block, or in the block an external input comes from)."""
    kind_of = _kind_of_blocks(problem)
    needed: set[tuple[int, int]] = set()
    stack = [
        (k, v.position) for k, kind in enumerate(problem.kinds) for v in kind.representative.values if v.backward_reads
    ]
    while stack:
        k, p = stack.pop()
        if (k, p) in needed:
            continue
        needed.add((k, p))
        if p not in recompute[k]:
            continue
        kind = problem.kinds[k]
        stack += [(k, u) for u in kind.representative.values[p].inputs]
        for member in kind.blocks:
            for x in member.values[p].external_inputs:
                home = member.external[x].home
                if home is not None:
                    stack.append((kind_of[id(home[0])], home[1]))
    return needed
