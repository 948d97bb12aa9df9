"""Gradient-accumulation fusion for the routed experts' weights: the weight-gradient GEMM adds into a
persistent float32 `param.main_grad` in place (torch_npu's `npu_grouped_matmul_add_`).

Megatron-LM and MindSpeed (`gradient_accumulation_fusion`) keep a float32 main-grad buffer per
parameter: the weight-gradient GEMM accumulates its product into it, every micro-batch's backward adds
to it, and the optimizer's zero_grad zero-fills it once per step. The functional lowering of
`trex.grouped_mm_weight_grad` (`npu_grouped_matmul_add` into a fresh fp32 accumulator) must instead
zero-fill an fp32 tensor the size of the expert weights and cast the sum back to the parameter's dtype
on every backward; with the persistent buffer both go away.

`accumulate_into_main_grads` rewrites a backward graph (before it is split among backends, see
`Backend.prepare`): each `trex.grouped_mm_weight_grad` whose result is returned as the gradient of an
expert-weight parameter (AOTAutograd's backward returns the gradient of the captured graph's i-th input
at its i-th output) becomes `npu_grouped_matmul_add_(param.main_grad, x, dy, group_list)`, and the graph
returns no gradient for that parameter: `param.grad` stays None and `param.main_grad` holds the float32
sum over the backwards since the last `zero_main_grads`. An optimizer that reads `.grad` gets it with
`main_grads_to_grads` (once per step). The buffer is read by the lowered graph as it is, so it is
zeroed in place, never replaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import fx

from trex.backends.ascend.report import REPLACED_COST  # node meta: the price of the node the call stands for
from trex.backends.ascend.schemas import AscendSchemaError

MAIN_GRAD = "main_grad"
PREPARED = "trex_ascend_prepared"  # node meta: emitted by a whole-graph rewrite before the graph was split


def main_grad_of(param: torch.nn.Parameter) -> torch.Tensor:
    """`param.main_grad`, created zero-filled (float32, param's shape and device) on first use."""
    buffer = getattr(param, MAIN_GRAD, None)
    if buffer is None:
        buffer = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
        setattr(param, MAIN_GRAD, buffer)
        return buffer
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.float32 or buffer.shape != param.shape:
        raise AscendSchemaError(
            f"a parameter of shape {tuple(param.shape)} has a `main_grad` that is not a float32 tensor of its shape "
            f"({getattr(buffer, 'dtype', type(buffer).__name__)}); delete it and trex creates one"
        )
    return buffer


def _parameters(params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return list(params.parameters() if isinstance(params, torch.nn.Module) else params)


def zero_main_grads(params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> int:
    """Zero-fill every `main_grad` in place (the once-per-step fill of the optimizer's zero_grad);
    returns how many buffers were filled."""
    filled = 0
    with torch.no_grad():
        for param in _parameters(params):
            buffer = getattr(param, MAIN_GRAD, None)
            if buffer is not None:
                buffer.zero_()
                filled += 1
    return filled


def main_grads_to_grads(params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> int:
    """Give an optimizer that reads `.grad` the accumulated `main_grad` (float32 parameters share the
    buffer; others get it cast to their dtype: one cast per step, not per backward). Returns the count."""
    given = 0
    for param in _parameters(params):
        buffer = getattr(param, MAIN_GRAD, None)
        if buffer is None:
            continue
        param.grad = buffer if param.dtype == torch.float32 else buffer.to(param.dtype)
        given += 1
    return given


def _accumulator_traffic_s(node: fx.Node, cluster: Any) -> float:
    """Extra memory time of accumulating into float32 in place: read and write 4 bytes per weight
    element where the functional GEMM wrote its output once in the output's dtype."""
    value = node.meta["val"]
    extra = value.numel() * (8 - value.element_size())
    device = cluster.device
    return extra / (device.hbm_bytes_per_s * device.memory_efficiency)


def accumulate_into_main_grads(
    gm: fx.GraphModule, graph_inputs: Sequence[Any] | None, *, target: str, emitter: Any
) -> list[fx.Node]:
    """Rewrite `gm` (a backward graph) in place as the module docstring says; returns the emitted calls.

    `emitter` is a `patterns.Emitter` on gm's graph (schema-checked torch_npu calls). A weight gradient
    is rewritten only when the graph's outputs line up with `graph_inputs` and the input at its position is
    a parameter of the gradient's shape; anything else keeps the functional lowering.
    """
    from trex.cost_model.annotate import annotate_node, cluster_of

    output = next(iter(gm.graph.find_nodes(op="output")))
    results = output.args[0]
    if not graph_inputs or not isinstance(results, (list, tuple)) or len(results) != len(graph_inputs):
        return []
    cluster = cluster_of(target)
    weight_grad = torch.ops.trex.grouped_mm_weight_grad.default
    results = list(results)
    emitted = []
    for index, result in enumerate(results):
        param = graph_inputs[index]
        if not (
            isinstance(result, fx.Node)
            and result.op == "call_function"
            and result.target is weight_grad
            and len(result.users) == 1
            and isinstance(param, torch.nn.Parameter)
            and isinstance(result.meta.get("val"), torch.Tensor)
            and tuple(result.meta["val"].shape) == tuple(param.shape)
        ):
            continue
        x, dy, offsets = result.args
        cost = annotate_node(result, cluster)
        if cost is not None:
            cost = replace(cost, time_s=cost.time_s + _accumulator_traffic_s(result, cluster))
        target_name = f"_trex_main_grad_{index}"
        gm.register_buffer(target_name, main_grad_of(param), persistent=False)
        with gm.graph.inserting_before(result):
            buffer = gm.graph.get_attr(target_name)
            fake_mode = _fake_mode_of(result)
            buffer.meta["val"] = fake_mode.from_tensor(getattr(gm, target_name)) if fake_mode else main_grad_of(param)
            first_glue = len(emitter.glue)
            group_list = emitter.cast(offsets, torch.int64, offsets.meta["val"].dtype)
            call = emitter.npu(
                "npu_grouped_matmul_add_",
                (buffer, x, dy, group_list),
                {"transpose_x": True, "transpose_weight": False, "group_type": 2, "group_list_type": 0},
                allowed={"transpose_x": [True], "transpose_weight": [False], "group_type": [2]},
            )
        for node in [call, *emitter.glue[first_glue:]]:
            node.meta[PREPARED] = True
            if "trex_moe" in result.meta:
                node.meta["trex_moe"] = result.meta["trex_moe"]
        call.meta[REPLACED_COST] = cost
        results[index] = None
        emitted.append(call)
    if emitted:
        output.args = (type(output.args[0])(results),)
        gm.graph.eliminate_dead_code()  # the functional weight-gradient GEMMs (the in-place calls are impure)
        gm.graph.lint()
        gm.recompile()
    return emitted


def _fake_mode_of(node: fx.Node) -> Any:
    from torch._guards import detect_fake_mode

    return detect_fake_mode([node.meta.get("val")])
