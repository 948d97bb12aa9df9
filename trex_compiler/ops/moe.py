"""The trex MoE op set: one fused experts op, and the primitives it is made of.

Capture turns every transformers experts module into ONE op, `trex.moe_experts` (forward) and
`trex.moe_experts_backward` (its backward), so a captured graph holds no data-dependent control
flow and one node marks each MoE layer. Its meaning is defined by two Python functions,
`moe_experts_reference` and `moe_experts_backward_reference`, written with the primitives below;
they are the op's implementation and also what `passes.canonicalize.moe` inlines, so the executed
and the decomposed forms cannot drift apart.

The primitives (routing result in; dispatch -> grouped GEMM -> combine) are what the cost model and
the backends see: S = tokens * top_k rows, E experts.

    moe_dispatch(hidden[T,H], top_k_index[T,k], E) -> sorted_hidden[S,H], perm[S], offsets[E]
    grouped_mm(input[S,K], weight[E,K,N], offsets[E]) -> [S,N]
    grouped_mm_weight_grad(a[S,M], b[S,K], offsets[E]) -> [E,M,K]       (per group a_e^T @ b_e)
    moe_combine(expert_out[S,H], perm[S], top_k_weights[T,k]) -> [T,H]
    moe_combine_backward(grad[T,H], expert_out[S,H], perm[S], top_k_weights[T,k]) -> [S,H], [T,k]
    moe_dispatch_backward(grad_sorted[S,H], perm[S], T) -> [T,H]

`perm[s]` is the flat (token * k + slot) index of sorted row s; rows are sorted by expert, stably, so
expert e owns rows offsets[e-1]:offsets[e]. Every shape is static (S = T*k), which is what keeps
capture free of graph breaks; only the split points inside `offsets` depend on the data.

Index dtypes: `perm` is int64 and `offsets` int32 unless the dispatch (and `moe_experts`, which saves both
for its backward) is asked for others (`perm_dtype`, `offsets_dtype`: int32 or int64). A backend whose
kernels take other index dtypes asks for them before AOTAutograd traces the graph, so the forward produces
and saves the indices in the dtype its ops read, instead of converting them around every routing op (the
Ascend backend: int32 rows as `npu_moe_init_routing_v2` returns them, int64 group ends as
`npu_grouped_matmul` reads them). The values are the same in either dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

NAMESPACE = "trex"

# Gate activations the fused op knows by name; a model whose experts gate differently is not
# canonicalized (capture keeps transformers' own implementation for it, and says so).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


# ---------------------------------------------------------------------------------------------
# Primitives


INDEX_DTYPES = (torch.int32, torch.int64)


def check_index_dtypes(perm_dtype: torch.dtype, offsets_dtype: torch.dtype) -> None:
    """The routing indices are int32 or int64 (both hold every row index and group end of a routed batch
    below 2**31 rows); anything else is refused by name."""
    for name, dtype in (("perm_dtype", perm_dtype), ("offsets_dtype", offsets_dtype)):
        if dtype not in INDEX_DTYPES:
            raise ValueError(f"trex MoE ops: {name} must be torch.int32 or torch.int64, got {dtype}")


def asks_other_index_dtypes(graph) -> bool:
    """Whether a dispatch in `graph` produces other index dtypes than the defaults (int64 perm, int32 offsets):
    a pass that rewrites the MoE primitives into code of its own, written for the defaults, leaves such a graph."""
    dispatch = torch.ops.trex.moe_dispatch.default
    defaults = (torch.int64, torch.int32)

    def asked(node) -> tuple:
        given = (*node.args[3:5], *defaults[len(node.args[3:5]) :])
        return (node.kwargs.get("perm_dtype", given[0]), node.kwargs.get("offsets_dtype", given[1]))

    return any(n.op == "call_function" and n.target is dispatch and asked(n) != defaults for n in graph.nodes)


@torch.library.custom_op("trex::moe_dispatch", mutates_args=())
def moe_dispatch(
    hidden: Tensor,
    top_k_index: Tensor,
    num_experts: int,
    perm_dtype: torch.dtype = torch.int64,
    offsets_dtype: torch.dtype = torch.int32,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sort the (token, slot) pairs by expert and gather their rows."""
    check_index_dtypes(perm_dtype, offsets_dtype)
    top_k = top_k_index.size(-1)
    expert_ids = top_k_index.reshape(-1)
    _, perm = torch.sort(expert_ids, stable=True)
    sorted_hidden = hidden.index_select(0, perm // top_k)
    counts = torch.bincount(expert_ids, minlength=num_experts)[:num_experts]
    offsets = torch.cumsum(counts, 0, dtype=offsets_dtype)
    return sorted_hidden, perm.to(perm_dtype), offsets


@moe_dispatch.register_fake
def _(hidden, top_k_index, num_experts, perm_dtype=torch.int64, offsets_dtype=torch.int32):
    check_index_dtypes(perm_dtype, offsets_dtype)
    rows = top_k_index.numel()
    return (
        hidden.new_empty(rows, hidden.size(-1)),
        top_k_index.new_empty(rows, dtype=perm_dtype),
        top_k_index.new_empty(num_experts, dtype=offsets_dtype),
    )


@torch.library.custom_op("trex::moe_dispatch_backward", mutates_args=())
def moe_dispatch_backward(grad_sorted: Tensor, perm: Tensor, num_tokens: int) -> Tensor:
    """Scatter-add the gradient of each sorted row back onto its token."""
    top_k = perm.numel() // num_tokens
    grad = grad_sorted.new_zeros(num_tokens, grad_sorted.size(-1))
    return grad.index_put_((perm // top_k,), grad_sorted, accumulate=True)


@moe_dispatch_backward.register_fake
def _(grad_sorted, perm, num_tokens):
    return grad_sorted.new_empty(num_tokens, grad_sorted.size(-1))


def _group_bounds(offsets: Tensor) -> list[tuple[int, int]]:
    ends = offsets.tolist()
    return list(zip([0, *ends[:-1]], ends))


def grouped_mm_compute(input: Tensor, weight: Tensor, offsets: Tensor) -> Tensor:
    """The body of `trex.grouped_mm` (also run by `trex.extern_grouped_mm`, its autograd-free twin)."""
    if input.dtype in (torch.float32, torch.bfloat16) and input.dtype == weight.dtype:
        return torch._grouped_mm(input, weight, offs=offsets.to(torch.int32))
    out = input.new_zeros(input.size(0), weight.size(-1))
    for expert, (start, end) in enumerate(_group_bounds(offsets)):
        if end > start:
            out[start:end] = input[start:end] @ weight[expert]
    return out


@torch.library.custom_op("trex::grouped_mm", mutates_args=())
def grouped_mm(input: Tensor, weight: Tensor, offsets: Tensor) -> Tensor:
    """out[rows of e] = input[rows of e] @ weight[e], for every expert e."""
    return grouped_mm_compute(input, weight, offsets)


@grouped_mm.register_fake
def _(input, weight, offsets):
    torch._check(input.dim() == 2 and weight.dim() == 3, lambda: "grouped_mm takes input [S,K] and weight [E,K,N]")
    torch._check(
        input.size(1) == weight.size(1), lambda: f"grouped_mm: input K={input.size(1)} but weight K={weight.size(1)}"
    )
    torch._check(offsets.numel() == weight.size(0), lambda: "grouped_mm: one offset per expert")
    return input.new_empty(input.size(0), weight.size(2))


def grouped_mm_weight_grad_compute(a: Tensor, b: Tensor, offsets: Tensor) -> Tensor:
    """The body of `trex.grouped_mm_weight_grad` (and of `trex.extern_grouped_mm_weight_grad`)."""
    if a.dtype in (torch.float32, torch.bfloat16) and a.dtype == b.dtype:
        return torch._grouped_mm(a.t(), b, offs=offsets.to(torch.int32))
    out = a.new_zeros(offsets.numel(), a.size(1), b.size(1))
    for expert, (start, end) in enumerate(_group_bounds(offsets)):
        if end > start:
            out[expert] = a[start:end].t() @ b[start:end]
    return out


@torch.library.custom_op("trex::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad(a: Tensor, b: Tensor, offsets: Tensor) -> Tensor:
    """out[e] = a[rows of e]^T @ b[rows of e]: the weight gradient of a grouped GEMM."""
    return grouped_mm_weight_grad_compute(a, b, offsets)


@grouped_mm_weight_grad.register_fake
def _(a, b, offsets):
    torch._check(a.size(0) == b.size(0), lambda: "grouped_mm_weight_grad: a and b need the same rows")
    return a.new_empty(offsets.numel(), a.size(1), b.size(1))


def _inverse_permutation(perm: Tensor) -> Tensor:
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inverse


@torch.library.custom_op("trex::moe_combine", mutates_args=())
def moe_combine(expert_out: Tensor, perm: Tensor, top_k_weights: Tensor) -> Tensor:
    """Weight each expert output row by its routing weight and sum the k rows of every token."""
    num_tokens, top_k = top_k_weights.shape
    weighted = expert_out * top_k_weights.reshape(-1)[perm].unsqueeze(-1)
    # Sum over k in a fixed order (not an index_add): deterministic, and it accumulates in fp32.
    return weighted[_inverse_permutation(perm)].view(num_tokens, top_k, -1).sum(dim=1)


@moe_combine.register_fake
def _(expert_out, perm, top_k_weights):
    dtype = torch.promote_types(expert_out.dtype, top_k_weights.dtype)
    return expert_out.new_empty(top_k_weights.size(0), expert_out.size(-1), dtype=dtype)


@torch.library.custom_op("trex::moe_combine_backward", mutates_args=())
def moe_combine_backward(
    grad_out: Tensor, expert_out: Tensor, perm: Tensor, top_k_weights: Tensor
) -> tuple[Tensor, Tensor]:
    top_k = top_k_weights.size(-1)
    grad_rows = grad_out.index_select(0, perm // top_k)  # d(weighted) for every sorted row
    weight_rows = top_k_weights.reshape(-1)[perm]
    grad_expert_out = (grad_rows * weight_rows.unsqueeze(-1)).to(expert_out.dtype)
    grad_weight_rows = (grad_rows * expert_out).sum(dim=-1)
    grad_weights = torch.empty_like(top_k_weights).reshape(-1)
    grad_weights[perm] = grad_weight_rows.to(top_k_weights.dtype)
    return grad_expert_out, grad_weights.view_as(top_k_weights)


@moe_combine_backward.register_fake
def _(grad_out, expert_out, perm, top_k_weights):
    return torch.empty_like(expert_out), torch.empty_like(top_k_weights)


# ---------------------------------------------------------------------------------------------
# The fused experts op: its meaning, written with the primitives.

ops = torch.ops.trex


def _gated_activation(gate_up: Tensor, activation: str, swiglu_limit: float) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if swiglu_limit > 0:  # DeepSeek-V4 clamps the SwiGLU pre-activations
        gate = gate.clamp(max=swiglu_limit)
        up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
    return ACTIVATIONS[activation](gate) * up


_ACTIVATION_BACKWARD: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "silu": lambda grad, x: torch.ops.aten.silu_backward(grad, x),
    "gelu": lambda grad, x: torch.ops.aten.gelu_backward(grad, x),
    "gelu_tanh": lambda grad, x: torch.ops.aten.gelu_backward(grad, x, approximate="tanh"),
    "relu": lambda grad, x: grad * (x > 0),
}


def _gated_activation_backward(grad_activated: Tensor, gate_up: Tensor, activation: str, swiglu_limit: float) -> Tensor:
    """d(gate_up) of `_gated_activation`, written out: custom-op bodies run below autograd."""
    gate, up = gate_up.chunk(2, dim=-1)
    clamped_gate, clamped_up = gate, up
    if swiglu_limit > 0:
        clamped_gate = gate.clamp(max=swiglu_limit)
        clamped_up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
    grad_gate = _ACTIVATION_BACKWARD[activation](grad_activated * clamped_up, clamped_gate)
    grad_up = grad_activated * ACTIVATIONS[activation](clamped_gate)
    if swiglu_limit > 0:  # clamp passes the gradient where the input lies inside the bounds
        grad_gate = grad_gate * (gate <= swiglu_limit)
        grad_up = grad_up * ((up >= -swiglu_limit) & (up <= swiglu_limit))
    return torch.cat([grad_gate, grad_up], dim=-1)


def _expert_weights(gate_up_proj: Tensor, down_proj: Tensor, weights_transposed: bool) -> tuple[Tensor, Tensor]:
    """Both weights as [E, in, out] views (transformers stores [E, out, in] unless transposed)."""
    if weights_transposed:
        return gate_up_proj, down_proj
    return gate_up_proj.transpose(-2, -1), down_proj.transpose(-2, -1)


def _expert_weight_gradients(
    grouped_in: Tensor,
    grad_gate_up_out: Tensor,
    activated: Tensor,
    grad_out: Tensor,
    offsets: Tensor,
    weights_transposed: bool,
) -> tuple[Tensor, Tensor]:
    """The experts' gate_up and down weight gradients in the parameters' own layout (`weights_transposed`:
    [E, in, out], else [E, out, in]), from each GEMM's input and output gradient, rows grouped by `offsets`.
    Shared by the one-rank backward and the expert-parallel one (`runtime.expert_parallel`)."""
    if weights_transposed:
        return (
            ops.grouped_mm_weight_grad(grouped_in, grad_gate_up_out, offsets),
            ops.grouped_mm_weight_grad(activated, grad_out, offsets),
        )
    return (
        ops.grouped_mm_weight_grad(grad_gate_up_out, grouped_in, offsets),
        ops.grouped_mm_weight_grad(grad_out, activated, offsets),
    )


def moe_experts_reference(
    hidden: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    activation: str,
    swiglu_limit: float,
    weights_transposed: bool,
    perm_dtype: torch.dtype = torch.int64,
    offsets_dtype: torch.dtype = torch.int32,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Routed experts: returns the output and the values the backward needs.

    Returns (out[T,H], perm[S], offsets[E], sorted_hidden[S,H], gate_up_out[S,2I], expert_out[S,H]); perm and
    offsets in `perm_dtype` / `offsets_dtype` (see the module docstring: the index dtypes a backend asked for).
    """
    w_gate_up, w_down = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    sorted_hidden, perm, offsets = ops.moe_dispatch(
        hidden.to(w_gate_up.dtype), top_k_index, w_gate_up.size(0), perm_dtype, offsets_dtype
    )
    gate_up_out = ops.grouped_mm(sorted_hidden, w_gate_up, offsets)
    activated = _gated_activation(gate_up_out, activation, swiglu_limit)
    expert_out = ops.grouped_mm(activated, w_down, offsets)
    out = ops.moe_combine(expert_out, perm, top_k_weights).to(hidden.dtype)
    return out, perm, offsets, sorted_hidden, gate_up_out, expert_out


def moe_experts_backward_reference(
    grad_out: Tensor,
    hidden: Tensor,
    top_k_weights: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    perm: Tensor,
    offsets: Tensor,
    sorted_hidden: Tensor,
    gate_up_out: Tensor,
    expert_out: Tensor,
    activation: str,
    swiglu_limit: float,
    weights_transposed: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of `moe_experts_reference` w.r.t. hidden, top_k_weights, gate_up_proj, down_proj."""
    w_gate_up, w_down = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    # The output was cast to hidden's dtype; the combine ran in the promoted dtype.
    combine_dtype = torch.promote_types(expert_out.dtype, top_k_weights.dtype)
    grad_expert_out, grad_weights = ops.moe_combine_backward(
        grad_out.to(combine_dtype), expert_out, perm, top_k_weights
    )
    grad_activated = ops.grouped_mm(grad_expert_out, w_down.transpose(-2, -1), offsets)
    grad_gate_up_out = _gated_activation_backward(grad_activated, gate_up_out, activation, swiglu_limit)
    activated = _gated_activation(gate_up_out, activation, swiglu_limit)  # recomputed: pointwise, cheap
    grad_sorted_hidden = ops.grouped_mm(grad_gate_up_out, w_gate_up.transpose(-2, -1), offsets)
    grad_hidden = ops.moe_dispatch_backward(grad_sorted_hidden, perm, hidden.size(0)).to(hidden.dtype)
    grad_gate_up_proj, grad_down_proj = _expert_weight_gradients(
        sorted_hidden, grad_gate_up_out, activated, grad_expert_out, offsets, weights_transposed
    )
    return grad_hidden, grad_weights, grad_gate_up_proj, grad_down_proj


# The fused ops ARE the reference functions (schemas inferred from their annotations); the plain
# functions stay importable, which is what canonicalization traces.
moe_experts = torch.library.custom_op("trex::moe_experts", mutates_args=())(moe_experts_reference)
moe_experts_backward = torch.library.custom_op("trex::moe_experts_backward", mutates_args=())(
    moe_experts_backward_reference
)


@moe_experts.register_fake
def _(
    hidden,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    activation,
    swiglu_limit,
    weights_transposed,
    perm_dtype=torch.int64,
    offsets_dtype=torch.int32,
):
    check_index_dtypes(perm_dtype, offsets_dtype)
    w_gate_up, w_down = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    rows, num_experts = top_k_index.numel(), w_gate_up.size(0)
    return (
        hidden.new_empty(hidden.shape),
        top_k_index.new_empty(rows, dtype=perm_dtype),
        top_k_index.new_empty(num_experts, dtype=offsets_dtype),
        hidden.new_empty(rows, hidden.size(-1), dtype=w_gate_up.dtype),
        hidden.new_empty(rows, w_gate_up.size(-1), dtype=w_gate_up.dtype),
        hidden.new_empty(rows, w_down.size(-1), dtype=w_down.dtype),
    )


@moe_experts_backward.register_fake
def _(
    grad_out,
    hidden,
    top_k_weights,
    gate_up_proj,
    down_proj,
    perm,
    offsets,
    sorted_hidden,
    gate_up_out,
    expert_out,
    activation,
    swiglu_limit,
    weights_transposed,
):
    return (
        torch.empty_like(hidden),
        torch.empty_like(top_k_weights),
        torch.empty_like(gate_up_proj, memory_format=torch.contiguous_format),
        torch.empty_like(down_proj, memory_format=torch.contiguous_format),
    )


def _setup_context(ctx, inputs, output):
    # the index dtypes (inputs 8 and 9, when given) reach the backward through perm's and offsets' own dtypes
    hidden, _, top_k_weights, gate_up_proj, down_proj, activation, swiglu_limit, weights_transposed = inputs[:8]
    _, perm, offsets, sorted_hidden, gate_up_out, expert_out = output
    ctx.save_for_backward(
        hidden, top_k_weights, gate_up_proj, down_proj, perm, offsets, sorted_hidden, gate_up_out, expert_out
    )
    ctx.attributes = (activation, swiglu_limit, weights_transposed)


def _backward(ctx, grad_out, *_unused_grads):
    # _grouped_mm's backward rejects stride-0 gradients (e.g. from `out.sum().backward()`).
    grads = ops.moe_experts_backward(grad_out.contiguous(), *ctx.saved_tensors, *ctx.attributes)
    grad_hidden, grad_weights, grad_gate_up, grad_down = grads
    return grad_hidden, None, grad_weights, grad_gate_up, grad_down, None, None, None, None, None


moe_experts.register_autograd(_backward, setup_context=_setup_context)


# Primitives are differentiable on their own too, so hand-written MoE code built from them trains.


def _dispatch_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.num_tokens = inputs[0].size(0)


def _dispatch_backward(ctx, grad_sorted, _grad_perm, _grad_offsets):
    (perm,) = ctx.saved_tensors
    return ops.moe_dispatch_backward(grad_sorted.contiguous(), perm, ctx.num_tokens), None, None, None, None


def _grouped_mm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _grouped_mm_backward(ctx, grad):
    input, weight, offsets = ctx.saved_tensors
    grad = grad.contiguous()
    grad_input = ops.grouped_mm(grad, weight.transpose(-2, -1), offsets) if ctx.needs_input_grad[0] else None
    grad_weight = ops.grouped_mm_weight_grad(input, grad, offsets) if ctx.needs_input_grad[1] else None
    return grad_input, grad_weight, None


def _combine_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _combine_backward(ctx, grad):
    expert_out, perm, top_k_weights = ctx.saved_tensors
    grad_expert_out, grad_weights = ops.moe_combine_backward(grad.contiguous(), expert_out, perm, top_k_weights)
    return grad_expert_out, None, grad_weights


moe_dispatch.register_autograd(_dispatch_backward, setup_context=_dispatch_setup)
grouped_mm.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)
moe_combine.register_autograd(_combine_backward, setup_context=_combine_setup)

FUSED_FORWARD = torch.ops.trex.moe_experts.default
FUSED_BACKWARD = torch.ops.trex.moe_experts_backward.default
PRIMITIVES = tuple(
    getattr(torch.ops.trex, name).default
    for name in (
        "moe_dispatch",
        "grouped_mm",
        "grouped_mm_weight_grad",
        "moe_combine",
        "moe_combine_backward",
        "moe_dispatch_backward",
    )
)
