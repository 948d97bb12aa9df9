"""trex's passes, and the default pipeline as data.

Each pass is one module (or sub-package) with one class: a `name`, a docstring stating the invariant
it establishes, and `run(gm, ctx) -> PassResult`. `DEFAULT_PIPELINE` is the order `trex.compile`
runs them in; `passes=` replaces it, `TREX_PASSES=-name` disables one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trex.errors import UnknownNameError

if TYPE_CHECKING:
    from trex.pass_manager import Pass

# The graph passes import torch; they load on first use, so that `trex.passes.parallel` (the planner,
# which prices configurations and needs no graph) starts without it.
_PASS_CLASSES = {
    "CanonicalizeMoe": "trex.passes.canonicalize",
    "DeadCodeElimination": "trex.passes.dead_code_elimination",
    "CostDrivenFusion": "trex.passes.cost_driven_fusion",
    "TritonPatterns": "trex.passes.triton_patterns",
}


def _passes() -> dict[str, type]:
    """Every pass trex ships, by name."""
    import importlib

    classes = [getattr(importlib.import_module(module), cls) for cls, module in _PASS_CLASSES.items()]
    return {c.name: c for c in classes}


def __getattr__(name: str) -> Any:
    if name == "PASSES":
        return _passes()
    if name in _PASS_CLASSES:
        import importlib

        return getattr(importlib.import_module(_PASS_CLASSES[name]), name)
    raise AttributeError(f"module 'trex.passes' has no attribute {name!r}")


DEFAULT_PIPELINE: tuple[str, ...] = (
    "canonicalize_moe",  # fused MoE ops -> dispatch / grouped_mm / combine, tagged per layer
    "dead_code_elimination",  # drop values nothing uses
    "triton_patterns",  # aten regions -> trex's Triton kernels (when the target is a GPU, or when asked)
    "cost_driven_fusion",  # memory-bound chains grouped by the bytes they save; backends get whole groups
)


def resolve_pipeline(passes: str | Sequence[str | Pass] | None) -> list[Pass]:
    """Pass objects for a pipeline given as None (the default), "a,b", or a list of names/passes."""
    if passes is None:
        passes = DEFAULT_PIPELINE
    if isinstance(passes, str):
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    resolved = []
    known = _passes()
    for item in passes:
        if isinstance(item, str):
            if item not in known:
                raise UnknownNameError("pass", item, known)
            resolved.append(known[item]())
        else:
            resolved.append(item)
    return resolved


__all__ = ["DEFAULT_PIPELINE", "PASSES", "CanonicalizeMoe", "CostDrivenFusion", "DeadCodeElimination", "TritonPatterns", "resolve_pipeline"]
