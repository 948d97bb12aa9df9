"""Why a plan loses to another: the step-time terms that differ, largest first.

The cost model splits a step into compute (recompute apart), exposed communication (tensor,
expert and context parallelism, pipeline sends), the data-parallel sync the backward could not
hide, the pipeline bubble, the optimizer step and host waits. A runner-up's reason is the term
that grew most against the winner, with the degrees that cause it; a plan that would be faster
but does not fit loses on memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from trex.cost_model.devices import GIB
from trex.cost_model.memory import MemoryEstimate
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.step import StepEstimate


@dataclass(frozen=True)
class Term:
    name: str
    seconds: float  # runner-up minus winner


def _terms(estimate: StepEstimate) -> dict[str, float]:
    b = estimate.breakdown
    return {
        "compute": b.compute_s - b.recompute_s,
        "recompute": b.recompute_s,
        "exposed communication": b.exposed_comm_s - b.dp_sync_s,
        "data-parallel sync": b.dp_sync_s,
        "pipeline bubble": b.bubble_s,
        "optimizer step": b.optimizer_s,
        "host waits": getattr(b, "host_wait_s", 0.0),
    }


def differences(loser: StepEstimate, winner: StepEstimate) -> list[Term]:
    """Per step-time term, how much longer the loser's is (largest first; negative: it is shorter)."""
    a, b = _terms(loser), _terms(winner)
    return sorted((Term(name, a[name] - b[name]) for name in a), key=lambda t: -t.seconds)


def _cause(term: str, loser: ParallelConfig, winner: ParallelConfig) -> str:
    def degrees(*names: str) -> str:
        changed = [
            f"{n}={getattr(loser, n)} vs {getattr(winner, n)}" for n in names if getattr(loser, n) != getattr(winner, n)
        ]
        return f" ({', '.join(changed)})" if changed else ""

    if term == "pipeline bubble":
        return degrees("pp", "vpp", "mbs")
    if term == "exposed communication":
        return degrees("tp", "ep", "etp", "cp", "pp")
    if term == "data-parallel sync":
        return degrees("zero", "dp", "ep", "pp")
    if term == "recompute":
        return f" (recompute {loser.recompute} vs {winner.recompute})" if loser.recompute != winner.recompute else ""
    if term == "compute":
        return degrees("tp", "mbs", "cp", "ep", "etp")
    if term == "optimizer step":
        return degrees("zero", "dp", "pp")
    return ""


def why_slower(loser: StepEstimate, winner: StepEstimate) -> str:
    """One line: by how much the loser is slower and the terms that make it so."""
    total = loser.step_time_s - winner.step_time_s
    worse = [t for t in differences(loser, winner) if t.seconds > 1e-4 * max(winner.step_time_s, 1e-9)]
    if total <= 0:
        return "as fast as the winner (ties go to fewer pipeline stages, lower ZeRO stage, less memory)"
    parts = [f"{t.name} +{t.seconds:.3g} s{_cause(t.name, loser.plan, winner.plan)}" for t in worse[:2]]
    return f"{total:+.3g} s/step: " + "; ".join(parts) if parts else f"{total:+.3g} s/step"


def why_too_big(memory: MemoryEstimate, pipeline_s: float, winner_step_s: float | None) -> str:
    """A plan that would be faster but does not fit: by how much, and which memory dominates."""
    gib = memory.gib()
    components = sorted(((k, v) for k, v in gib.items() if k not in ("total", "capacity")), key=lambda kv: -kv[1])
    biggest = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in components[:2])
    faster = f"pipeline alone {pipeline_s:.3g} s" + (f" (< {winner_step_s:.3g} s)" if winner_step_s is not None else "")
    return f"does not fit: {gib['total']:.1f} GiB > {gib['capacity']:.1f} GiB usable ({biggest} GiB); {faster}"


def shortfall(memory: MemoryEstimate) -> dict[str, float]:
    """GiB per component, the capacity, and how much is missing (what 'nothing fits' reports)."""
    gib = memory.gib()
    return {**{k: v for k, v in gib.items()}, "missing": max(0.0, (memory.total - memory.capacity) / GIB)}
