"""Per-op cost formulas: FLOPs and bytes of every aten (and trex MoE) op, as sympy expressions.

Each `OpFormula` names its shape symbols, gives FLOPs and bytes moved as sympy expressions of them,
and binds the symbols from a node's FakeTensor shapes. Expressions are lambdified once per formula,
so pricing a graph evaluates plain Python functions (microseconds per node) while `explain` can
still print `2*K*M*N` with the values it was evaluated at.

Ops are found by exact name first (GEMMs, attention, MoE ops, normalisations, losses, gathers and
scatters, sorts, collectives), then by what torch says about them: an op tagged
`torch.Tag.pointwise` gets the element-wise formula, an op whose result aliases its input (a
view) costs nothing and is labelled `view`. An op matched by neither has no formula: annotation
reports it by name and never prices it silently at zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import sympy
import torch

# Shape symbols shared by the formulas below.
M, N, K, B, S, E, T, H = sympy.symbols("M N K B S E T H", positive=True, integer=True)
L_q, L_k, D_qk, D_v, HEADS = sympy.symbols("L_q L_k D_qk D_v heads", positive=True, integer=True)
N_out, N_in = sympy.symbols("N_out N_in", nonnegative=True, integer=True)  # elements of the result / of the inputs
Bytes_in, Bytes_out = sympy.symbols("bytes_in bytes_out", nonnegative=True)
s_in, s_out = sympy.symbols("s_in s_out", positive=True)  # bytes per element
causal = sympy.Symbol("causal_fraction", positive=True)  # fraction of the score matrix computed

KINDS = (
    "gemm",
    "attention",
    "moe",
    "pointwise",
    "reduction",
    "norm",
    "softmax",
    "loss",
    "gather_scatter",
    "sort",
    "copy",
    "creation",
    "view",
    "collective",
    "sync",
)


@dataclass(frozen=True)
class OpFormula:
    kind: str
    flops: sympy.Expr
    bytes: sympy.Expr
    bind: Callable[[Any], dict[sympy.Symbol, float] | None]  # node -> symbol values (None: cannot bind)
    note: str = ""
    symbols: tuple[sympy.Symbol, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.symbols:
            found = sorted(self.flops.free_symbols | self.bytes.free_symbols, key=lambda s: s.name)
            object.__setattr__(self, "symbols", tuple(found))

    @property
    def evaluate(self) -> Callable[..., tuple[float, float]]:
        return _lambdified(self.flops, self.bytes, self.symbols)


@cache
def _lambdified(
    flops: sympy.Expr, nbytes: sympy.Expr, symbols: tuple[sympy.Symbol, ...]
) -> Callable[..., tuple[float, float]]:
    return sympy.lambdify(symbols, (flops, nbytes), modules="math")


# ---------------------------------------------------------------------------------------------
# Reading FakeTensor metadata off fx nodes


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


def node_inputs(node: Any) -> list[torch.Tensor]:
    out = []
    for arg in (*node.args, *node.kwargs.values()):
        for item in arg if isinstance(arg, (list, tuple)) else [arg]:
            if hasattr(item, "meta"):
                out.extend(tensors(item.meta.get("val")))
    return out


def node_outputs(node: Any) -> list[torch.Tensor]:
    return tensors(node.meta.get("val"))


def nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def _shape(arg: Any) -> tuple[int, ...] | None:
    value = arg.meta.get("val") if hasattr(arg, "meta") else None
    if isinstance(value, torch.Tensor):
        return tuple(int(d) for d in value.shape)
    return None


def _element(arg: Any) -> float:
    value = arg.meta.get("val") if hasattr(arg, "meta") else None
    return float(value.element_size()) if isinstance(value, torch.Tensor) else 2.0


def _io(node: Any) -> dict[sympy.Symbol, float]:
    ins, outs = node_inputs(node), node_outputs(node)
    return {
        N_out: float(sum(t.numel() for t in outs)),
        N_in: float(sum(t.numel() for t in ins)),
        Bytes_in: sum(nbytes(t) for t in ins),
        Bytes_out: sum(nbytes(t) for t in outs),
    }


def argument(node: Any, name: str, position: int, default: Any = None) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[position] if len(node.args) > position else default


# ---------------------------------------------------------------------------------------------
# GEMMs


def _bind_mm(node: Any) -> dict | None:
    a, b = _shape(node.args[0]), _shape(node.args[1])
    if not a or not b or len(a) != 2 or len(b) != 2:
        return None
    return {M: a[0], K: a[1], N: b[1], s_in: _element(node.args[0]), s_out: _element(node)}


def _bind_addmm(node: Any) -> dict | None:
    a, b = _shape(node.args[1]), _shape(node.args[2])
    if not a or not b:
        return None
    return {M: a[0], K: a[1], N: b[1], s_in: _element(node.args[1]), s_out: _element(node)}


def _bind_bmm(node: Any, offset: int = 0) -> dict | None:
    a, b = _shape(node.args[offset]), _shape(node.args[offset + 1])
    if not a or not b or len(a) != 3:
        return None
    return {B: a[0], M: a[1], K: a[2], N: b[2], s_in: _element(node.args[offset]), s_out: _element(node)}


def _bind_grouped(node: Any) -> dict | None:
    """aten._grouped_mm / trex.grouped_mm: 2-D x 3-D ([S,K] x [E,K,N]) or 2-D x 2-D with groups along K."""
    a, b = _shape(node.args[0]), _shape(node.args[1])
    if not a or not b:
        return None
    if len(a) == 2 and len(b) == 3:  # rows split over experts
        return {S: a[0], K: a[1], N: b[2], E: b[0], s_in: _element(node.args[0]), s_out: _element(node)}
    if len(a) == 3 and len(b) == 3:  # batched
        return {S: a[0] * a[1], K: a[2], N: b[2], E: a[0], s_in: _element(node.args[0]), s_out: _element(node)}
    if len(a) == 2 and len(b) == 2:  # weight gradient: [M, S] x [S, N] grouped along S
        out = _shape(node)
        experts = out[0] if out and len(out) == 3 else 1
        return {S: a[1], K: a[0], N: b[1], E: experts, s_in: _element(node.args[0]), s_out: _element(node)}
    return None


def _bind_grouped_weight_grad(node: Any) -> dict | None:
    a, b = _shape(node.args[0]), _shape(node.args[1])
    out = _shape(node)
    if not a or not b or not out:
        return None
    return {S: a[0], K: a[1], N: b[1], E: out[0], s_in: _element(node.args[0]), s_out: _element(node)}


_MM = OpFormula("gemm", 2 * M * N * K, (M * K + K * N) * s_in + M * N * s_out, _bind_mm)
_ADDMM = OpFormula("gemm", 2 * M * N * K + M * N, (M * K + K * N + N) * s_in + M * N * s_out, _bind_addmm)
_BMM = OpFormula("gemm", 2 * B * M * N * K, B * (M * K + K * N) * s_in + B * M * N * s_out, _bind_bmm)
_BADDBMM = OpFormula(
    "gemm",
    2 * B * M * N * K + B * M * N,
    B * (M * K + K * N + M * N) * s_in + B * M * N * s_out,
    lambda n: _bind_bmm(n, 1),
)
_GROUPED = OpFormula(
    "gemm", 2 * S * K * N, (S * K + E * K * N) * s_in + S * N * s_out, _bind_grouped, "rows S split over E groups"
)
_GROUPED_WGRAD = OpFormula(
    "gemm", 2 * S * K * N, S * (K + N) * s_in + E * K * N * s_out, _bind_grouped_weight_grad, "per group a_e^T @ b_e"
)


# ---------------------------------------------------------------------------------------------
# Attention (fused kernels): q [B, heads, L_q, D_qk], k [B, heads_kv, L_k, D_qk], v [.., L_k, D_v]


def _bind_sdpa(node: Any, backward: bool = False) -> dict | None:
    offset = 1 if backward else 0  # backward ops take grad_out first
    q, k, v = (_shape(node.args[offset + i]) for i in range(3))
    if not q or not k or not v:
        return None
    schema = node.target._schema
    names = [a.name for a in schema.arguments]
    is_causal = False
    if "is_causal" in names:
        position = names.index("is_causal")
        is_causal = bool(argument(node, "is_causal", position, False))
    lq, lk = q[-2], k[-2]
    fraction = ((lq + 1) / (2 * lq)) if (is_causal and lq == lk) else 1.0
    batch = math.prod(q[:-3]) if len(q) > 3 else 1
    return {
        B: batch,
        HEADS: q[-3],
        L_q: lq,
        L_k: lk,
        D_qk: q[-1],
        D_v: v[-1],
        causal: fraction,
        s_in: _element(node.args[offset]),
    }


_ATTN_FWD_FLOPS = 2 * B * HEADS * L_q * L_k * causal * (D_qk + D_v)
_ATTN_FWD = OpFormula(
    "attention",
    _ATTN_FWD_FLOPS,
    B * HEADS * (2 * L_q * D_qk + L_k * (D_qk + D_v) + L_q * D_v) * s_in,
    _bind_sdpa,
    "QK^T and PV over the (causal part of the) score matrix",
)
_ATTN_BWD = OpFormula(
    "attention",
    sympy.Rational(5, 2) * _ATTN_FWD_FLOPS,
    2 * B * HEADS * (2 * L_q * D_qk + L_k * (D_qk + D_v) + 2 * L_q * D_v) * s_in,
    lambda n: _bind_sdpa(n, True),
    "recompute S, P; dV, dP, dS, dQ, dK: 5 GEMMs vs the forward's 2",
)


def _bind_npu_attention(node: Any, backward: bool = False) -> dict | None:
    """torch_npu's npu_fusion_attention(q, k, v, head_num, input_layout, ...) and its grad
    (q, k, v, dy, head_num, input_layout, ...): layouts BNSD and BSND; sparse modes 2/3 are causal."""
    layout_at = 5 if backward else 4
    layout = argument(node, "input_layout", layout_at, "BNSD")
    shapes = [_shape(node.args[i]) for i in range(3)]
    if any(not s or len(s) != 4 for s in shapes) or layout not in ("BNSD", "BSND"):
        return None
    q, k, v = ((s[0], s[2], s[1], s[3]) if layout == "BSND" else s for s in shapes)
    sparse_mode = argument(node, "sparse_mode", 11 if backward else 16, 0)
    lq, lk = q[2], k[2]
    return {
        B: q[0],
        HEADS: q[1],
        L_q: lq,
        L_k: lk,
        D_qk: q[3],
        D_v: v[3],
        causal: ((lq + 1) / (2 * lq)) if (sparse_mode in (2, 3) and lq == lk) else 1.0,
        s_in: _element(node.args[0]),
    }


_NPU_ATTN_FWD = OpFormula(
    "attention", _ATTN_FWD.flops, _ATTN_FWD.bytes, _bind_npu_attention, "torch_npu flash attention: as SDPA's"
)
_NPU_ATTN_BWD = OpFormula(
    "attention",
    _ATTN_BWD.flops,
    _ATTN_BWD.bytes,
    lambda n: _bind_npu_attention(n, True),
    "torch_npu flash attention backward: as SDPA's",
)


# ---------------------------------------------------------------------------------------------
# Element-wise, reductions, normalisation, losses, data movement (shape-generic)


def _generic(
    kind: str, flops_per_out: float | sympy.Expr = 1, flops_per_in: float | sympy.Expr = 0, note: str = ""
) -> OpFormula:
    return OpFormula(kind, flops_per_out * N_out + flops_per_in * N_in, Bytes_in + Bytes_out, _io, note)


POINTWISE = _generic("pointwise", 1, note="one op per output element; bytes = inputs read + output written")
TRANSCENDENTAL = _generic("pointwise", 4, note="exp/log/trig-class op, ~4 FLOPs per element")
# A vectorized sine or cosine is a range reduction and a polynomial, not one hardware instruction: Arm's
# optimized-routines `v_sinf` (the 1.9-ulp single-precision vector sine) computes n = rint(|x|/pi) with one FMA
# and a subtraction, r = |x| - n*pi with three FMAs (pi split in three parts), r^2 with one multiply and the odd
# polynomial with four FMAs: 18 FLOPs (an FMA counted as 2), plus ~5 bit operations for the sign. SLEEF's
# 1-ulp `Sleef_sinf16_u10`, which PyTorch's CPU vector code calls, adds double-float steps on top. So ~20 per
# element, where the exp/log class above keeps its ~4.
TRIGONOMETRIC = _generic(
    "pointwise", 20, note="sin/cos/tan: range reduction + polynomial, ~20 FLOPs per element (Arm v_sinf's count)"
)
REDUCTION = _generic("reduction", 0, 1, note="one op per input element")
SOFTMAX = _generic("softmax", 0, 5, note="max, subtract, exp, sum, divide per element")
SOFTMAX_BACKWARD = _generic("softmax", 0, 2, note="grad * out, row sum, fused subtract")
SAFE_SOFTMAX = _generic("softmax", 0, 8, note="softmax plus the all-masked-row check and select")
NORM = _generic("norm", 0, 4, note="mean/variance (RMS), scale, shift")
NORM_BACKWARD = _generic("norm", 0, 5, note="")
LOSS = _generic("loss", 0, 1, note="gather target log-prob, reduce")
GATHER = _generic("gather_scatter", 0, 0, note="indexed read/write: pure data movement")
SCATTER_ADD = _generic("gather_scatter", 1, 0, note="indexed accumulate: one add per element")
COPY = _generic("copy", 0, 0, note="read + write")
CREATION = OpFormula("creation", sympy.Integer(0), Bytes_out, _io, "fill: write only")
VIEW = OpFormula("view", sympy.Integer(0), sympy.Integer(0), lambda n: {}, "aliases its input: no data moved")
SYNC = OpFormula(
    "sync", sympy.Integer(0), sympy.Integer(0), lambda n: {}, "waits for a collective; its cost is on the collective"
)

# x ** n for a constant exponent: what both aten's CPU kernel and Inductor compute it as. An integral exponent
# is repeated squaring (Inductor's `pow` lowering expands it into multiplications; aten special-cases small ones):
# floor(log2 |n|) squarings plus one multiply per further set bit, plus a reciprocal for n < 0; 0.5 and -0.5
# are a (reciprocal) square root, the exp/log class's ~4; any other exponent, or a tensor one, exp(n * log x):
# two transcendentals and a multiply.
pow_flops = sympy.Symbol("pow_flops_per_element", nonnegative=True)


def power_flops_per_element(exponent: Any) -> float:
    """FLOPs per element of `x ** exponent` (see above); `exponent` a number, or anything else for a tensor."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return 2 * 4 + 1
    if float(exponent).is_integer():
        n = abs(int(exponent))
        squarings = n.bit_length() - 1 if n else 0
        return float(squarings + max(0, bin(n).count("1") - 1) + (exponent < 0))
    if abs(exponent) == 0.5:
        return 4.0
    return 2 * 4 + 1


