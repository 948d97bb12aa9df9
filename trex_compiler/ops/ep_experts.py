"""The expert-parallel layer's local experts as three operators: `trex.ep_experts_local` and its backward in two
nodes, `trex.ep_experts_local_input_backward` (data gradients) and `trex.ep_experts_local_weight_backward`.

Why here, beside `trex.ops.moe`, and not in `runtime/expert_parallel.py` (which builds the layer around them
with the exchanges): they are local arithmetic with no collective - the same primitives `trex.moe_experts`
runs - so they are registered when `trex` is imported like trex's other operators, and the cost model's
calibration (`cost_model.calibrate.measure_expert_ops`) times them without importing the runtime. The received
rows arrive ordered by source rank, then expert; the ops regroup them by local expert and run two grouped GEMMs
with the gated activation. The backward is split so the dispatch's gradient exchange can be issued before the
expert-weight gradients (the input / weight split of DeepSeek-V3's DualPipe, arXiv:2412.19437 section 3.2.1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trex.ops.moe import _expert_weight_gradients, _expert_weights, _gated_activation, _gated_activation_backward

ops = torch.ops.trex


def _scatter_rows(rows: Tensor, index: Tensor) -> Tensor:
    out = torch.empty_like(rows)
    out[index] = rows
    return out


@torch.library.custom_op("trex::ep_experts_local", mutates_args=())
def ep_experts_local(
    received: Tensor,
    recv_counts: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    activation: str,
    swiglu_limit: float,
    weights_transposed: bool,
    expected_rows: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """This rank's experts over the rows it received (ordered by source rank, then expert).

    Returns (out[R,H] in received order, regroup[R], grouped_in[R,H], gate_up_out[R,2I]); the last three
    are saved for the backward. `expected_rows` (rows under balanced routing) only prices the node."""
    w_gate_up, w_down = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    local_experts = w_gate_up.size(0)
    local_expert = torch.arange(local_experts).repeat(recv_counts.size(0)).repeat_interleave(recv_counts.reshape(-1))
    regroup = torch.sort(local_expert, stable=True)[1]
    grouped_in = received.to(w_gate_up.dtype).index_select(0, regroup)
    local_offsets = torch.cumsum(recv_counts.sum(0), 0, dtype=torch.int32)
    gate_up_out = ops.grouped_mm(grouped_in, w_gate_up, local_offsets)
    activated = _gated_activation(gate_up_out, activation, swiglu_limit)
    local_out = ops.grouped_mm(activated, w_down, local_offsets)
    return _scatter_rows(local_out, regroup), regroup, grouped_in, gate_up_out


@ep_experts_local.register_fake
def _(received, recv_counts, gate_up_proj, down_proj, activation, swiglu_limit, weights_transposed, expected_rows):
    w_gate_up, w_down = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    rows = received.size(0)
    return (
        received.new_empty(rows, w_down.size(-1), dtype=w_down.dtype),
        recv_counts.new_empty(rows, dtype=torch.int64),
        received.new_empty(rows, received.size(-1), dtype=w_gate_up.dtype),
        received.new_empty(rows, w_gate_up.size(-1), dtype=w_gate_up.dtype),
    )


@torch.library.custom_op("trex::ep_experts_local_input_backward", mutates_args=())
def ep_experts_local_input_backward(
    grad_out: Tensor,
    recv_counts: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    regroup: Tensor,
    gate_up_out: Tensor,
    activation: str,
    swiglu_limit: float,
    weights_transposed: bool,
    expected_rows: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradient w.r.t. the received rows alone (the data-gradient GEMMs), first half of the experts' backward.

    Why split: the dispatch's gradient exchange needs only this; the expert-weight gradients
    (`ep_experts_local_weight_backward`) need nothing downstream until the optimizer, so the exchange can be
    issued before them and travel while they compute (the input / weight split of the backward in DeepSeek-V3's
    DualPipe, arXiv:2412.19437 section 3.2.1). Returns (grad received [R,H] in received order, and, grouped by
    expert, the output gradient [R,H] and the gate_up output's gradient [R,2I] the weight gradients take)."""
    w_gate_up, w_down = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    local_offsets = torch.cumsum(recv_counts.sum(0), 0, dtype=torch.int32)
    grad_local_out = grad_out.index_select(0, regroup)
    grad_activated = ops.grouped_mm(grad_local_out, w_down.transpose(-2, -1), local_offsets)
    grad_gate_up_out = _gated_activation_backward(grad_activated, gate_up_out, activation, swiglu_limit)
    grad_grouped_in = ops.grouped_mm(grad_gate_up_out, w_gate_up.transpose(-2, -1), local_offsets)
    return _scatter_rows(grad_grouped_in, regroup), grad_local_out, grad_gate_up_out


