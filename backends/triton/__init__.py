"""The Triton backend: trex's kernel library for the MoE training hot spots.

Each kernel is a `torch.library.custom_op` in the `trex_triton` namespace with a fake (shape)
implementation, an autograd implementation and a plain-PyTorch reference with the same meaning
(`kernels/`); the ops run the Triton kernel where `availability.kernels_run_on` says Triton runs
(a GPU, or `TRITON_INTERPRET=1` on CPU) and the reference elsewhere. The pattern pass
`passes/triton_patterns` rewrites matching aten regions to these ops; this backend then claims
those nodes (so `summary()` shows what the kernels took), and Inductor or eager run the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import fx

from trex.backends.backend import Backend
from trex.backends.triton.kernels import (
    grouped_gemm,
    linear_cross_entropy,
    moe_permute,
    rms_norm,
    rope,
    router,
    swiglu,
)

NAMESPACE = "trex_triton"

__all__ = [
    "NAMESPACE",
    "TritonBackend",
    "grouped_gemm",
    "kernel_ops",
    "linear_cross_entropy",
    "moe_permute",
    "rms_norm",
    "rope",
    "router",
    "swiglu",
]


def kernel_ops() -> set[Any]:
    """Every overload of the library's ops."""
    namespace = getattr(torch.ops, NAMESPACE)
    return {
        getattr(namespace, name).default
        for name in dir(namespace)
        if not name.startswith("_") and hasattr(getattr(namespace, name), "default")
    }


class TritonBackend(Backend):
    name: ClassVar[str] = "triton"
    description: ClassVar[str] = (
        "trex's Triton kernel library (the trex_triton ops the pattern passes put in the graph)"
    )

    def supports(self, node: fx.Node) -> bool:
        return node.op == "call_function" and getattr(node.target, "namespace", None) == NAMESPACE

    def lower(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        gm.recompile()  # each node is one kernel launch (or its reference where Triton cannot run)
        return gm