def _bind_pow(node: Any) -> dict | None:
    io = _io(node)
    if node.target is getattr(torch.ops.aten.pow, "Scalar", None):  # scalar ** tensor: exp(x * log(scalar))
        io[pow_flops] = 4.0 + 1
    else:
        io[pow_flops] = power_flops_per_element(node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent"))
    return io


POWER = OpFormula(
    "pointwise", pow_flops * N_out, Bytes_in + Bytes_out, _bind_pow, "x ** n: squarings for an integral n"
)


def _bind_sort(node: Any) -> dict | None:
    ins = node_inputs(node)
    if not ins:
        return None
    data = ins[0]
    io = _io(node)
    io[N] = float(max(2, data.numel()))
    return io


SORT = OpFormula("sort", N * sympy.log(N, 2), Bytes_in + Bytes_out, _bind_sort, "comparison sort: n log2 n")


def _bind_topk(node: Any) -> dict | None:
    io = _bind_sort(node)
    if io is None:
        return None
    k = argument(node, "k", 1, 1)
    io[K] = float(max(2, int(k)))
    return io


TOPK = OpFormula("sort", N * sympy.log(K, 2), Bytes_in + Bytes_out, _bind_topk, "selection: n log2 k")


# trex MoE ops ---------------------------------------------------------------------------------


def _bind_moe_dispatch(node: Any) -> dict | None:
    hidden, index = _shape(node.args[0]), _shape(node.args[1])
    if not hidden or not index:
        return None
    rows = math.prod(index)
    return {
        S: max(2, rows),
        H: hidden[-1],
        T: math.prod(hidden[:-1]),
        E: int(node.args[2]),
        s_in: _element(node.args[0]),
    }


def _bind_moe_combine(node: Any) -> dict | None:
    rows, weights = _shape(node.args[0]), _shape(node.args[2])
    if not rows or not weights:
        return None
    return {S: rows[0], H: rows[-1], T: weights[0], s_in: _element(node.args[0])}


def _bind_moe_combine_backward(node: Any) -> dict | None:
    grad, rows, weights = _shape(node.args[0]), _shape(node.args[1]), _shape(node.args[3])
    if not grad or not rows or not weights:
        return None
    return {S: rows[0], H: rows[-1], T: weights[0], s_in: _element(node.args[1])}


def _bind_moe_dispatch_backward(node: Any) -> dict | None:
    grad = _shape(node.args[0])
    tokens = node.args[2]
    if not grad:
        return None
    return {S: grad[0], H: grad[-1], T: int(tokens), s_in: _element(node.args[0])}


def _bind_moe_experts(node: Any, backward: bool = False) -> dict | None:
    values = node_outputs(node)
    if backward:
        grad_hidden, _, grad_gate_up, grad_down = values[:4]
        sorted_hidden, gate_up_out = (node.args[7].meta.get("val"), node.args[8].meta.get("val"))
        rows, hidden = sorted_hidden.shape[0], sorted_hidden.shape[-1]
        fc1 = gate_up_out.shape[-1]
        experts = grad_gate_up.shape[0]
        inner = grad_down.numel() // (experts * hidden)
        element = grad_hidden.element_size()
    else:
        _, _, offsets, sorted_hidden, gate_up_out, _ = values[:6]
        rows, hidden = sorted_hidden.shape[0], sorted_hidden.shape[-1]
        fc1 = gate_up_out.shape[-1]
        experts = offsets.shape[0]
        down = node.args[4].meta.get("val")
        inner = down.numel() // (experts * hidden)
        element = sorted_hidden.element_size()
    tokens = math.prod(node.args[1].meta["val"].shape[:-1]) if not backward else node.args[1].meta["val"].shape[0]
    return {S: rows, H: hidden, M: fc1, N: inner, E: experts, T: tokens, s_in: element}


_EXPERT_GEMMS = 2 * S * H * M + 2 * S * N * H
_MOE_EXPERTS = OpFormula(
    "moe",
    _EXPERT_GEMMS + 4 * S * N + 2 * S * H,
    (2 * T * H + 3 * S * H + S * M + S * N + E * H * (M + N)) * s_in,
    _bind_moe_experts,
    "gate_up + down grouped GEMMs, activation, weighted combine (fused trex.moe_experts)",
)
_MOE_EXPERTS_BACKWARD = OpFormula(
    "moe",
    2 * _EXPERT_GEMMS + 8 * S * N + 4 * S * H,
    (3 * T * H + 6 * S * H + 2 * S * M + 2 * S * N + 3 * E * H * (M + N)) * s_in,
    lambda n: _bind_moe_experts(n, True),
    "data and weight gradients of both grouped GEMMs",
)


def _bind_ep_experts_local(node: Any) -> dict | None:
    """`trex.ep_experts_local` and its two backward halves, the local experts of the split expert-parallel layer: priced at the
    balanced-routing row count the op carries as its last argument (`expected_rows`): a rank receives as many
    (token, slot) rows as it sends (the received-row count itself is data dependent)."""
    gate_up, down = node.args[2].meta["val"], node.args[3].meta["val"]
    rows, width = int(node.args[-1]), node.args[0].meta["val"].shape[-1]
    experts = gate_up.shape[0]
    return {
        S: rows,
        H: width,
        M: gate_up.numel() // (experts * width),
        N: down.numel() // (experts * width),
        E: experts,
        T: rows,
        s_in: gate_up.element_size(),
    }


_EP_EXPERTS_LOCAL = OpFormula(
    "moe",
    _EXPERT_GEMMS + 4 * S * N + 2 * S * H,
    (2 * T * H + 3 * S * H + S * M + S * N + E * H * (M + N)) * s_in,
    _bind_ep_experts_local,
    "local experts' grouped GEMMs over the rows received (balanced: rows sent); the exchanges are their own nodes",
)
_EP_EXPERTS_LOCAL_INPUT_BACKWARD = OpFormula(
    "moe",
    _EXPERT_GEMMS + 8 * S * N + 2 * S * H,
    (2 * T * H + 3 * S * H + 2 * S * M + S * N + E * H * (M + N)) * s_in,
    _bind_ep_experts_local,
    "data gradients of the local grouped GEMMs (the dispatch's gradient exchange needs only these)",
)
_EP_EXPERTS_LOCAL_WEIGHT_BACKWARD = OpFormula(
    "moe",
    _EXPERT_GEMMS + 4 * S * N,
    (2 * S * H + 2 * S * M + S * N + 2 * E * H * (M + N)) * s_in,
    _bind_ep_experts_local,
    "expert-weight gradients of the local grouped GEMMs (rows reduced per expert)",
)


def _bind_ep_exchange(node: Any) -> dict | None:
    """`trex.ep_exchange` (an expert-parallel all-to-all): the rows this rank sends. When that count is data
    dependent (the combine's send, the dispatch gradient's), the receive count stands for it: under
    balanced routing a rank sends as many rows as it receives."""
    rows_in, outs = node.args[0].meta["val"], node_outputs(node)
    rows = rows_in.shape[0]
    if not isinstance(rows, int) and outs and isinstance(outs[0].shape[0], int):
        rows = outs[0].shape[0]
    if not isinstance(rows, int):
        return None
    row_bytes = math.prod(rows_in.shape[1:]) * rows_in.element_size()
    return {Bytes_in: rows * row_bytes, Bytes_out: rows * row_bytes}


_EP_EXCHANGE = OpFormula(
    "collective", sympy.Integer(0), Bytes_in, _bind_ep_exchange, "all-to-all of the rows this rank sends"
)

# ---------------------------------------------------------------------------------------------
# Collectives (functional c10d). Bytes are the buffer the algorithm moves; time comes from the
# cluster model in trex.cost_model.collectives.


def _bind_collective(node: Any) -> dict | None:
    ins = node_inputs(node)
    outs = node_outputs(node)
    if not ins:
        return None
    return {Bytes_in: sum(nbytes(t) for t in ins), Bytes_out: sum(nbytes(t) for t in outs)}  # coalesced: all


COLLECTIVE = OpFormula(
    "collective",
    sympy.Integer(0),
    sympy.Max(Bytes_in, Bytes_out),
    _bind_collective,
    "bytes = the larger of send / receive buffer",
)
REDUCING_COLLECTIVE = OpFormula(
    "collective",
    N_in,
    sympy.Max(Bytes_in, Bytes_out),
    lambda n: {**(_bind_collective(n) or {}), N_in: float(sum(t.numel() for t in node_inputs(n)[:1]))},
    "one add per input element",
)


# ---------------------------------------------------------------------------------------------
# The table: exact op-packet names first.

_TRIGONOMETRIC = {"sin", "cos", "tan"}
_TRANSCENDENTAL = {
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sigmoid",
    "erf",
    "erfc",
    "erfinv",
    "rsqrt",
    "sqrt",
    "silu",
    "gelu",
    "softplus",
    "mish",
    "elu",
    "atan",
    "atan2",
    "asin",
    "acos",
    "sinh",
    "cosh",
    "logit",
    "reciprocal",
    "silu_backward",
    "gelu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "softplus_backward",
    "lgamma",
    "digamma",
}

EXACT: dict[str, OpFormula] = {
    "aten.mm": _MM,
    "aten.addmm": _ADDMM,
    "aten.bmm": _BMM,
    "aten.baddbmm": _BADDBMM,
    "aten._grouped_mm": _GROUPED,
    "aten._scaled_mm": _MM,
    "aten._scaled_grouped_mm": _GROUPED,
    "trex.grouped_mm": _GROUPED,
    "trex.grouped_mm_weight_grad": _GROUPED_WGRAD,
    # decompose_moe's autograd-free twins run the same bodies (trex/ops/moe_decompositions.py)
    "trex.extern_grouped_mm": _GROUPED,
    "trex.extern_grouped_mm_weight_grad": _GROUPED_WGRAD,
    "trex.moe_dispatch": OpFormula(
        "moe",
        S * sympy.log(S, 2),
        (T * H + S * H) * s_in + S * 8 + E * 4,
        _bind_moe_dispatch,
        "sort S (token, slot) pairs by expert, gather S rows",
    ),
    "trex.moe_combine": OpFormula(
        "moe", 2 * S * H, (S * H + T * H) * s_in + S * 8 + T * 4, _bind_moe_combine, "weight S rows, sum k per token"
    ),
    "trex.moe_combine_backward": OpFormula(
        "moe",
        4 * S * H,
        (T * H + 2 * S * H) * s_in + S * 8 + 2 * T * 4,
        _bind_moe_combine_backward,
        "gradient rows (gather x weight) and weight gradients (row dot products)",
    ),
    "trex.moe_dispatch_backward": OpFormula(
        "moe", S * H, (S * H + T * H) * s_in + S * 8, _bind_moe_dispatch_backward, "scatter-add S rows onto T tokens"
    ),
    "trex.moe_experts": _MOE_EXPERTS,
    "trex.moe_experts_backward": _MOE_EXPERTS_BACKWARD,
    "trex.ep_experts_local": _EP_EXPERTS_LOCAL,
    "trex.ep_experts_local_input_backward": _EP_EXPERTS_LOCAL_INPUT_BACKWARD,
    "trex.ep_experts_local_weight_backward": _EP_EXPERTS_LOCAL_WEIGHT_BACKWARD,
    "aten._scaled_dot_product_flash_attention": _ATTN_FWD,
    "aten._scaled_dot_product_flash_attention_for_cpu": _ATTN_FWD,
    "aten._scaled_dot_product_efficient_attention": _ATTN_FWD,
    "aten._scaled_dot_product_cudnn_attention": _ATTN_FWD,
    "aten._flash_attention_forward": _ATTN_FWD,
    "aten._efficient_attention_forward": _ATTN_FWD,
    "aten._scaled_dot_product_flash_attention_backward": _ATTN_BWD,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": _ATTN_BWD,
    "aten._scaled_dot_product_efficient_attention_backward": _ATTN_BWD,
    "aten._scaled_dot_product_cudnn_attention_backward": _ATTN_BWD,
    "aten._flash_attention_backward": _ATTN_BWD,
    "aten._efficient_attention_backward": _ATTN_BWD,
    # torch_npu's fused attention (trex's CPU emulations carry the same names under npu_emul)
    "npu.npu_fusion_attention": _NPU_ATTN_FWD,
    "npu_emul.npu_fusion_attention": _NPU_ATTN_FWD,
    "npu.npu_fusion_attention_grad": _NPU_ATTN_BWD,
    "npu_emul.npu_fusion_attention_grad": _NPU_ATTN_BWD,
    "aten._softmax": SOFTMAX,
    "aten._log_softmax": SOFTMAX,
    "aten._safe_softmax": SAFE_SOFTMAX,
    "aten._softmax_backward_data": SOFTMAX_BACKWARD,
    "aten._log_softmax_backward_data": SOFTMAX_BACKWARD,
    "aten.native_layer_norm": NORM,
    "aten.native_layer_norm_backward": NORM_BACKWARD,
    "aten._fused_rms_norm": NORM,
    "aten._fused_rms_norm_backward": NORM_BACKWARD,
    "aten.native_batch_norm": NORM,
    "aten.native_group_norm": NORM,
    "aten.nll_loss_forward": LOSS,
    "aten.nll_loss_backward": LOSS,
    "aten.nll_loss2d_forward": LOSS,
    "aten.nll_loss2d_backward": LOSS,
    "aten.cross_entropy_loss": SOFTMAX,
    "aten.sum": REDUCTION,
    "aten.mean": REDUCTION,
    "aten.amax": REDUCTION,
    "aten.amin": REDUCTION,
    "aten.max": REDUCTION,
    "aten.min": REDUCTION,
    "aten.prod": REDUCTION,
    "aten.var": REDUCTION,
    "aten.var_mean": REDUCTION,
    "aten.std": REDUCTION,
    "aten.std_mean": REDUCTION,
    "aten.any": REDUCTION,
    "aten.all": REDUCTION,
    "aten.argmax": REDUCTION,
    "aten.argmin": REDUCTION,
    "aten.logsumexp": REDUCTION,
    "aten.norm": REDUCTION,
    "aten.linalg_vector_norm": REDUCTION,
    "aten.cumsum": REDUCTION,
    "aten.cumprod": REDUCTION,
    "aten.count_nonzero": REDUCTION,
    "aten.aminmax": REDUCTION,
    "aten.bincount": REDUCTION,
    "aten.histc": REDUCTION,
    "aten.embedding": GATHER,
    "aten.embedding_dense_backward": SCATTER_ADD,
    "aten.index": GATHER,
    "aten.index_select": GATHER,
    "aten.gather": GATHER,
    "aten.take_along_dim": GATHER,
    "aten.index_put": GATHER,
    "aten._unsafe_index": GATHER,
    "aten._unsafe_index_put": GATHER,
    "aten.index_add": SCATTER_ADD,
    "aten.index_copy": GATHER,
    "aten.scatter": GATHER,
    "aten.scatter_add": SCATTER_ADD,
    "aten.scatter_reduce": SCATTER_ADD,
    "aten.masked_scatter": GATHER,
    "aten.masked_select": GATHER,
    "aten.nonzero": GATHER,
    "aten.searchsorted": GATHER,
    "aten.one_hot": GATHER,
    "aten.sort": SORT,
    "aten.pow": POWER,
    "aten.argsort": SORT,
    "aten.topk": TOPK,
    "aten.kthvalue": TOPK,
    "aten.unique": SORT,
    "aten._unique2": SORT,
    "aten.cat": COPY,
    "aten.stack": COPY,
    "aten.clone": COPY,
    "aten._to_copy": COPY,
    "aten.copy": COPY,
    "aten.copy_": COPY,
    "aten.contiguous": COPY,
    "aten.constant_pad_nd": COPY,
    "aten.repeat": COPY,
    "aten.repeat_interleave": COPY,
    "aten.roll": COPY,
    "aten.flip": COPY,
    "aten.tril": COPY,
    "aten.triu": COPY,
    "aten.slice_backward": COPY,
    "aten.select_backward": COPY,
    "aten.slice_scatter": COPY,
    "aten.select_scatter": COPY,
    "aten.diagonal_scatter": COPY,
    "aten.as_strided_scatter": COPY,
    "aten.expand_copy": COPY,
    "aten.permute_copy": COPY,
    "aten.view_copy": COPY,
    "aten._reshape_copy": COPY,
    "aten.lift_fresh_copy": COPY,
    "aten.index_fill": COPY,
    "aten.fill": CREATION,
    "aten.zero": CREATION,
    "aten.empty": CREATION,
    "aten.empty_like": CREATION,
    "aten.empty_strided": CREATION,
    "aten.new_empty": CREATION,
    "aten.new_empty_strided": CREATION,
    "aten.zeros": CREATION,
    "aten.zeros_like": CREATION,
    "aten.new_zeros": CREATION,
    "aten.ones": CREATION,
    "aten.ones_like": CREATION,
    "aten.new_ones": CREATION,
    "aten.full": CREATION,
    "aten.full_like": CREATION,
    "aten.new_full": CREATION,
    "aten.arange": CREATION,
    "aten.linspace": CREATION,
    "aten.scalar_tensor": CREATION,
    "aten.rand": CREATION,
    "aten.randn": CREATION,
    "aten.rand_like": CREATION,
    "aten.randn_like": CREATION,
    "aten.randint": CREATION,
    "aten.randperm": CREATION,
    "aten.eye": CREATION,
    "aten.native_dropout": POINTWISE,
    "aten.native_dropout_backward": POINTWISE,
    "aten.floor_divide": POINTWISE,
    "aten.remainder": POINTWISE,
    "aten.fmod": POINTWISE,
    "aten.lift_fresh": VIEW,
    "aten.detach": VIEW,
    "aten.alias": VIEW,
    "aten._unsafe_view": VIEW,
    "aten.view": VIEW,
    "aten.reshape": VIEW,
    "aten.t": VIEW,
    "aten.transpose": VIEW,
    "aten.permute": VIEW,
    "aten.expand": VIEW,
    "aten.squeeze": VIEW,
    "aten.unsqueeze": VIEW,
    "aten.slice": VIEW,
    "aten.select": VIEW,
    "aten.split": VIEW,
    "aten.split_with_sizes": VIEW,
    "aten.unbind": VIEW,
    "aten.chunk": VIEW,
    "aten.narrow": VIEW,
    "aten.as_strided": VIEW,
    "aten.diagonal": VIEW,
    "aten.unfold": VIEW,
    "aten.view_as_real": VIEW,
    "aten.view_as_complex": VIEW,
    "aten.movedim": VIEW,
    "aten.unflatten": VIEW,
    "aten.expand_as": VIEW,
    "aten.sym_size": VIEW,
    "aten.sym_numel": VIEW,
    "aten.sym_stride": VIEW,
    "aten.sym_storage_offset": VIEW,
    "aten._assert_tensor_metadata": VIEW,
    "aten._assert_scalar": VIEW,
    "aten._local_scalar_dense": VIEW,
    "aten.item": VIEW,
    "aten.sym_constrain_range_for_size": VIEW,
    "_operator.getitem": VIEW,
    "operator.getitem": VIEW,
    "_c10d_functional.all_reduce": REDUCING_COLLECTIVE,
    "_c10d_functional.all_reduce_": REDUCING_COLLECTIVE,
    "_c10d_functional.reduce_scatter_tensor": REDUCING_COLLECTIVE,
    "_c10d_functional.all_gather_into_tensor": COLLECTIVE,
    "_c10d_functional.all_to_all_single": COLLECTIVE,
    "_c10d_functional.broadcast": COLLECTIVE,
    "_c10d_functional.all_reduce_coalesced": REDUCING_COLLECTIVE,
    "_c10d_functional.all_gather_into_tensor_coalesced": COLLECTIVE,
    "_c10d_functional.reduce_scatter_tensor_coalesced": REDUCING_COLLECTIVE,
    "_c10d_functional.wait_tensor": SYNC,
    "trex.ep_exchange": _EP_EXCHANGE,
    "trex.ep_counts": COLLECTIVE,
    "trex.ep_rows": SYNC,
    "_c10d_functional_autograd.all_to_all_single": COLLECTIVE,
    "_c10d_functional_autograd.all_gather_into_tensor": COLLECTIVE,
    "_c10d_functional_autograd.reduce_scatter_tensor": REDUCING_COLLECTIVE,
}

COLLECTIVE_KIND = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_to_all_single": "all_to_all",
    "ep_exchange": "all_to_all",
    "ep_counts": "all_to_all",
    "broadcast": "all_gather",
}


