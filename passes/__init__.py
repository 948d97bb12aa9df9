"""trex's passes, and the default pipeline as data.

Each pass is one module (or sub-package) with one class: a `name`, a docstring stating the invariant
it establishes, and `run(gm, ctx) -> PassResult`. `DEFAULT_PIPELINE` is the order `trex.compile`
runs them in; `passes=` replaces it, `TREX_PASSES=-name` disables one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trex.errors import TrexError, UnknownNameError

if TYPE_CHECKING:
    from trex.pass_manager import Pass

# The graph passes import torch; they load on first use, so `import trex.passes` (and the CLI's
# `--help`) stays fast.
_PASS_CLASSES = {
    "CanonicalizeMoe": "trex.passes.canonicalize",
    "DeadCodeElimination": "trex.passes.dead_code_elimination",
    "CostDrivenFusion": "trex.passes.cost_driven_fusion",
    "CpuGemmPrecision": "trex.passes.cpu_gemm_precision",
    "DecomposeMoe": "trex.passes.decompose_moe",
    "TritonPatterns": "trex.passes.triton_patterns",
    "Recompute": "trex.passes.recompute",
    "ReorderComm": "trex.passes.reorder_comm",
    "HoistGradients": "trex.passes.hoist_gradients",
    "ComputeOnce": "trex.passes.compute_once",
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
    "cpu_gemm_precision",  # bf16/fp16 GEMMs as fp32 GEMMs on CPUs without native bf16/fp16 units
    "decompose_moe",  # MoE primitives -> core aten, when the leading backend generates code from aten (Inductor)
    "reorder_comm",  # collectives issued early / waited late under compute, same order on every rank
    "cost_driven_fusion",  # memory-bound chains grouped by the bytes they save; backends get whole groups
    "compute_once",  # after the partition: broadcast-read transcendental values computed once, not in every reader
    "hoist_gradients",  # after the partition: grouped-GEMM weight gradients run as soon as their operands exist
)


def resolve_pipeline(passes: str | Sequence[str | Pass] | None) -> list[Pass]:
    """Pass objects for a pipeline given as None (the default), "a,b", or a list of names/passes.

    A string whose every entry starts with '-' ("-a,-b") is the default pipeline without those
    passes (the same form as TREX_PASSES); mixing '-name' with plain names is an error."""
    if passes is None:
        passes = DEFAULT_PIPELINE
    if isinstance(passes, str):
        entries = [p.strip() for p in passes.split(",") if p.strip()]
        removed = [e[1:] for e in entries if e.startswith("-")]
        if removed and len(removed) != len(entries):
            raise TrexError(
                f"passes={passes!r} mixes '-name' (remove from the default pipeline) with plain names (the whole pipeline); "
                "use one form"
            )
        if removed:
            unknown = [name for name in removed if name not in DEFAULT_PIPELINE]
            if unknown:
                raise UnknownNameError(
                    "pass", unknown[0], DEFAULT_PIPELINE, hint="passes='-name' removes a pass of the default pipeline"
                )
            entries = [name for name in DEFAULT_PIPELINE if name not in removed]
        passes = entries
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


__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "CanonicalizeMoe",
    "ComputeOnce",
    "CostDrivenFusion",
    "CpuGemmPrecision",
    "DeadCodeElimination",
    "DecomposeMoe",
    "HoistGradients",
    "Recompute",
    "ReorderComm",
    "TritonPatterns",
    "resolve_pipeline",
]
