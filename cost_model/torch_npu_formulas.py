"""Cost formulas of the torch_npu fused operators the Ascend backend emits (and their CPU emulations).

The Ascend backend's graphs call torch_npu's operators (`npu.*` on a device, the same schemas as
`npu_emul.*` here). Without a formula, the cost model reports such a call as unpriced and it counts 0 s,
which under-counts every share that includes it. Each formula below reads the call's tensor shapes
(FakeTensor `meta["val"]`) and says what the kernel must do at least: the FLOPs of its arithmetic and
the bytes it reads and writes once, as the element-wise, reduction and GEMM formulas of `op_formulas`
do for aten. The device profile (e.g. ascend-910c's bandwidth, vector rate, cube GEMM model and
per-kernel launch cost) turns them into seconds in `annotate`. FLOP counts per element follow each
operator's documented math (torch_npu's API docs for the 2.13.0 wheel whose schemas `backends/ascend`
ships):

- npu_rotary_mul: out = x * r1 + rotate(x) * r2 (2 multiplies + 1 add per output element; the rotation
  is a lane permutation with a sign); its backward: dx = g * r1 + rotate^T(g * r2) (3), dr1 = sum g * x
  (2), dr2 = sum g * rotate(x) (2) per gradient element, reduced to the tables' shapes.
- npu_rms_norm(_backward): as aten's fused RMSNorm (`NORM`, `NORM_BACKWARD`).
- npu_swiglu: silu(a) * b per output element (exp, add, divide, two multiplies); backward ~5 per input
  element. npu_clipped_swiglu adds the two clamps and the alpha scale and bias (8 per output).
- MoE gating: softmax (or sigmoid + bias) over each token's experts plus a top-k selection.
- token permute / unpermute and their gradients: row gathers / weighted row sums (one multiply-add per
  element for the weighted ones), the permute's sort of the (token, slot) indices (n log2 n).
- npu_grouped_matmul (group_type 0: rows split over experts, x [S, K] x w [E, K, N]) and
  npu_grouped_matmul_add(_) (group_type 2: per expert x_e^T @ dy_e, K split over experts, accumulated into
  an fp32 `self` that is read and written): 2 S K N FLOPs, priced by the device's GEMM model.
"""

from __future__ import annotations

from typing import Any

import sympy

from trex.cost_model.op_formulas import (
    EXACT,
    NORM,
    NORM_BACKWARD,
    SCATTER_ADD,
    Bytes_in,
    Bytes_out,
    E,
    K,
    N,
    OpFormula,
    S,
    _bind_sort,
    _element,
    _generic,
    _io,
    _shape,
    argument,
    node_outputs,
    s_in,
    s_out,
)


def _bind_rotary_backward(node: Any) -> dict | None:
    """Counts per element of the incoming gradient (the first argument), bytes of every input and output."""
    grad = _shape(node.args[0])
    if grad is None:
        return None
    io = _io(node)
    io[N] = float(max(1, _numel(grad)))
    return io


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _bind_permute(node: Any) -> dict | None:
    """npu_moe_token_permute(tokens, indices) / npu_moe_init_routing_v2(x, expert_idx): sorts the S = indices.numel() (token, slot) pairs and gathers S rows."""
    indices = _shape(node.args[1])
    if indices is None:
        return None
    io = _io(node)
    io[N] = float(max(2, _numel(indices)))
    return io


def _bind_gating_top_k(node: Any) -> dict | None:
    io = _bind_sort(node)
    if io is None:
        return None
    names = [a.name for a in node.target._schema.arguments]  # k: the 2nd argument of _top_k, 3rd of _softmax
    k = argument(node, "k", names.index("k"), 1)
    io[K] = float(max(2, int(k)))
    return io


def _grouped_operands(node: Any) -> tuple[Any, Any] | None:
    """The first x and weight of npu_grouped_matmul(Tensor[] x, Tensor[] weight, ...)."""
    xs, ws = node.args[0], node.args[1]
    if not isinstance(xs, (list, tuple)) or not isinstance(ws, (list, tuple)) or not xs or not ws:
        return None
    return xs[0], ws[0]


def _bind_grouped_matmul(node: Any) -> dict | None:
    """group_type 0 (the forward and data-gradient GEMMs): x [S, K] times weight [E, K, N] -> [S, N];
    group_type 2 (K split, a weight gradient): x [K, S] (laid out transposed) times weight [S, N] -> [E, K, N]."""
    operands = _grouped_operands(node)
    if operands is None:
        return None
    x, w = (_shape(a) for a in operands)
    if not x or not w or len(x) != 2:
        return None
    if node.kwargs.get("group_type") == 2 and len(w) == 2:
        out = node_outputs(node)
        experts = out[0].shape[0] if out and out[0].dim() == 3 else 1
        return {**_io(node), S: x[1], K: x[0], N: w[1], E: experts}
    if len(w) != 3:
        return None
    return {**_io(node), S: x[0], K: x[1], N: w[2], E: w[0]}


def splits_k(node: Any, name: str) -> bool:
    """A grouped GEMM whose K is split over the experts (a weight gradient): [K, S_e] x [S_e, N] per expert."""
    return name in WEIGHT_GRAD_GEMMS or (name.endswith(".npu_grouped_matmul") and node.kwargs.get("group_type") == 2)


