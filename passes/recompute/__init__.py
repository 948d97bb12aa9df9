"""The `recompute` pass: which forward values the backward keeps and which it recomputes, chosen
under a memory budget with the cost model's per-node costs.

    selection  the pass (`Recompute`), budgets (`MemoryBudget`), tagging the partition's choice
    problem    the save/recompute problem read off the joint graph, per layer kind
    milp       its SCIP model and solve (time limit, best feasible answer)
    policy     a plan's recompute policy turned into a budget
"""

from trex.passes.recompute.selection import (
    MemoryBudget,
    Recompute,
    RecomputeBudgetError,
    apply_choice,
    choose,
    format_bytes,
    pipeline_with_budget,
    problem_for,
)

__all__ = [
    "MemoryBudget",
    "Recompute",
    "RecomputeBudgetError",
    "apply_choice",
    "choose",
    "format_bytes",
    "pipeline_with_budget",
    "problem_for",
]
