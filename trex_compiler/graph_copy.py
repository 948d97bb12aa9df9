"""Structural copies of fx graphs: new nodes (metadata copied), the same tensors."""

from __future__ import annotations

from torch import fx
from torch.fx._lazy_graph_module import _LazyGraphModule


def copy_graph_module(gm: fx.GraphModule, *, flat_signature: bool = False) -> fx.GraphModule:
    """A copy whose graph can be rewritten without touching `gm`'s.

    `flat_signature` drops AOTAutograd's pytree calling convention (`forward(self, primals,
    tangents)`) for one argument per placeholder, which is what a standalone script runs with.

    The copy generates its Python code when first called or read (`_LazyGraphModule`, as AOTAutograd's
    own graphs do): most copies are only rewritten and handed on (the pass manager's snapshot for a
    failure reproducer, the lowering's working copy that Inductor compiles from the graph), and the code
    of a several-thousand-node graph took a fifth of trex's pass time on tiny DeepSeek-V4
    (bench/RESULTS.md 11, tenth session).
    """
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    if not flat_signature:
        graph._codegen = gm.graph._codegen
    copy = _LazyGraphModule(gm, graph, class_name=type(gm).__name__)
    copy.meta.update(gm.meta)  # e.g. which backend's decompositions the graph was traced with
    return copy
