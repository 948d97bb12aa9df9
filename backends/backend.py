"""The `Backend` interface: what a plugin implements to run part of a trex graph.

A backend answers `supports(node)` for each node (it must return False, never raise, for anything
it cannot run) and `lower(gm, example_inputs)` for a graph made only of nodes it said yes to,
returning a callable with the graph's signature. Backends are tried in the user's priority order;
the eager reference backend takes whatever the others leave, so no backend has to be complete.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from torch import fx

# GraphModule.meta key `lower_graph` sets on a region that is the whole graph AOTAutograd compiles (its
# forward or its backward): the region's inputs are then the graph's inputs, whose sizes and strides Dynamo's
# guards (the forward's parameters and user inputs) and AOTAutograd (the saved activations, as the forward
# returned them, and the tangents, which it restrides to the traced layout) have already fixed. A backend may
# leave out checks of its own on them (`InductorBackend.runtime_checks`).
WHOLE_GRAPH = "trex_whole_graph"


class Backend(ABC):
    name: ClassVar[str]
    description: ClassVar[str] = ""
    # How the joint graph is split into forward and backward when this backend leads the list:
    # "default" saves what the backward uses; "min_cut" recomputes cheap pointwise chains in the
    # backward when that saves memory traffic (AOTAutograd's min-cut partitioner, which a backend
    # that fuses those chains into its kernels wants: Inductor).
    partitioner: ClassVar[str] = "default"

    @abstractmethod
    def supports(self, node: fx.Node) -> bool:
        """True when this backend can run `node` (a call node with meta['val']); never raises."""

    @abstractmethod
    def lower(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """A callable computing `gm` (whose call nodes this backend all supports).

        `example_inputs` are FakeTensors (shapes, dtypes, devices) of gm's placeholders.
        """

    def prepare(self, gm: fx.GraphModule, phase: str, graph_inputs: Sequence[Any] | None) -> None:
        """Rewrite the whole graph in place before it is split among the backends (default: nothing).

        `phase` is "forward", "backward" or "inference", or "captured": Dynamo's torch-level graph before
        AOTAutograd traces it (a region rewritten there into an op with its own autograd changes the
        backward too; its nodes carry `meta["example_value"]`, not `meta["val"]`). `graph_inputs` are the captured graph's inputs in
        order, the parameters as themselves and every other input as None (all None when unknown):
        AOTAutograd's backward graph returns the gradient of the i-th input at its i-th output. A rewrite
        must keep what the graph computes (e.g. accumulating a weight gradient into a persistent buffer
        instead of returning it).
        """
        return None

    def __repr__(self) -> str:
        return f"<trex backend {self.name!r}>"
