"""The eager reference backend: runs any node with PyTorch's own kernels.

It is the semantics every other backend is tested against, and it always takes the nodes the
other backends leave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from torch import fx

from trex.backends.backend import Backend


class EagerBackend(Backend):
    name: ClassVar[str] = "eager"
    description: ClassVar[str] = "PyTorch eager kernels via the graph's generated Python (reference; any device)"

    def supports(self, node: fx.Node) -> bool:
        return True

    def lower(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        gm.recompile()
        return gm
