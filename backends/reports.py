"""What the backends emitted, read back from a compiled model's lowerings.

A backend's `lower` may return a callable with `emitted_ops` (the names of the operators it
emitted, one per call) and `report` (anything its backend's `summary_lines` reads); the session
(`compiled.trex.lowered_ops()`, `.summary()`) collects them here without knowing any backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trex.backends.lowering import LoweredSubgraph, Lowering


def lowered_subgraphs(lowerings: Iterable[Lowering]) -> list[LoweredSubgraph]:
    found = []
    for lowering in lowerings:
        module = lowering.module
        children = module.named_children() if hasattr(module, "named_children") else ()
        found += [child for _, child in children if isinstance(child, LoweredSubgraph)]
    return found


def emitted_ops(lowerings: Iterable[Lowering]) -> dict[str, list[str]]:
    """Backend name -> the op names it emitted (in lowering order, one entry per emitted call)."""
    ops: dict[str, list[str]] = {}
    for subgraph in lowered_subgraphs(lowerings):
        emitted = getattr(subgraph.compiled, "emitted_ops", None)
        if emitted is not None:
            ops.setdefault(subgraph.backend, []).extend(emitted)
    return ops


def backend_summary_lines(backends: Iterable[Any], lowerings: Iterable[Lowering]) -> list[str]:
    """Lines from every backend that has `summary_lines(lowered_subgraphs)`."""
    subgraphs = lowered_subgraphs(lowerings)
    lines: list[str] = []
    for backend in backends:
        summarize = getattr(backend, "summary_lines", None)
        if callable(summarize):
            mine = [s for s in subgraphs if s.backend == backend.name]
            lines += summarize(mine)
    return lines
