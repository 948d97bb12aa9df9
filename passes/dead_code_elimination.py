"""Dead-code elimination: remove computations whose values nothing uses."""

from __future__ import annotations

from typing import ClassVar

from torch import fx

from trex.pass_manager import Decision, PassContext, PassResult


class DeadCodeElimination:
    """Invariant established: every remaining call node is used, or has a side effect.

    Removes call nodes with no users, repeatedly (a removal can free its inputs), keeping impure
    nodes (in-place mutation, RNG-state updates, collectives with side effects) and placeholders,
    which are the graph's signature. Each removal consumes one unit of fuel.
    """

    name: ClassVar[str] = "dead_code_elimination"

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        decisions = []
        for node in reversed(list(gm.graph.nodes)):
            if node.op not in ("call_function", "call_method", "call_module", "get_attr") or node.users:
                continue
            if node.op != "get_attr" and node.is_impure():
                continue
            if not ctx.fuel.take():
                break
            decisions.append(Decision("remove", node.name, "its value is never used", {"op": str(node.target)}))
            gm.graph.erase_node(node)
        if decisions:
            gm.graph.lint()
            gm.delete_all_unused_submodules()
        return PassResult(modified=bool(decisions), decisions=decisions)
