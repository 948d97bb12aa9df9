"""trex's passes, and the default pipeline as data.

Each pass is one module (or sub-package) with one class: a `name`, a docstring stating the invariant
it establishes, and `run(gm, ctx) -> PassResult`. `DEFAULT_PIPELINE` is the order `trex.compile`
runs them in; `passes=` replaces it, `TREX_PASSES=-name` disables one.
"""

from __future__ import annotations

from collections.abc import Sequence

from trex.errors import UnknownNameError
from trex.pass_manager import Pass
from trex.passes.canonicalize import CanonicalizeMoe
from trex.passes.dead_code_elimination import DeadCodeElimination

# Every pass trex ships, by name.
PASSES: dict[str, type] = {p.name: p for p in (CanonicalizeMoe, DeadCodeElimination)}

DEFAULT_PIPELINE: tuple[str, ...] = (
    "canonicalize_moe",  # fused MoE ops -> dispatch / grouped_mm / combine, tagged per layer
    "dead_code_elimination",  # drop values nothing uses
)


def resolve_pipeline(passes: str | Sequence[str | Pass] | None) -> list[Pass]:
    """Pass objects for a pipeline given as None (the default), "a,b", or a list of names/passes."""
    if passes is None:
        passes = DEFAULT_PIPELINE
    if isinstance(passes, str):
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    resolved = []
    for item in passes:
        if isinstance(item, str):
            if item not in PASSES:
                raise UnknownNameError("pass", item, PASSES)
            resolved.append(PASSES[item]())
        else:
            resolved.append(item)
    return resolved


__all__ = ["DEFAULT_PIPELINE", "PASSES", "CanonicalizeMoe", "DeadCodeElimination", "resolve_pipeline"]
