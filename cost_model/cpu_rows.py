"""What PyTorch's CPU row-wise kernels (softmax, reductions) pay per row, beyond their bytes.

Two costs that bytes and a per-call overhead do not see, both measured by `trex calibrate`
(`DeviceProfile.vector_lanes`, `scalar_softmax_ns`, `reduce_output_ns`; zero on accelerators):

* **Softmax over rows shorter than one SIMD vector.** The last-dimension softmax kernels vectorise
  along the row; a row shorter than the vector (16 fp32 lanes with AVX-512, 8 with AVX2) runs the
  scalar fallback, one libm `exp` per element. On the development machine a softmax over rows of 2
  to 8 costs ~15-22 ns per element, over rows of 16 ~1 ns: a tiny model's router softmax over 8
  experts or a 2-wide mixing softmax costs 10-20x what its bytes say.
* **A reduction pays per output.** TensorIterator's reduction loops run once per output element:
  a horizontal vector reduction of a contiguous row (the reduced dimension is the innermost one in
  memory), or an accumulation across an outer dimension (strided). Summing (1024, 2) costs ~4 ns
  per output here on top of the 8 KiB it reads, summing over the middle of (512, 2, 2) ~9 ns.

Both follow from the node's shapes, strides and dimension arguments, so they work on FakeTensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

SOFTMAX_FORWARD = frozenset({"aten._softmax", "aten._log_softmax", "aten._safe_softmax"})
SOFTMAX_BACKWARD = frozenset({"aten._softmax_backward_data", "aten._log_softmax_backward_data"})
# reductions whose reduced dimensions are the second argument (a list or one int; absent: all)
ROW_REDUCTIONS = frozenset(
    {
        "aten.sum",
        "aten.mean",
        "aten.amax",
        "aten.amin",
        "aten.max",
        "aten.min",
        "aten.prod",
        "aten.var",
        "aten.std",
        "aten.any",
        "aten.all",
        "aten.argmax",
        "aten.argmin",
        "aten.logsumexp",
        "aten.norm",
        "aten.linalg_vector_norm",
    }
)


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def scalar_softmax_elements(node: fx.Node, name: str, lanes: int) -> tuple[float, str]:
    """(elements, "forward" | "backward") a softmax node runs on the scalar path: all of them when it
    normalises the contiguous last dimension and that dimension is shorter than `lanes`; else 0."""
    if lanes <= 0 or name not in SOFTMAX_FORWARD | SOFTMAX_BACKWARD:
        return 0.0, ""
    backward = name in SOFTMAX_BACKWARD
    tensor = _val(node.args[1] if backward else node.args[0])
    dim = node.args[2] if backward else node.args[1]
    if not isinstance(tensor, torch.Tensor) or not isinstance(dim, int) or tensor.dim() == 0:
        return 0.0, ""
    dim %= tensor.dim()
    size = tensor.shape[dim]
    if dim != tensor.dim() - 1 or size >= lanes or (size > 1 and tensor.stride(dim) != 1):
        return 0.0, ""
    return float(tensor.numel()), "backward" if backward else "forward"


def reduction_outputs(node: fx.Node, name: str) -> tuple[float, str]:
    """(output elements, "contiguous" | "strided") of a row reduction: contiguous when the reduced
    dimensions include the input's innermost one in memory (each output reduces a contiguous row),
    strided when they are all outer dimensions (outputs accumulate across them). (0, "") otherwise."""
    if name not in ROW_REDUCTIONS or not node.args:
        return 0.0, ""
    tensor = _val(node.args[0])
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        return 0.0, ""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return 1.0, "contiguous"  # a full reduction: one output
    if isinstance(dims, int):
        dims = [dims]
    if not all(isinstance(d, int) for d in dims):
        return 0.0, ""
    ndim = tensor.dim()
    reduced = {d % ndim for d in dims}
    outputs = 1
    for i, size in enumerate(tensor.shape):
        if i not in reduced:
            outputs *= int(size)
    candidates = [i for i in range(ndim) if tensor.shape[i] > 1]
    innermost = min(candidates, key=lambda i: tensor.stride(i)) if candidates else ndim - 1
    return float(outputs), "contiguous" if innermost in reduced else "strided"