def _bind_grouped_matmul_add(node: Any) -> dict | None:
    """group_type 2: self [E, K, N] (fp32) += x_e^T [K, S_e] @ weight_e [S_e, N] for each expert's rows."""
    acc, x, w = (_shape(node.args[i]) for i in range(3))
    if not acc or not x or not w or len(acc) != 3 or len(x) != 2 or len(w) != 2:
        return None
    return {S: x[0], K: x[1], N: w[1], E: acc[0], s_in: _element(node.args[1]), s_out: _element(node.args[0])}


_ROTARY = _generic("pointwise", 3, note="x * r1 + rotate(x) * r2: 2 multiplies, 1 add per output element")
_ROTARY_BACKWARD = OpFormula(
    "pointwise",
    7 * N,
    Bytes_in + Bytes_out,
    _bind_rotary_backward,
    "per gradient element: dx = g*r1 + rotate^T(g*r2) (3), dr1 += g*x (2), dr2 += g*rotate(x) (2)",
)
_SWIGLU = _generic("pointwise", 6, note="silu(a) * b per output element: exp, add, divide, 2 multiplies")
_SWIGLU_BACKWARD = _generic("pointwise", 5, note="d silu(a) * b and silu(a) * g: ~10 per (a, b) pair of the input")
_CLIPPED_SWIGLU = _generic("pointwise", 8, note="clamp a and b, silu(alpha * a) * (b + bias) per output element")
_GATING_SOFTMAX = OpFormula(
    "moe",
    5 * N + N * sympy.log(K, 2),
    Bytes_in + Bytes_out,
    _bind_gating_top_k,
    "softmax over each token's experts (5 per score), then top-k (n log2 k)",
)
_GATING_TOP_K = OpFormula(
    "moe",
    6 * N + N * sympy.log(K, 2),
    Bytes_in + Bytes_out,
    _bind_gating_top_k,
    "sigmoid/softmax + bias over each token's experts (6 per score), grouped top-k (n log2 k), renormalise",
)
_GATING_TOP_K_BACKWARD = _generic("moe", 0, 3, note="the score gradient through the selection and normalisation")
_PERMUTE = OpFormula(
    "moe", N * sympy.log(N, 2), Bytes_in + Bytes_out, _bind_permute, "sort the (token, slot) pairs, gather their rows"
)
_INIT_ROUTING = OpFormula(
    "moe",
    N * sympy.log(N, 2) + N,
    Bytes_in + Bytes_out,
    _bind_permute,
    "sort the (token, slot) pairs, gather their rows, count each expert's rows (one pass)",
)
_UNPERMUTE = _generic("moe", 0, 2, note="weighted sum of each token's expert rows: a multiply-add per element read")
_UNPERMUTE_GRAD = _generic("moe", 0, 2, note="rows gathered back times their weight; the weights' row dot products")
_EXPERT_TOKENS = _generic("moe", 0, 1, note="a pass over the sorted expert ids: each expert's end row")
_GROUPED_MATMUL = OpFormula(
    "gemm",
    2 * S * K * N,
    Bytes_in + Bytes_out,
    _bind_grouped_matmul,
    "group_type 0: rows S split over E experts; group_type 2: K split, per expert x_e^T @ dy_e; each tensor moved once",
)
_GROUPED_MATMUL_ADD = OpFormula(
    "gemm",
    2 * S * K * N,
    S * (K + N) * s_in + 2 * E * K * N * s_out,
    _bind_grouped_matmul_add,
    "group_type 2: per expert x_e^T @ dy_e accumulated into an fp32 self (read and written)",
)

# the names the graph carries: torch_npu's own ops on a device, the CPU emulations (trex.backends.ascend) here
_BY_OP = {
    "npu_rotary_mul": _ROTARY,
    "npu_rotary_mul_backward": _ROTARY_BACKWARD,
    "npu_rms_norm": NORM,
    "npu_rms_norm_backward": NORM_BACKWARD,
    "npu_swiglu": _SWIGLU,
    "npu_swiglu_backward": _SWIGLU_BACKWARD,
    "npu_clipped_swiglu": _CLIPPED_SWIGLU,
    "npu_moe_gating_top_k_softmax": _GATING_SOFTMAX,
    "npu_moe_gating_top_k": _GATING_TOP_K,
    "npu_moe_gating_top_k_backward": _GATING_TOP_K_BACKWARD,
    "npu_moe_token_permute": _PERMUTE,
    "npu_moe_init_routing_v2": _INIT_ROUTING,
    "npu_moe_token_permute_grad_v2": SCATTER_ADD,
    "npu_moe_token_unpermute": _UNPERMUTE,
    "npu_moe_token_unpermute_grad": _UNPERMUTE_GRAD,
    "npu_moe_compute_expert_tokens": _EXPERT_TOKENS,
    "npu_grouped_matmul": _GROUPED_MATMUL,
    "npu_grouped_matmul_add": _GROUPED_MATMUL_ADD,
    "npu_grouped_matmul_add_": _GROUPED_MATMUL_ADD,
}
FORMULAS: dict[str, OpFormula] = {f"{ns}.{op}": f for op, f in _BY_OP.items() for ns in ("npu", "npu_emul")}
# registered in the exact-name table (this module builds on op_formulas, which must not import it back);
# `annotate` imports this module, so every graph it prices knows these ops
EXACT.update(FORMULAS)
# grouped GEMMs whose K is split over the experts (a weight gradient): the device's GEMM model runs [K, S_e] x [S_e, N]
WEIGHT_GRAD_GEMMS = frozenset(
    f"{ns}.{op}" for op in ("npu_grouped_matmul_add", "npu_grouped_matmul_add_") for ns in ("npu", "npu_emul")
)
