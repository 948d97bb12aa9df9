"""The trex MoE primitives written in core aten ops, for code generators that fuse around them.

A backend that generates code from aten (Inductor) sees each `trex.moe_*` primitive as an opaque
extern call: a Python body behind the custom-op dispatcher, run between its generated kernels, whose
gathers, scalings and sums it cannot fuse with the neighbouring ops and whose intermediate values
the partitioner must save. These functions compute the same values with static shapes and no host
synchronisation, so the code generator fuses the row gathers and the routing-weight products into
its own loops and only the GEMMs stay extern calls (`aten._grouped_mm`):

* dispatch sorts the expert ids once and also returns the inverse permutation (`inverse[perm[s]] = s`,
  one `index_put`): combine, the combine backward and the dispatch backward then *gather* each token's
  k rows through it instead of scattering (no `index_put` with accumulation: deterministic, no
  atomics, fusable into the reductions that follow); the expert offsets count the ids <= each expert
  (a fixed-size output, where `bincount`'s size depends on the data);
* combine gathers the k rows of every token, scales them by the token's routing weights in token
  order and sums over k: the same products, summed in slot order;
* the dispatch backward sums the k sorted-row gradients of every token (was: a scatter-add in
  sorted-row order; for k > 2 the sum order differs, within float rounding);
* a grouped GEMM `aten._grouped_mm` cannot trace (its meta function takes bf16 only; the CPU kernel
  also computes fp32) becomes `trex.extern_grouped_mm(_weight_grad)`: the same body as the
  `trex.grouped_mm` custom op, registered as a plain dispatcher kernel without the custom-op
  wrapper's autograd and checks (bench/cpu_ops/gemm_precision_and_op_overhead.py: 84 vs 145 us per
  call, `aten._grouped_mm` itself 68 us, on the loaded development CPU). They have no autograd: they live only in graphs whose
  backward is already explicit (the joint graph trex partitions).

`trex.passes.decompose_moe` inlines them into the joint graph when the leading backend asks for it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trex.ops import moe

# The autograd-free extern kernels for generated code (see the module docstring).
_library = torch.library.Library(moe.NAMESPACE, "FRAGMENT")
_library.define("extern_grouped_mm(Tensor input, Tensor weight, Tensor offsets) -> Tensor")
_library.define("extern_grouped_mm_weight_grad(Tensor a, Tensor b, Tensor offsets) -> Tensor")
_library.impl("extern_grouped_mm", moe.grouped_mm_compute, "CompositeExplicitAutograd")
_library.impl("extern_grouped_mm_weight_grad", moe.grouped_mm_weight_grad_compute, "CompositeExplicitAutograd")


# aten._grouped_mm under a name whose meta function accepts any float dtype: what passes.cpu_gemm_precision
# turns a bf16 (fp16) grouped GEMM into. fp32 operands run aten's own CPU kernel; low-precision operands are
# multiplied in fp32 one group at a time and each group's product is rounded once into the low-precision
# output (see `grouped_mm_on_group_upcasts`).
_library.define("extern_aten_grouped_mm(Tensor mat_a, Tensor mat_b, Tensor offs) -> Tensor")


def grouped_mm_on_group_upcasts(mat_a: Tensor, mat_b: Tensor, offs: Tensor) -> Tensor:
    """`aten._grouped_mm(mat_a, mat_b, offs)` computed in fp32, one group at a time, in mat_a's dtype.

    Why per group: upcasting whole operands before the GEMM (and rounding its whole fp32 result after)
    keeps fp32 copies of every expert's weights, of all sorted tokens and of the whole result alive around
    each grouped GEMM - on the tiny bf16 models that raised trex's peak step memory above Inductor's
    (bench/RESULTS.md section 11, eighth session). Here at most one group's fp32 operands and product exist
    at a time. The values are those of the whole-operand form: exact upcasts, the same fp32 GEMM per group
    (aten's CPU kernel also runs one GEMM per group), one round-to-nearest-even conversion of each result
    element (`copy_` into the low-precision output). Two forms, those the MoE decompositions emit:

    * [M, K] x [G, K, N] -> [M, N]: rows grouped (the experts' forward GEMMs and data gradients); rows past
      the last offset belong to no group and are zero (aten leaves them unwritten);
    * [K, M] x [M, N] -> [G, K, N]: the reduction dimension grouped (weight gradients); a group with no rows
      gets zeros, as in aten.
    """
    if mat_a.dtype == torch.float32 and mat_b.dtype == torch.float32:
        return torch._grouped_mm(mat_a, mat_b, offs=offs)
    ends = offs.tolist()
    bounds = list(zip([0, *ends[:-1]], ends))
    if mat_b.dim() == 3:
        out = mat_a.new_empty(mat_a.size(0), mat_b.size(-1))
        for group, (start, end) in enumerate(bounds):
            if end > start:
                out[start:end] = torch.mm(mat_a[start:end].float(), mat_b[group].float())
        out[ends[-1] if ends else 0 :].zero_()
        return out
    out = mat_a.new_zeros(len(bounds), mat_a.size(0), mat_b.size(1))
    for group, (start, end) in enumerate(bounds):
        if end > start:
            out[group] = torch.mm(mat_a[:, start:end].float(), mat_b[start:end].float())
    return out


_library.impl("extern_aten_grouped_mm", grouped_mm_on_group_upcasts, "CompositeExplicitAutograd")


@torch.library.register_fake("trex::extern_aten_grouped_mm", lib=_library)
def _(mat_a, mat_b, offs):
    if mat_a.dim() == 2 and mat_b.dim() == 3:  # rows grouped, one weight per group: [M, K] x [G, K, N]
        return mat_a.new_empty(mat_a.size(0), mat_b.size(-1))
    if mat_a.dim() == 2 and mat_b.dim() == 2:  # the reduction dimension grouped: [K, M]^T-form x [M, N]
        return mat_a.new_empty(offs.numel(), mat_a.size(0), mat_b.size(1))
    raise ValueError(
        f"trex.extern_aten_grouped_mm takes 2D x 3D or 2D x 2D operands, not {mat_a.dim()}D x {mat_b.dim()}D"
    )


def aten_grouped_mm_form_supported(mat_a: Tensor, mat_b: Tensor) -> bool:
    """The operand forms `trex.extern_aten_grouped_mm` takes (those the MoE decompositions emit)."""
    return mat_a.dim() == 2 and mat_b.dim() in (2, 3)


@torch.library.register_fake("trex::extern_grouped_mm", lib=_library)
def _(input, weight, offsets):
    return input.new_empty(input.size(0), weight.size(-1))


@torch.library.register_fake("trex::extern_grouped_mm_weight_grad", lib=_library)
def _(a, b, offsets):
    return a.new_empty(offsets.numel(), a.size(1), b.size(1))


# What aten._grouped_mm's meta function (the one tracing and Inductor run) accepts in torch 2.13: bf16
# only, although the CPU kernel also computes fp32 (which `trex.grouped_mm` calls in its own body).
GROUPED_MM_DTYPES = (torch.bfloat16,)


def inverse_permutation(perm: Tensor) -> Tensor:
    """`inverse[perm[s]] = s`: one functional `index_put` into an uninitialised buffer.

    `perm` is a permutation (a sort's indices), so every element is written exactly once: no fill is needed
    and no two writes collide. Written as `zeros.scatter`, Inductor compiled the fill and the scatter as a
    kernel of their own (the zeros, one buffer shared by every layer after the partitioner's CSE, cannot be
    written in place); as `empty.index_put` - the form of transformers' own `inv_perm[perm] = arange`, which
    torch.compile traces - each layer gets its own `empty` (never CSE'd), Inductor writes it in place and
    fuses the write into the dispatch's gather kernel: one C++ kernel fewer to build on a cold compile
    (bench/RESULTS.md section 11, twelfth session)."""
    positions = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return torch.empty_like(perm).index_put((perm,), positions)


def moe_dispatch(hidden: Tensor, top_k_index: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`trex.moe_dispatch`, plus the inverse permutation: (sorted_hidden, perm, offsets, inverse)."""
    top_k = top_k_index.size(-1)
    sorted_ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
    sorted_hidden = hidden.index_select(0, perm // top_k)
    experts = torch.arange(num_experts, device=top_k_index.device, dtype=sorted_ids.dtype)
    # offsets[e] = number of rows routed to experts <= e (ids >= num_experts are counted by none, as bincount[:E]),
    # as a count (a reduction Inductor fuses into the gather's kernel, arange included) where `searchsorted` was
    # an extern call on CPU (no bucketize there) that needed the arange materialised: one buffer, shared by every
    # layer after the partitioner's CSE and written by the first layer's gather kernel, which made that layer's
    # kernel differ from the others' (one more C++ kernel to build). E x S integer compares per layer, against
    # the experts' GEMMs' S x H x I multiply-adds.
    offsets = (sorted_ids.unsqueeze(0) <= experts.unsqueeze(1)).sum(-1, dtype=torch.int32)
    return sorted_hidden, perm, offsets, inverse_permutation(perm)


def grouped_mm_decomposable(input: Tensor, weight: Tensor) -> bool:
    """aten._grouped_mm traces with these operands (both bf16); otherwise `trex.grouped_mm` stays."""
    return input.dtype in GROUPED_MM_DTYPES and input.dtype == weight.dtype


def grouped_mm(input: Tensor, weight: Tensor, offsets: Tensor) -> Tensor:
    if grouped_mm_decomposable(input, weight):
        return torch._grouped_mm(input, weight, offs=offsets.to(torch.int32))
    return torch.ops.trex.extern_grouped_mm(input, weight, offsets)


def grouped_mm_weight_grad(a: Tensor, b: Tensor, offsets: Tensor) -> Tensor:
    if grouped_mm_decomposable(a, b):
        return torch._grouped_mm(a.t(), b, offs=offsets.to(torch.int32))
    return torch.ops.trex.extern_grouped_mm_weight_grad(a, b, offsets)


def _token_rows(rows: Tensor, inverse: Tensor, top_k: int) -> Tensor:
    """The k sorted rows of every token, in slot order: [T, k, H]."""
    return rows.index_select(0, inverse).view(inverse.numel() // top_k, top_k, rows.size(-1))


def moe_combine(expert_out: Tensor, inverse: Tensor, top_k_weights: Tensor) -> Tensor:
    """`trex.moe_combine` (given the inverse permutation instead of the permutation)."""
    dtype = torch.promote_types(expert_out.dtype, top_k_weights.dtype)
    rows = _token_rows(expert_out, inverse, top_k_weights.size(-1)).to(dtype)
    return (rows * top_k_weights.to(dtype).unsqueeze(-1)).sum(dim=1)


def moe_combine_backward(
    grad_out: Tensor, expert_out: Tensor, perm: Tensor, inverse: Tensor, top_k_weights: Tensor
) -> tuple[Tensor, Tensor]:
    """`trex.moe_combine_backward`: (grad of expert_out [S,H], grad of top_k_weights [T,k])."""
    top_k = top_k_weights.size(-1)
    weight_rows = top_k_weights.reshape(-1).index_select(0, perm)
    grad_rows = grad_out.index_select(0, perm // top_k)
    grad_expert_out = (grad_rows * weight_rows.unsqueeze(-1)).to(expert_out.dtype)
    # in token order: grad_weights[t, j] = <grad_out[t], expert_out[row of (t, j)]>
    products = grad_out.unsqueeze(1) * _token_rows(expert_out, inverse, top_k)
    grad_weights = products.sum(dim=-1).to(top_k_weights.dtype)
    return grad_expert_out, grad_weights


def moe_dispatch_backward(grad_sorted: Tensor, inverse: Tensor, num_tokens: int) -> Tensor:
    """`trex.moe_dispatch_backward`: every token's gradient is the sum of its k sorted rows' gradients."""
    return _token_rows(grad_sorted, inverse, inverse.numel() // num_tokens).sum(dim=1)
