"""CPU emulation of torch_npu's group-limited MoE gating, `npu_moe_gating_top_k` and its backward.

Semantics from torch_npu's operator documentation (`_op_plugin_docs.py`, "npu_moe_gating_top_k" and
"npu_moe_gating_top_k_backward"), the sigmoid mode (norm_type=1) DeepSeek-V3 routes with:
    norm   = sigmoid(x)                              (float32; `norm_out` when out_flag)
    choice = norm + bias
    group score = max of the group's choices (group_select_mode=0) or the sum of its top 2 (=1)
    the k_group best of group_count groups stay; top-k of choice among their experts -> expert_idx
    y = routed_scaling_factor * norm[expert_idx] / (sum(norm[expert_idx]) + eps)
The backward (documented for the sigmoid mode only) takes norm_out, dy and expert_idx and returns dx.
Covered here: norm_type=1, renorm=0, no hash mode (input_ids / tid2eid); anything else raises
`AscendSchemaError` naming the argument.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trex.backends.ascend.emulation_library import _autograd_kernel, _below_autograd, _fake, _implement
from trex.backends.ascend.schemas import AscendSchemaError


def _check(op: str, renorm: int, norm_type: int, **hash_mode) -> None:
    if norm_type != 1:
        raise AscendSchemaError(f"{op}: argument 'norm_type'={norm_type}; the CPU emulation covers 1 (sigmoid)")
    if renorm != 0:
        raise AscendSchemaError(f"{op}: argument 'renorm'={renorm}; torch_npu supports only 0")
    for name, value in hash_mode.items():
        if value is not None:
            raise AscendSchemaError(f"{op}: argument {name!r} (hash mode) is not covered by the CPU emulation")


@_implement("npu_moe_gating_top_k")
def npu_moe_gating_top_k(
    x: Tensor,
    k: int,
    *,
    bias: Tensor | None = None,
    input_ids: Tensor | None = None,
    tid2eid: Tensor | None = None,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> tuple[Tensor, Tensor, Tensor]:
    op = "npu_moe_gating_top_k"
    _check(op, renorm, norm_type, input_ids=input_ids, tid2eid=tid2eid)
    rows, experts = x.shape
    if experts % group_count or not 1 <= k_group <= group_count or k > experts // group_count * k_group:
        raise AscendSchemaError(
            f"{op}: group_count={group_count}, k_group={k_group}, k={k} do not fit {experts} experts "
            "(group_count must divide them; 1 <= k_group <= group_count; k <= experts/group_count*k_group)"
        )
    norm = torch.sigmoid(x.float())
    choice = norm + bias.float() if bias is not None else norm
    grouped = choice.view(rows, group_count, experts // group_count)
    if group_select_mode == 1:
        group_scores = grouped.topk(min(2, grouped.size(-1)), dim=-1).values.sum(-1)
    elif group_select_mode == 0:
        group_scores = grouped.amax(-1)
    else:
        raise AscendSchemaError(f"{op}: argument 'group_select_mode'={group_select_mode}; torch_npu supports 0 and 1")
    kept_groups = group_scores.topk(k_group, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, kept_groups, True)
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(rows, experts)
    expert_idx = choice.masked_fill(~keep, float("-inf")).topk(k, dim=-1).indices
    picked = norm.gather(1, expert_idx)
    y = routed_scaling_factor * picked / (picked.sum(-1, keepdim=True) + eps)
    norm_out = norm if out_flag else x.new_empty(0, dtype=torch.float32)
    return y.to(x.dtype), expert_idx.to(torch.int32), norm_out


@_fake("npu_moe_gating_top_k")
def _(x, k, *, out_flag=False, **kwargs):
    shape = [x.size(0), k]
    norm = x.new_empty(x.shape, dtype=torch.float32) if out_flag else x.new_empty(0, dtype=torch.float32)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), norm


@_implement("npu_moe_gating_top_k_backward")
def npu_moe_gating_top_k_backward(
    x_norm: Tensor,
    grad_y: Tensor,
    expertIdx: Tensor,  # noqa: N803 - torch_npu's argument name
    *,
    renorm: int = 0,
    norm_type: int = 0,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> Tensor:
    _check("npu_moe_gating_top_k_backward", renorm, norm_type)
    index = expertIdx.long()
    picked = x_norm.float().gather(1, index)
    denominator = picked.sum(-1, keepdim=True) + eps
    grad = grad_y.float() * routed_scaling_factor
    grad_picked = grad / denominator - (grad * picked).sum(-1, keepdim=True) / denominator**2
    grad_norm = torch.zeros_like(x_norm, dtype=torch.float32).scatter_add(1, index, grad_picked)
    norm = x_norm.float()
    return (grad_norm * norm * (1 - norm)).to(grad_y.dtype)


@_fake("npu_moe_gating_top_k_backward")
def _(x_norm, grad_y, expertIdx, **kwargs):  # noqa: N803
    return x_norm.new_empty(x_norm.shape, dtype=grad_y.dtype)


class _GatingTopKFunction(torch.autograd.Function):
    """Autograd of npu_moe_gating_top_k through npu_moe_gating_top_k_backward (on the Autograd key:
    register_autograd refuses ops with keyword-only Tensor arguments, and this schema has three)."""

    @staticmethod
    def forward(ctx, x, k, options):
        y, index, norm = _below_autograd("npu_moe_gating_top_k", x, k, **options)
        saved_norm = norm if options.get("out_flag") else torch.sigmoid(x.detach().float())
        ctx.save_for_backward(saved_norm, index)
        ctx.options = {n: options.get(n, d) for n, d in (("routed_scaling_factor", 1.0), ("eps", 1e-20))}
        ctx.mark_non_differentiable(index)
        return y, index, norm

    @staticmethod
    def backward(ctx, grad_y, _grad_index, grad_norm):
        """dx from dy (torch_npu's backward op) plus, when norm_out was used, sigmoid's own gradient."""
        norm, index = ctx.saved_tensors
        grad_x = torch.ops.npu_emul.npu_moe_gating_top_k_backward(norm, grad_y, index, norm_type=1, **ctx.options)
        if grad_norm is not None and grad_norm.numel():
            grad_x = grad_x + (grad_norm.float() * norm * (1 - norm)).to(grad_x.dtype)
        return grad_x, None, None


@_autograd_kernel("npu_moe_gating_top_k")
def _gating_autograd(x, k, **options):
    return _GatingTopKFunction.apply(x, k, options)
