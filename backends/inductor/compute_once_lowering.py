"""Inductor's lowering of `trex.compute_once`: its input realized into a buffer, which every consumer then loads.

Left to Inductor, a pointwise value is an expression its consumers inline into their own loops; a value read
broadcast by many kernels (the rotary cos/sin tables) is then recomputed for every element each of them
writes. `passes.compute_once` marks the values the cost model prices cheaper computed once; this lowering
makes that so: it realizes the input (a `ComputedBuffer` of the input's own size, one kernel) and returns it,
so no copy is made and every consumer reads the buffer. Values are unchanged: the same expression, evaluated
once per element of the value instead of once per element read.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def register_compute_once_lowering() -> None:
    """Register the lowering in Inductor's table (once per process)."""
    from torch._inductor.lowering import register_lowering

    import trex.ops.compute_once  # noqa: F401 - defines the op

    @register_lowering(torch.ops.trex.compute_once.default, type_promotion_kind=None)
    def _compute_once(x):
        x.realize()
        return x