def op_name(target: Any) -> str:
    """`aten.mm` for torch.ops.aten.mm.default; `operator.getitem` for Python callables."""
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        qualified = packet._qualified_op_name  # e.g. "aten::mm"
        return qualified.replace("::", ".")
    module = getattr(target, "__module__", "") or ""
    return f"{module}.{getattr(target, '__name__', str(target))}"


def _is_view(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    aliases = [r.alias_info for r in schema.returns]
    return all(a is not None and not a.is_write for a in aliases)


def formula_for(target: Any) -> OpFormula | None:
    """The formula for an fx node target, or None when trex has none (the caller reports it)."""
    name = op_name(target)
    if name in EXACT:
        return EXACT[name]
    short = name.split(".")[-1]
    tags = getattr(target, "tags", ())
    if torch.Tag.pointwise in tags:
        if short.rstrip("_") in _TRIGONOMETRIC:
            return TRIGONOMETRIC
        return TRANSCENDENTAL if short.rstrip("_") in _TRANSCENDENTAL else POINTWISE
    if _is_view(target):
        return VIEW
    if name.startswith("aten.") and short.rstrip("_") in _TRIGONOMETRIC:
        return TRIGONOMETRIC
    if name.startswith("aten.") and short.rstrip("_") in _TRANSCENDENTAL:
        return TRANSCENDENTAL
    return None


def known_op_names() -> Sequence[str]:
    return sorted(EXACT)