@ep_experts_local_input_backward.register_fake
def _(grad_out, recv_counts, gate_up_proj, down_proj, regroup, gate_up_out, activation, swiglu_limit, transposed, rows):
    return torch.empty_like(grad_out), torch.empty_like(grad_out), torch.empty_like(gate_up_out)


@torch.library.custom_op("trex::ep_experts_local_weight_backward", mutates_args=())
def ep_experts_local_weight_backward(
    grad_local_out: Tensor,
    recv_counts: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    grouped_in: Tensor,
    gate_up_out: Tensor,
    grad_gate_up_out: Tensor,
    activation: str,
    swiglu_limit: float,
    weights_transposed: bool,
    expected_rows: int,
) -> tuple[Tensor, Tensor]:
    """The expert-weight gradients (second half of the experts' backward; see `ep_experts_local_input_backward`).
    The weights are arguments for their shapes and layout only."""
    local_offsets = torch.cumsum(recv_counts.sum(0), 0, dtype=torch.int32)
    activated = _gated_activation(gate_up_out, activation, swiglu_limit)  # recomputed: pointwise, cheap
    return _expert_weight_gradients(
        grouped_in, grad_gate_up_out, activated, grad_local_out, local_offsets, weights_transposed
    )


@ep_experts_local_weight_backward.register_fake
def _(grad_local_out, recv_counts, gate_up_proj, down_proj, *_rest):  # the outputs take the weights' shapes only
    return (
        torch.empty_like(gate_up_proj, memory_format=torch.contiguous_format),
        torch.empty_like(down_proj, memory_format=torch.contiguous_format),
    )


def _local_setup(ctx, inputs, output):
    received, recv_counts, gate_up_proj, down_proj, activation, swiglu_limit, transposed, expected_rows = inputs
    ctx.save_for_backward(recv_counts, gate_up_proj, down_proj, *output[1:])
    ctx.attributes = (activation, swiglu_limit, transposed, expected_rows)
    ctx.received_dtype = received.dtype


def _local_backward(ctx, grad_out, *_unused):
    recv_counts, gate_up_proj, down_proj, regroup, grouped_in, gate_up_out = ctx.saved_tensors
    activation, swiglu_limit, transposed, expected_rows = ctx.attributes
    # two nodes: the data gradient first, so the dispatch's gradient exchange can be issued while the weight
    # gradients compute (`ep_experts_local_input_backward`)
    grad_received, grad_local_out, grad_gate_up_out = ops.ep_experts_local_input_backward(
        grad_out.contiguous(),
        recv_counts,
        gate_up_proj,
        down_proj,
        regroup,
        gate_up_out,
        activation,
        swiglu_limit,
        transposed,
        expected_rows,
    )
    grad_gate_up, grad_down = ops.ep_experts_local_weight_backward(
        grad_local_out,
        recv_counts,
        gate_up_proj,
        down_proj,
        grouped_in,
        gate_up_out,
        grad_gate_up_out,
        activation,
        swiglu_limit,
        transposed,
        expected_rows,
    )
    return grad_received.to(ctx.received_dtype), None, grad_gate_up, grad_down, None, None, None, None


ep_experts_local.register_autograd(_local_backward, setup_context=_local_setup)
