"""Structural copies of fx graphs: new nodes (metadata copied), the same tensors."""

from __future__ import annotations

from torch import fx


def copy_graph_module(gm: fx.GraphModule, *, flat_signature: bool = False) -> fx.GraphModule:
    """A copy whose graph can be rewritten without touching `gm`'s.

    `flat_signature` drops AOTAutograd's pytree calling convention (`forward(self, primals,
    tangents)`) for one argument per placeholder, which is what a standalone script runs with.
    """
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    if not flat_signature:
        graph._codegen = gm.graph._codegen
    copy = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    copy.meta.update(gm.meta)  # e.g. which backend's decompositions the graph was traced with
    return copy
