"""`trex.compute_once(x)`: x's value, computed once into a buffer of its own by a code generator that would
otherwise recompute it inside every kernel that reads it.

Inductor inlines a pointwise value into each consumer's loop unless a heuristic realizes it
(`StorageBox.should_realize_on_reuse` in torch/_inductor/ir.py: on CPU only exp/log/sigmoid/tanh count as
heavy, plus a read/op-count threshold). A value that is small and read broadcast - the rotary embedding's
cos/sin tables, `[S, D]` read by every query and key product of every layer as `[B, H, S, D]` - is then
recomputed for every element of every consumer: its sin/cos, the `cat` of the frequencies (an index select in
each consumer's loop) and the position-times-frequency product. `passes.compute_once` wraps such a value in
this op where the cost model prices computing it once below recomputing it; Inductor's lowering of the op
(`backends/inductor/compute_once_lowering.py`) realizes its input, so its consumers load it.

Outside a code generator the op is a copy (a custom op must not return its input as its output). It has no
autograd: it lives only in graphs whose backward is already explicit (the partitioned forward and backward).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trex.ops import moe

_library = torch.library.Library(moe.NAMESPACE, "FRAGMENT")
_library.define("compute_once(Tensor x) -> Tensor")


def compute_once_copy(x: Tensor) -> Tensor:
    """The op's value outside a code generator: a copy of `x` with its strides."""
    return x.clone()


_library.impl("compute_once", compute_once_copy, "CompositeExplicitAutograd")


@torch.library.register_fake("trex::compute_once", lib=_library)
def _(x):
    return x.clone()
