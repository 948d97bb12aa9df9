"""Recompute selection: which forward values to keep for the backward, and which to recompute.

On the joint forward+backward graph, under a memory budget for saved activations, the pass picks
the set of forward values to recompute that costs the least recompute time (`node.meta["cost"]`,
from the cost model) and tags them `node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE`;
torch's `default_partition`, which trex's capture already runs, then saves everything else the
backward reads and recomputes the tagged values in the backward (the same mechanism as
`torch.utils.checkpoint`'s selective policies). The choice is exact per layer kind: a MILP solved
with SCIP (`trex.passes.recompute.milp`), once per distinct decoder-layer structure and tiled over
the layers of that kind (`trex.passes.recompute.problem`). Random ops are never recomputed.

The budget is a fraction of the save-everything activation bytes (`memory_budget=0.4`) or an
amount (`"3GiB"`, `"512MB"`, or a number of bytes). A budget below what any choice can reach is an
error that names the minimum.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from trex.errors import SettingError
from trex.pass_manager import Decision, PassContext, PassResult
from trex.passes.recompute.milp import DEFAULT_TIME_LIMIT_S, Solution, solve
from trex.passes.recompute.problem import RecomputeProblem, build_problem

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class RecomputeBudgetError(SettingError):
    """The memory budget is malformed, or below the least saved memory any recompute choice reaches."""


@dataclass(frozen=True)
class MemoryBudget:
    """A budget for saved activations: a fraction of the save-everything bytes, or bytes.

    `at_least_minimum`: a budget below the reachable minimum becomes the minimum (with a decision
    saying so) instead of an error; used for budgets trex derived itself (a plan's recompute policy).
    """

    fraction: float | None = None
    bytes: int | None = None
    at_least_minimum: bool = False

    @classmethod
    def parse(cls, value: float | int | str | dict | MemoryBudget) -> MemoryBudget:
        if isinstance(value, MemoryBudget):
            return value
        if isinstance(value, dict) and set(value) <= {"fraction", "bytes", "at_least_minimum"}:
            return cls(**value)  # `as_settings()`, as a reproducer stores it
        if isinstance(value, bool):
            raise RecomputeBudgetError(
                f"memory_budget={value!r}: give a fraction in (0, 1] (e.g. 0.4) or an amount ('3GiB', '512MB', bytes)"
            )
        if isinstance(value, float) or (isinstance(value, int) and value <= 1):
            if not 0.0 < float(value) <= 1.0:
                raise RecomputeBudgetError(
                    f"memory_budget={value!r}: a fraction of the save-everything activation memory must be in (0, 1]; "
                    "for an amount write it with a unit ('3GiB')"
                )
            return cls(fraction=float(value))
        if isinstance(value, int):
            return cls(bytes=value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", value)
            unit = match.group(2).lower() if match else None
            if match is None or unit not in _UNITS:
                raise RecomputeBudgetError(
                    f"memory_budget={value!r} is not an amount of memory; write e.g. '3GiB', '512MiB', '2GB' "
                    f"(units: {', '.join(u for u in _UNITS if u)}) or a fraction like 0.4"
                )
            amount = int(float(match.group(1)) * _UNITS[unit])
            if amount <= 0:
                raise RecomputeBudgetError(f"memory_budget={value!r} must be positive")
            return cls(bytes=amount)
        raise RecomputeBudgetError(
            f"memory_budget={value!r}: give a fraction in (0, 1] or an amount like '3GiB', not a {type(value).__name__}"
        )

    def as_settings(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "bytes": self.bytes, "at_least_minimum": self.at_least_minimum}

    def bytes_for(self, save_everything: int) -> float:
        return self.fraction * save_everything if self.fraction is not None else float(self.bytes)

    def __str__(self) -> str:
        return (
            f"{self.fraction:g} of the save-everything activation memory"
            if self.fraction is not None
            else format_bytes(self.bytes)
        )


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


class Recompute:
    """Invariant established: every forward node the backward would recompute is tagged
    MUST_RECOMPUTE, none of them is random or impure, every input of a tagged node is saved or
    tagged, and the saved bytes so implied (each storage once, graph inputs free) are within the
    budget. The graph's nodes and outputs are unchanged; only the partition differs.

    Without a budget (`Recompute()` and no `ctx.options["memory_budget"]`) the pass does nothing.
    """

    name: ClassVar[str] = "recompute"

    def __init__(
        self,
        memory_budget: float | int | str | MemoryBudget | None = None,
        *,
        time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    ):
        self.memory_budget = MemoryBudget.parse(memory_budget) if memory_budget is not None else None
        self.time_limit_s = time_limit_s

    def reproducer_settings(self) -> dict[str, Any]:
        """What `trex.repro` stores so a reproducer replays this pass with the same budget and limit."""
        budget = self.memory_budget.as_settings() if self.memory_budget is not None else None
        return {"memory_budget": budget, "time_limit_s": self.time_limit_s}

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        budget = self.memory_budget
        if budget is None and ctx.options.get("memory_budget") is not None:
            budget = MemoryBudget.parse(ctx.options["memory_budget"])
        if budget is None:
            return PassResult(
                False,
                [Decision("skip", "graph", "no memory budget given (trex.compile(..., memory_budget=0.4 or '3GiB'))")],
            )
        if ctx.phase != "joint":
            return PassResult(False, [Decision("skip", "graph", f"a {ctx.phase} graph saves nothing for a backward")])
        problem = problem_for(gm, ctx.target)
        solution, budget_bytes = choose(problem, budget, time_limit_s=self.time_limit_s)
        overridden = apply_choice(gm, problem, solution)
        return PassResult(True, describe(problem, solution, budget, budget_bytes, overridden))


def problem_for(gm: fx.GraphModule, target: Any = "cpu", *, reannotate: bool = False) -> RecomputeProblem:
    """Read the save/recompute problem off `gm`, annotating costs for `target` where missing (or
    everywhere with `reannotate`: a graph annotated for another target, e.g. a meta capture's CPU
    costs read for an H100)."""
    from trex.cost_model.annotate import annotate, cluster_of

    if reannotate or any(n.op == "call_function" and "cost" not in n.meta for n in gm.graph.nodes):
        annotate(gm, target)
    return build_problem(gm, cluster_of(target).device)


def choose(
    problem: RecomputeProblem, budget: MemoryBudget, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S
) -> tuple[Solution, float]:
    """The least-recompute choice within `budget`; RecomputeBudgetError naming the minimum if none fits."""
    full = problem.save_everything_bytes
    budget_bytes = budget.bytes_for(full)
    solution = solve(problem, budget_bytes, time_limit_s=time_limit_s)
    if solution.feasible:
        return solution, budget_bytes
    least = solve(problem, budget_bytes, time_limit_s=time_limit_s, minimize_bytes=True)
    if not least.feasible:
        raise RecomputeBudgetError(
            f"the recompute solver found no answer within {time_limit_s:g} s ({solution.status}); "
            "raise Recompute(time_limit_s=...) or the memory budget"
        )
    if least.saved_bytes <= budget_bytes:  # the budgeted solve ran out of time before its first answer
        least.status = "time_limit"
        least.seconds += solution.seconds
        least.cpu_seconds += solution.cpu_seconds
        return least, budget_bytes
    if budget.at_least_minimum:
        least.status = "raised_to_minimum"
        least.seconds += solution.seconds
        least.cpu_seconds += solution.cpu_seconds
        return least, budget_bytes
    fraction = least.saved_bytes / full if full else 1.0
    raise RecomputeBudgetError(
        f"memory budget {budget} ({format_bytes(budget_bytes)}) is below the minimum feasible: "
        f"{format_bytes(least.saved_bytes)} ({least.saved_bytes} bytes, memory_budget={fraction:.3f} of the "
        f"save-everything {format_bytes(full)}). Values that cannot be recomputed (random ops, side effects, "
        "collectives), the RNG state of each replayed seeded op and the inputs of every recompute chain must be kept; "
        f"use memory_budget >= {fraction:.3f} (or >= {least.saved_bytes} bytes)"
    )


def apply_choice(gm: fx.GraphModule, problem: RecomputeProblem, solution: Solution) -> int:
    """Tag the chosen values of every block; returns how many earlier recompute tags were replaced."""
    overridden = 0
    for node in gm.graph.nodes:
        if node.name in problem.forward_names and ("recompute" in node.meta or "ac_graph_id" in node.meta):
            overridden += 1
            node.meta.pop("recompute", None)
            node.meta.pop("ac_graph_id", None)
    for kind, choice in zip(problem.kinds, solution.choices):
        for block in kind.blocks:
            for position in choice.recompute:
                block.values[position].node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            for position in choice.saved:
                block.values[position].node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return overridden


def describe(
    problem: RecomputeProblem, solution: Solution, budget: MemoryBudget, budget_bytes: float, overridden: int
) -> list[Decision]:
    full = problem.save_everything_bytes
    head = (
        f"saved {format_bytes(solution.saved_bytes)} of a {format_bytes(budget_bytes)} budget ({budget}); "
        f"save-everything {format_bytes(full)}; recompute {solution.objective_seconds * 1e3:.3f} ms per step; "
        f"{len(problem.kinds)} layer kind(s) solved in {solution.seconds:.2f} s ({solution.cpu_seconds:.2f} s CPU) "
        f"({solution.status}, gap {solution.gap:.2%})"
    )
    decisions = [
        Decision(
            "solve",
            "memory budget",
            head,
            {
                "status": solution.status,
                "budget_bytes": int(budget_bytes),
                "save_everything_bytes": full,
                "saved_bytes": solution.saved_bytes,
                "recompute_seconds": solution.objective_seconds,
                "solve_seconds": solution.seconds,
                "solve_cpu_seconds": solution.cpu_seconds,
                "kinds": len(problem.kinds),
                "blocks": sum(k.count for k in problem.kinds),
            },
        )
    ]
    if solution.status == "raised_to_minimum":
        decisions.append(
            Decision(
                "fallback",
                "memory budget",
                f"the derived budget {budget} is below the reachable minimum; the least-memory answer "
                f"({format_bytes(solution.saved_bytes)}) is used",
                {"minimum_bytes": solution.saved_bytes},
            )
        )
    if solution.status == "time_limit":
        decisions.append(
            Decision(
                "fallback",
                "memory budget",
                f"SCIP stopped at its time limit (CPU time); the best feasible answer found is used "
                f"(optimality gap {solution.gap:.2%})",
                {"gap": solution.gap},
            )
        )
    if overridden:
        decisions.append(
            Decision(
                "override",
                "recompute tags",
                f"{overridden} forward nodes carried recompute tags (torch.utils.checkpoint); "
                "the budgeted choice replaces them",
                {"nodes": overridden},
            )
        )
    for kind, choice in zip(problem.kinds, solution.choices):
        block = kind.representative
        where = f"{kind.name} (x{kind.count})"
        decisions.append(
            Decision(
                "layer_kind",
                kind.name,
                f"{kind.count} block(s) share this structure; one decision tiled over them",
                {
                    "blocks": [b.name for b in kind.blocks],
                    "values": len(block.values),
                    "saved_bytes_per_block": choice.saved_bytes,
                    "recompute_seconds_per_block": choice.recompute_seconds,
                },
            )
        )
        for position in sorted(choice.recompute):
            v = block.values[position]
            decisions.append(
                Decision(
                    "recompute",
                    v.node.name,
                    f"{where}: recomputed in the backward for {v.seconds * 1e6:.2f} us "
                    f"instead of keeping {format_bytes(v.storage_bytes)}",
                    _value_data(kind, position, v),
                )
            )
        for position in sorted(choice.saved):
            v = block.values[position]
            reason = (
                "random: never recomputed"
                if "random" in v.why_not_recomputable
                else (v.why_not_recomputable or "cheaper to keep than to recompute")
            )
            decisions.append(
                Decision(
                    "save",
                    v.node.name,
                    f"{where}: kept ({format_bytes(v.storage_bytes)}; recompute would cost "
                    f"{v.seconds * 1e6:.2f} us): {reason}",
                    _value_data(kind, position, v),
                )
            )
    return decisions


def _value_data(kind, position: int, v) -> dict[str, Any]:
    return {
        "bytes": v.storage_bytes,
        "recompute_seconds": v.seconds,
        "priced": v.priced,
        "op": str(v.node.target),
        "kind": kind.name,
        "nodes": [b.values[position].node.name for b in kind.blocks],
    }


def pipeline_with_budget(
    passes: str | Sequence[Any] | None, memory_budget: float | int | str | MemoryBudget
) -> list[Any]:
    """`passes` (None: the default pipeline) with a `Recompute(memory_budget)` in place of or after the rest."""
    from trex.passes import DEFAULT_PIPELINE

    if passes is None:
        passes = DEFAULT_PIPELINE
    if isinstance(passes, str):
        entries = [p.strip() for p in passes.split(",") if p.strip()]
        if entries and all(e.startswith("-") for e in entries):  # "-name": the default pipeline without those passes
            entries = [name for name in DEFAULT_PIPELINE if f"-{name}" not in entries]
        passes = entries
    selection = Recompute(memory_budget)
    result = [selection if (p == Recompute.name or getattr(p, "name", None) == Recompute.name) else p for p in passes]
    if selection not in result:
        result.append(selection)
    return result
