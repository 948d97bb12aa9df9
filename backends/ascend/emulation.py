"""CPU reference implementations of the torch_npu operators the Ascend backend emits.

Each op is defined as a torch.library custom op in the `npu_emul` namespace with torch_npu's own
schema (the line from `data/torch_npu_schemas.txt`, unchanged), so a graph lowered for Ascend runs
here and can be compared with eager; each has a fake (meta) implementation for tracing and, where
torch_npu has a backward operator, an autograd formula written with that backward operator's
emulation. The semantics follow torch_npu's operator documentation (`torch_npu/_op_plugin_docs.py`);
where an op computes in a wider type than its inputs (RMSNorm, SwiGLU, the MoE token ops), the
emulation accumulates in float32 and rounds once, as the documented outputs do.

`op(name)` gives the callable a lowered graph uses: torch_npu's real operator (`torch.ops.npu`) when
torch_npu is importable and an NPU is present, else the emulation. The graph is the same either way.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from trex.backends.ascend.emulation_library import (
    _autograd,
    _autograd_kernel,
    _below_autograd,
    _defined,
    _fake,
    _implement,
)
from trex.backends.ascend.schemas import AscendSchemaError


@functools.cache
def real_ops_available() -> bool:
    """torch_npu importable and an NPU present: lowered graphs call the real operators."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())
    except Exception:  # noqa: BLE001 - torch_npu without the Ascend runtime fails at import
        return False


def op(name: str, *, emulate: bool | None = None) -> Callable:
    """The OpOverload a lowered graph calls for torch_npu op `name` (e.g. "npu_rms_norm")."""
    base, _, overload = name.partition(".")
    use_real = real_ops_available() if emulate is None else not emulate
    namespace = torch.ops.npu if use_real else torch.ops.npu_emul
    if not use_real and base not in _defined:
        raise AscendSchemaError(f"{name} has no CPU emulation in trex (emulated: {', '.join(sorted(_defined))})")
    return getattr(getattr(namespace, base), overload or "default")


def _reduce_to(tensor: Tensor, shape: torch.Size) -> Tensor:
    """Sum a broadcast gradient back to `shape`."""
    while tensor.dim() > len(shape):
        tensor = tensor.sum(0)
    for dim, size in enumerate(shape):
        if size == 1 and tensor.size(dim) != 1:
            tensor = tensor.sum(dim, keepdim=True)
    return tensor


# ---------------------------------------------------------------------------------------------
# RMSNorm: y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps) over gamma's dims (float32).


def _norm_dims(x: Tensor, gamma: Tensor) -> list[int]:
    return list(range(x.dim() - gamma.dim(), x.dim()))


@_implement("npu_rms_norm")
def npu_rms_norm(self: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(_norm_dims(self, gamma), keepdim=True) + epsilon)
    return (x * rstd * gamma.float()).to(self.dtype), rstd


@_fake("npu_rms_norm")
def _(self, gamma, epsilon=1e-6):
    shape = list(self.shape[: self.dim() - gamma.dim()]) + [1] * gamma.dim()
    return torch.empty_like(self), self.new_empty(shape, dtype=torch.float32)


@_implement("npu_rms_norm_backward")
def npu_rms_norm_backward(dy: Tensor, self: Tensor, gamma: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    dims = _norm_dims(self, gamma)
    x_hat = self.float() * rstd
    grad_x_hat = dy.float() * gamma.float()
    dx = rstd * (grad_x_hat - x_hat * (grad_x_hat * x_hat).mean(dims, keepdim=True))
    dgamma = (dy.float() * x_hat).sum(list(range(self.dim() - gamma.dim())))
    return dx.to(self.dtype), dgamma.to(gamma.dtype)


@_fake("npu_rms_norm_backward")
def _(dy, self, gamma, rstd):
    return torch.empty_like(self), torch.empty_like(gamma)


def _rms_norm_setup(ctx, inputs, output):
    self, gamma, _ = inputs
    ctx.save_for_backward(self, gamma, output[1])


@_autograd("npu_rms_norm", _rms_norm_setup)
def _rms_norm_backward(ctx, grad_y, _grad_rstd):
    self, gamma, rstd = ctx.saved_tensors
    dx, dgamma = torch.ops.npu_emul.npu_rms_norm_backward(grad_y, self, gamma, rstd)
    return dx, dgamma, None


# ---------------------------------------------------------------------------------------------
# SwiGLU: split x in two halves A, B along dim; silu(A) * B.


@_implement("npu_swiglu")
def npu_swiglu(self: Tensor, dim: int = -1) -> Tensor:
    a, b = self.float().chunk(2, dim=dim)
    return (F.silu(a) * b).to(self.dtype)


@_fake("npu_swiglu")
def _(self, dim=-1):
    shape = list(self.shape)
    shape[dim] //= 2
    return self.new_empty(shape)


@_implement("npu_swiglu_backward")
def npu_swiglu_backward(grad_output: Tensor, self: Tensor, dim: int = -1) -> Tensor:
    a, b = self.float().chunk(2, dim=dim)
    grad = grad_output.float()
    sig = torch.sigmoid(a)
    grad_a = grad * b * sig * (1 + a * (1 - sig))
    return torch.cat([grad_a, grad * a * sig], dim=dim).to(self.dtype)


@_fake("npu_swiglu_backward")
def _(grad_output, self, dim=-1):
    return torch.empty_like(self)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.dim = inputs[1]


@_autograd("npu_swiglu", _swiglu_setup)
def _swiglu_backward(ctx, grad):
    (self,) = ctx.saved_tensors
    return torch.ops.npu_emul.npu_swiglu_backward(grad, self, ctx.dim), None


def _clipped_swiglu_formula(x: Tensor, dim: int, alpha: float, limit: float, bias: float, interleaved: bool) -> Tensor:
    xf = x.float()
    if interleaved:
        moved = xf.movedim(dim, -1)
        a, b = moved[..., ::2].movedim(-1, dim), moved[..., 1::2].movedim(-1, dim)
    else:
        a, b = xf.chunk(2, dim=dim)
    a = a.clamp(max=limit)
    b = b.clamp(min=-limit, max=limit)
    return a * torch.sigmoid(alpha * a) * (b + bias)


@_implement("npu_clipped_swiglu")
def npu_clipped_swiglu(
    x: Tensor,
    *,
    group_index: Tensor | None = None,
    dim: int = -1,
    alpha: float = 1.702,
    limit: float = 7.0,
    bias: float = 1.0,
    interleaved: bool = True,
) -> Tensor:
    """A = clamp(A, max=limit), B = clamp(B, -limit, limit); A * sigmoid(alpha * A) * (B + bias)."""
    if group_index is not None:
        raise AscendSchemaError("npu_clipped_swiglu: the CPU emulation covers group_index=None")
    return _clipped_swiglu_formula(x, dim, alpha, limit, bias, interleaved).to(x.dtype)


@_fake("npu_clipped_swiglu")
def _(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
    shape = list(x.shape)
    shape[dim] //= 2
    return x.new_empty(shape)


class _ClippedSwiGluFunction(torch.autograd.Function):
    """Autograd of npu_clipped_swiglu (registered on the Autograd key: torch.library.register_autograd
    refuses ops with keyword-only Tensor arguments, and torch_npu's schema has one)."""

    @staticmethod
    def forward(ctx, x, dim, alpha, limit, bias, interleaved):
        ctx.save_for_backward(x)
        ctx.options = (dim, alpha, limit, bias, interleaved)
        return _below_autograd(
            "npu_clipped_swiglu", x, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved
        )

    @staticmethod
    def backward(ctx, grad):
        """torch_npu has no backward op for npu_clipped_swiglu: the gradient of the formula above."""
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            (grad_x,) = torch.autograd.grad(_clipped_swiglu_formula(leaf, *ctx.options), leaf, grad.float())
        return grad_x.to(x.dtype), None, None, None, None, None


@_autograd_kernel("npu_clipped_swiglu")
def _clipped_swiglu_autograd(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
    if group_index is not None:
        raise AscendSchemaError("npu_clipped_swiglu: the CPU emulation covers group_index=None")
    return _ClippedSwiGluFunction.apply(x, dim, alpha, limit, bias, interleaved)


# ---------------------------------------------------------------------------------------------
# Rotary embedding: out = r1 * x + r2 * rotate(x); "half" rotates (x1, x2) -> (-x2, x1).


def _rotate(x: Tensor, mode: str) -> Tensor:
    if mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)
    if mode == "interleave":
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack([-x2, x1], dim=-1).flatten(-2)
    raise AscendSchemaError(
        f"npu_rotary_mul: argument 'rotary_mode' is {mode!r}; torch_npu supports 'half' and 'interleave'"
    )


def _rotate_transposed(g: Tensor, mode: str) -> Tensor:
    """The adjoint of `_rotate` (its transpose), for the gradient."""
    if mode == "half":
        g1, g2 = g.chunk(2, dim=-1)
        return torch.cat([g2, -g1], dim=-1)
    g1, g2 = g[..., ::2], g[..., 1::2]
    return torch.stack([g2, -g1], dim=-1).flatten(-2)


@_implement("npu_rotary_mul")
def npu_rotary_mul(
    self: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half", rotate: Tensor | None = None
) -> Tensor:
    rotated = self @ rotate if rotate is not None else _rotate(self, rotary_mode)
    return r1 * self + r2 * rotated


@_fake("npu_rotary_mul")
def _(self, r1, r2, rotary_mode="half", rotate=None):
    return torch.empty(torch.broadcast_shapes(self.shape, r1.shape, r2.shape), dtype=self.dtype, device=self.device)


@_implement("npu_rotary_mul_backward")
def npu_rotary_mul_backward(
    grad: Tensor, self: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half"
) -> tuple[Tensor, Tensor, Tensor]:
    dx = grad * r1 + _rotate_transposed(grad * r2, rotary_mode)
    dr1 = _reduce_to(grad * self, r1.shape)
    dr2 = _reduce_to(grad * _rotate(self, rotary_mode), r2.shape)
    return _reduce_to(dx, self.shape).to(self.dtype), dr1.to(r1.dtype), dr2.to(r2.dtype)


@_fake("npu_rotary_mul_backward")
def _(grad, self, r1, r2, rotary_mode="half"):
    return torch.empty_like(self), torch.empty_like(r1), torch.empty_like(r2)


def _rotary_setup(ctx, inputs, output):
    self, r1, r2, mode, rotate = inputs
    if rotate is not None:
        raise AscendSchemaError(
            "npu_rotary_mul: argument 'rotate' has no backward in torch_npu; pass rotary_mode instead"
        )
    ctx.save_for_backward(self, r1, r2)
    ctx.mode = mode


@_autograd("npu_rotary_mul", _rotary_setup)
def _rotary_backward(ctx, grad):
    self, r1, r2 = ctx.saved_tensors
    dx, dr1, dr2 = torch.ops.npu_emul.npu_rotary_mul_backward(grad, self, r1, r2, ctx.mode)
    return dx, dr1, dr2, None, None


# ---------------------------------------------------------------------------------------------
# MoE gating: softmax over experts, then top-k (inference op in torch_npu: no backward operator).


@_implement("npu_moe_gating_top_k_softmax")
def npu_moe_gating_top_k_softmax(
    x: Tensor, finished: Tensor | None = None, k: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    probs = torch.softmax(x.float(), dim=-1)
    values, indices = torch.topk(probs, k, dim=-1)
    indices = indices.to(torch.int32)
    if finished is not None:  # finished rows route to expert `num_experts` (no expert)
        indices = torch.where(finished.unsqueeze(-1), torch.full_like(indices, x.size(-1)), indices)
    rows = x.numel() // x.size(-1)
    row_idx = torch.arange(rows * k, dtype=torch.int32, device=x.device).view(k, rows).t().reshape(values.shape)
    return values.to(x.dtype), indices, row_idx


@_fake("npu_moe_gating_top_k_softmax")
def _(x, finished=None, k=1):
    shape = [*x.shape[:-1], k]
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# MoE token permute / unpermute (dispatch and combine), expert token counts.


def _kept_rows(total: int, num_out_tokens: int | None) -> int:
    if not num_out_tokens:
        return total
    return num_out_tokens if num_out_tokens > 0 else max(total + num_out_tokens, 0)


@_implement("npu_moe_token_permute")
def npu_moe_token_permute(
    tokens: Tensor, indices: Tensor, num_out_tokens: int | None = None, padded_mode: bool = False
) -> tuple[Tensor, Tensor]:
    if padded_mode:
        raise AscendSchemaError(
            "npu_moe_token_permute: argument 'padded_mode' must be False (torch_npu supports only False)"
        )
    top_k = indices.size(1) if indices.dim() == 2 else 1
    sorted_indices = torch.argsort(indices.reshape(-1), stable=True)
    rows = _kept_rows(sorted_indices.numel(), num_out_tokens)
    return tokens.index_select(0, sorted_indices[:rows] // top_k), sorted_indices.to(torch.int32)


@_fake("npu_moe_token_permute")
def _(tokens, indices, num_out_tokens=None, padded_mode=False):
    rows = _kept_rows(indices.numel(), num_out_tokens)
    return tokens.new_empty(rows, tokens.size(-1)), indices.new_empty(indices.numel(), dtype=torch.int32)


@_implement("npu_moe_token_permute_grad_v2")
def npu_moe_token_permute_grad_v2(
    grad_permuted_tokens: Tensor,
    sorted_indices: Tensor,
    tokens_size_0: int,
    tokens_dtype: torch.dtype,
    num_topK: int,
    padded_mode: bool = False,
) -> Tensor:  # noqa: N803 - torch_npu's argument name
    rows = grad_permuted_tokens.size(0)
    token_of_row = sorted_indices[:rows].long() // num_topK
    grad = torch.zeros(
        tokens_size_0, grad_permuted_tokens.size(-1), dtype=torch.float32, device=grad_permuted_tokens.device
    )
    return grad.index_add_(0, token_of_row, grad_permuted_tokens.float()).to(tokens_dtype)


@_fake("npu_moe_token_permute_grad_v2")
def _(grad_permuted_tokens, sorted_indices, tokens_size_0, tokens_dtype, num_topK, padded_mode=False):  # noqa: N803
    return grad_permuted_tokens.new_empty(tokens_size_0, grad_permuted_tokens.size(-1), dtype=tokens_dtype)


def _permute_setup(ctx, inputs, output):
    tokens, indices, _, _ = inputs
    ctx.save_for_backward(output[1])
    ctx.tokens = (tokens.size(0), tokens.dtype, indices.size(1) if indices.dim() == 2 else 1)


@_autograd("npu_moe_token_permute", _permute_setup)
def _permute_backward(ctx, grad_permuted, _grad_sorted):
    (sorted_indices,) = ctx.saved_tensors
    rows, dtype, top_k = ctx.tokens
    return (
        torch.ops.npu_emul.npu_moe_token_permute_grad_v2(grad_permuted, sorted_indices, rows, dtype, top_k),
        None,
        None,
        None,
    )


def _unpermute_rows(permuted_tokens: Tensor, sorted_indices: Tensor, probs: Tensor | None) -> tuple[int, int]:
    top_k = probs.size(1) if probs is not None else 1
    return sorted_indices.numel() // top_k, top_k


@_implement("npu_moe_token_unpermute")
def npu_moe_token_unpermute(
    permuted_tokens: Tensor,
    sorted_indices: Tensor,
    probs: Tensor | None = None,
    padded_mode: bool = False,
    restore_shape: list[int] | None = None,
) -> Tensor:
    if padded_mode:
        raise AscendSchemaError(
            "npu_moe_token_unpermute: argument 'padded_mode' must be False (torch_npu supports only False)"
        )
    num_tokens, top_k = _unpermute_rows(permuted_tokens, sorted_indices, probs)
    rows = permuted_tokens.float().new_zeros(sorted_indices.numel(), permuted_tokens.size(-1))
    rows[sorted_indices.long()[: permuted_tokens.size(0)]] = permuted_tokens.float()
    rows = rows.view(num_tokens, top_k, -1)
    if probs is not None:
        rows = rows * probs.float().unsqueeze(-1)
    return rows.sum(dim=1).to(permuted_tokens.dtype)


@_fake("npu_moe_token_unpermute")
def _(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    num_tokens, _ = _unpermute_rows(permuted_tokens, sorted_indices, probs)
    return permuted_tokens.new_empty(num_tokens, permuted_tokens.size(-1))


@_implement("npu_moe_token_unpermute_grad")
def npu_moe_token_unpermute_grad(
    permuted_tokens: Tensor,
    grad_unpermuted_tokens: Tensor,
    sorted_indices: Tensor,
    probs: Tensor | None = None,
    padded_mode: bool = False,
    restore_shape: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    num_tokens, top_k = _unpermute_rows(permuted_tokens, sorted_indices, probs)
    order = sorted_indices.long()[: permuted_tokens.size(0)]
    grad_rows = grad_unpermuted_tokens.float().index_select(0, order // top_k)  # d(weighted row) of every permuted row
    if probs is None:
        return grad_rows.to(permuted_tokens.dtype), permuted_tokens.new_empty(0)
    weight_rows = probs.float().reshape(-1)[order]
    grad_permuted = (grad_rows * weight_rows.unsqueeze(-1)).to(permuted_tokens.dtype)
    grad_probs = probs.float().new_zeros(probs.numel())
    grad_probs[order] = (grad_rows * permuted_tokens.float()).sum(-1)
    return grad_permuted, grad_probs.view_as(probs).to(probs.dtype)


@_fake("npu_moe_token_unpermute_grad")
def _(permuted_tokens, grad_unpermuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    return torch.empty_like(permuted_tokens), torch.empty_like(
        probs
    ) if probs is not None else permuted_tokens.new_empty(0)


def _unpermute_setup(ctx, inputs, output):
    permuted_tokens, sorted_indices, probs, _, _ = inputs
    ctx.save_for_backward(permuted_tokens, sorted_indices, probs)


@_autograd("npu_moe_token_unpermute", _unpermute_setup)
def _unpermute_backward(ctx, grad):
    permuted_tokens, sorted_indices, probs = ctx.saved_tensors
    grad_permuted, grad_probs = torch.ops.npu_emul.npu_moe_token_unpermute_grad(
        permuted_tokens, grad, sorted_indices, probs
    )
    return grad_permuted, None, grad_probs if probs is not None else None, None, None


def _init_routing_rows(expert_idx: Tensor, active_num: int) -> int:
    total = expert_idx.numel()
    return total if active_num <= 0 else min(active_num, total)


def _init_routing_unsupported(
    x,
    expert_idx,
    scale,
    offset,
    expert_num,
    drop_pad_mode,
    expert_tokens_num_type,
    expert_tokens_num_flag,
    quant_mode,
    active_expert_range,
) -> str | None:
    """What the emulation (and, per the 2.13.0 wheel's docs, often the op) does not take, else None."""
    if x.dim() != 2 or expert_idx.dim() != 2 or x.size(0) != expert_idx.size(0):
        return "x [NUM_ROWS, H] and expert_idx [NUM_ROWS, K] must be 2-D with the same rows"
    if expert_idx.dtype != torch.int32:
        return f"expert_idx must be int32 (got {expert_idx.dtype})"
    if scale is not None or offset is not None or quant_mode != -1:
        return "only the unquantised mode is emulated (scale=None, offset=None, quant_mode=-1)"
    if drop_pad_mode != 0:
        return "drop_pad_mode must be 0 (dropless; the only mode torch_npu supports)"
    if expert_tokens_num_type != 1 or not expert_tokens_num_flag:
        return "expert_tokens_num_type=1 (counts) with expert_tokens_num_flag=True is the emulated mode"
    if not 0 < expert_num <= 10240:
        return f"expert_num must be in (0, 10240] (got {expert_num})"
    if list(active_expert_range) not in ([], [0, expert_num]):
        return f"active_expert_range must cover all experts, [0, {expert_num}] (got {list(active_expert_range)})"
    return None


def _refuse_unemulated_init_routing(*args) -> None:
    """The real emulation and the fake refuse the same calls, with the same message."""
    problem = _init_routing_unsupported(*args)
    if problem:
        raise AscendSchemaError(f"npu_moe_init_routing_v2: {problem}")


@_implement("npu_moe_init_routing_v2")
def npu_moe_init_routing_v2(
    x: Tensor,
    expert_idx: Tensor,
    *,
    scale: Tensor | None = None,
    offset: Tensor | None = None,
    active_num: int = -1,
    expert_capacity: int = -1,
    expert_num: int = -1,
    drop_pad_mode: int = 0,
    expert_tokens_num_type: int = 0,
    expert_tokens_num_flag: bool = False,
    quant_mode: int = -1,
    active_expert_range: list[int] = (),
    row_idx_type: int = 0,
    x_dtype: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The (token, slot) pairs sorted by expert, stably (sortedRowIdx = token * K + slot); expanded_x[i] =
    x[sortedRowIdx[i] // K] for the first active_num rows; expanded_row_idx = sortedRowIdx (row_idx_type 1) or its
    inverse, the expanded row of every source pair (row_idx_type 0); each expert's row count (int64);
    expanded_scale (float32, undefined without scale: zeros here)."""
    _refuse_unemulated_init_routing(
        x, expert_idx, scale, offset, expert_num, drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag,
        quant_mode, active_expert_range,
    )  # fmt: skip
    if row_idx_type not in (0, 1):
        raise AscendSchemaError(f"npu_moe_init_routing_v2: row_idx_type must be 0 or 1 (got {row_idx_type})")
    top_k = expert_idx.size(1)
    flat = expert_idx.reshape(-1).long()
    sorted_rows = torch.argsort(flat, stable=True)
    rows = _init_routing_rows(expert_idx, active_num)
    expanded_x = x.index_select(0, sorted_rows[:rows] // top_k)
    if row_idx_type == 1:
        row_idx = sorted_rows
    else:
        row_idx = torch.empty_like(sorted_rows)
        row_idx[sorted_rows] = torch.arange(sorted_rows.numel(), device=sorted_rows.device)
    counts = torch.bincount(flat, minlength=expert_num)[:expert_num].to(torch.int64)
    expanded_scale = x.new_zeros(flat.numel(), dtype=torch.float32)
    return expanded_x, row_idx.to(torch.int32), counts, expanded_scale


@_fake("npu_moe_init_routing_v2")
def _(
    x,
    expert_idx,
    *,
    scale=None,
    offset=None,
    active_num=-1,
    expert_capacity=-1,
    expert_num=-1,
    drop_pad_mode=0,
    expert_tokens_num_type=0,
    expert_tokens_num_flag=False,
    quant_mode=-1,
    active_expert_range=(),
    row_idx_type=0,
    x_dtype=None,
):
    _refuse_unemulated_init_routing(
        x, expert_idx, scale, offset, expert_num, drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag,
        quant_mode, active_expert_range,
    )  # fmt: skip
    total = expert_idx.numel()
    return (
        x.new_empty(_init_routing_rows(expert_idx, active_num), x.size(1)),
        expert_idx.new_empty(total, dtype=torch.int32),
        expert_idx.new_empty(expert_num, dtype=torch.int64),
        x.new_empty(total, dtype=torch.float32),
    )


@_implement("npu_moe_compute_expert_tokens")
def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: Tensor, num_expert: int) -> Tensor:
    """For every expert, the end (exclusive) of its rows in the sorted order: a cumulative count."""
    experts = torch.arange(
        num_expert, dtype=sorted_expert_for_source_row.dtype, device=sorted_expert_for_source_row.device
    )
    return torch.searchsorted(sorted_expert_for_source_row, experts, right=True).to(sorted_expert_for_source_row.dtype)


@_fake("npu_moe_compute_expert_tokens")
def _(sorted_expert_for_source_row, num_expert):
    return sorted_expert_for_source_row.new_empty(num_expert)


# ---------------------------------------------------------------------------------------------
# Grouped GEMMs.

_QUANT_ARGUMENTS = (
    "scale",
    "offset",
    "antiquant_scale",
    "antiquant_offset",
    "per_token_scale",
    "activation_input",
    "activation_quant_scale",
    "activation_quant_offset",
)


def _group_ends(group_list: Tensor, group_list_type: int | None) -> Tensor:
    ends = group_list.long()
    return torch.cumsum(ends, 0) if group_list_type == 1 else ends


def _grouped_rows_matmul(x: Tensor, weight: Tensor, ends: Tensor) -> Tensor:
    """out[rows of group e] = x[rows of e] @ weight[e] (float32 accumulation, x's dtype out)."""
    if x.dtype in (torch.float32, torch.bfloat16) and x.dtype == weight.dtype:
        try:
            return torch._grouped_mm(x, weight, offs=ends.to(torch.int32))
        except RuntimeError:  # its stride rules (16-byte multiples); the loop below has none
            pass
    out = x.new_zeros(x.size(0), weight.size(-1))
    start = 0
    for expert, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = (x[start:end].float() @ weight[expert].float()).to(x.dtype)
        start = end
    return out


@_implement("npu_grouped_matmul")
def npu_grouped_matmul(
    x: list[Tensor],
    weight: list[Tensor],
    *,
    bias=None,
    scale=None,
    offset=None,
    antiquant_scale=None,
    antiquant_offset=None,
    per_token_scale=None,
    group_list=None,
    activation_input=None,
    activation_quant_scale=None,
    activation_quant_offset=None,
    split_item=0,
    group_type=None,
    group_list_type=0,
    act_type=0,
    tuning_config=None,
    output_dtype=None,
    x_dtype=None,
    weight_dtype=None,
    scale_dtype=None,
    per_token_scale_dtype=None,
) -> list[Tensor]:
    given = dict(
        scale=scale,
        offset=offset,
        antiquant_scale=antiquant_scale,
        antiquant_offset=antiquant_offset,
        per_token_scale=per_token_scale,
        activation_input=activation_input,
        activation_quant_scale=activation_quant_scale,
        activation_quant_offset=activation_quant_offset,
    )
    quantized = [name for name in _QUANT_ARGUMENTS if given[name] is not None]
    if quantized or act_type:
        raise AscendSchemaError(
            "npu_grouped_matmul: the CPU emulation covers the unquantized, unactivated form; "
            f"got {quantized or ['act_type']}"
        )
    if group_type == 0 and len(x) == 1 and len(weight) == 1 and weight[0].dim() == 3:
        if group_list is None:
            raise AscendSchemaError(
                "npu_grouped_matmul: argument 'group_list' is required with group_type=0 and a 3-D weight"
            )
        out = _grouped_rows_matmul(x[0], weight[0], _group_ends(group_list, group_list_type))
        if bias is not None:
            ends = _group_ends(group_list, group_list_type)
            counts = torch.diff(ends, prepend=ends.new_zeros(1))
            out = out + torch.repeat_interleave(bias[0], counts, dim=0, output_size=out.size(0)).to(out.dtype)
        return [out if output_dtype is None else out]
    if group_type == 2 and len(x) == 1 and len(weight) == 1 and x[0].dim() == 2 and weight[0].dim() == 2:
        # K split (a weight gradient): x is laid out [K, M] (the rows' input transposed), weight [M, N]; for each
        # group g, out[g] = x[:, rows of g] @ weight[rows of g]: [E, K, N] in x's dtype (as the wheel's meta function)
        if group_list is None or split_item not in (2, 3) or bias is not None or output_dtype is not None:
            raise AscendSchemaError(
                "npu_grouped_matmul: with group_type=2 the CPU emulation covers a group_list, split_item 2 or 3, "
                "no bias and no output_dtype"
            )
        rows = x[0].t()
        product = _grouped_weight_grad(rows, weight[0], group_list, group_list_type, group_list.size(0))
        return [product.to(x[0].dtype)]
    if group_type in (None, -1) and len(x) == len(weight):
        outs = [xi @ wi for xi, wi in zip(x, weight)]
        if bias is not None:
            outs = [o + b for o, b in zip(outs, bias)]
        return outs
    raise AscendSchemaError(
        f"npu_grouped_matmul: the CPU emulation covers group_type=0 (one x, one 3-D weight), group_type=2 (one 2-D x "
        f"[K, M], one 2-D weight) and group_type=-1; got group_type={group_type} with {len(x)} x and {len(weight)} "
        "weight tensors"
    )


@_fake("npu_grouped_matmul")
def _(
    x,
    weight,
    *,
    bias=None,
    scale=None,
    offset=None,
    antiquant_scale=None,
    antiquant_offset=None,
    per_token_scale=None,
    group_list=None,
    activation_input=None,
    activation_quant_scale=None,
    activation_quant_offset=None,
    split_item=0,
    group_type=None,
    group_list_type=0,
    act_type=0,
    tuning_config=None,
    output_dtype=None,
    x_dtype=None,
    weight_dtype=None,
    scale_dtype=None,
    per_token_scale_dtype=None,
):
    if group_type == 0 and len(x) == 1:
        return [x[0].new_empty(x[0].size(0), weight[0].size(-1))]
    if group_type == 2 and len(x) == 1 and group_list is not None:  # K split: [E, K, N]
        return [x[0].new_empty(group_list.size(0), x[0].size(0), weight[0].size(-1))]
    return [xi.new_empty(*xi.shape[:-1], wi.size(-1)) for xi, wi in zip(x, weight)]


def _grouped_weight_grad(
    x: Tensor, weight: Tensor, group_list: Tensor, group_list_type: int | None, groups: int
) -> Tensor:
    """x[rows of g]^T @ weight[rows of g] for every group g (groups along K, the rows), in float32."""
    ends = _group_ends(group_list, group_list_type)
    try:
        return torch._grouped_mm(x.float().t(), weight.float(), offs=ends.to(torch.int32))
    except RuntimeError:  # _grouped_mm's stride rules (16-byte multiples): per group instead
        product = x.new_zeros(groups, x.size(1), weight.size(1), dtype=torch.float32)
        start = 0
        for group, end in enumerate(ends.tolist()):
            product[group] = x[start:end].float().t() @ weight[start:end].float()
            start = end
        return product


def _check_grouped_matmul_add(op: str, transpose_x: bool, transpose_weight: bool, group_type: int) -> None:
    if not transpose_x or transpose_weight or group_type != 2:
        raise AscendSchemaError(f"{op}: torch_npu supports only transpose_x=True, transpose_weight=False, group_type=2")


@_implement("npu_grouped_matmul_add")
def npu_grouped_matmul_add(
    self: Tensor,
    x: Tensor,
    weight: Tensor,
    group_list: Tensor,
    *,
    transpose_x: bool = True,
    transpose_weight: bool = False,
    group_type: int = 2,
    group_list_type: int | None = 0,
) -> Tensor:
    """self[e] + x[rows of e]^T @ weight[rows of e] (groups along K, the rows), float32 out."""
    _check_grouped_matmul_add("npu_grouped_matmul_add", transpose_x, transpose_weight, group_type)
    return self + _grouped_weight_grad(x, weight, group_list, group_list_type, self.size(0))


@_fake("npu_grouped_matmul_add")
def _(self, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2, group_list_type=0):
    return torch.empty_like(self)


@_implement("npu_grouped_matmul_add_")
def npu_grouped_matmul_add_(
    self: Tensor,
    x: Tensor,
    weight: Tensor,
    group_list: Tensor,
    *,
    transpose_x: bool = True,
    transpose_weight: bool = False,
    group_type: int = 2,
    group_list_type: int | None = 0,
) -> Tensor:
    """The in-place form: self[e] += x[rows of e]^T @ weight[rows of e] into the float32 `self` (a
    persistent main-grad buffer, as gradient-accumulation fusion uses it); returns `self`."""
    _check_grouped_matmul_add("npu_grouped_matmul_add_", transpose_x, transpose_weight, group_type)
    if self.dtype != torch.float32:
        raise AscendSchemaError(f"npu_grouped_matmul_add_: argument 'self' must be float32, got {self.dtype}")
    return self.add_(_grouped_weight_grad(x, weight, group_list, group_list_type, self.size(0)))


@_fake("npu_grouped_matmul_add_")
def _(self, x, weight, group_list, *, transpose_x=True, transpose_weight=False, group_type=2, group_list_type=0):
    return self


from trex.backends.ascend import emulation_attention, emulation_gating  # noqa: E402, F401 - register their ops

EMULATED = tuple(sorted(_defined))
