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

With `publish=True` (what `backend=["ascend"]` does by default, for float32 parameters: bf16/fp16 ones whose
optimizer reads `.grad` take the K-split GEMM in their own dtype by default, see `AscendBackend`) the graph also keeps torch's `.grad`
contract, so a plain torch optimizer, `clip_grad_norm_` or trex train see the gradient where they look:
before the in-place call, `main_grad_begin` brings the buffer in line with `param.grad` (None, e.g. after
`optimizer.zero_grad()`: zero-fill, once per step; the `.grad` it published last and nobody touched: keep
summing; anything else, e.g. a `.grad` the user set or scaled in place: copy it in, as autograd would add
to it); after it, `main_grad_publish` sets `param.grad` to the sum: the buffer itself for a float32
parameter (no copy: the graph writes the gradient where the optimizer reads it), a cast of it (priced,
every backward) for a bf16/fp16 parameter, whose `.grad` must have the parameter's dtype.
"""

from __future__ import annotations

import itertools
import weakref
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


class _Slot:
    """One parameter whose gradient a lowered graph accumulates into `main_grad` and publishes to `.grad`."""

    def __init__(self, param: torch.nn.Parameter):
        self.param = weakref.ref(param)
        self.published: torch.Tensor | None = None  # the `.grad` tensor this slot set last ...
        self.version = -1  # ... and its version counter then (an in-place change by the user bumps it)


_SLOTS: dict[int, _Slot] = {}
_SLOT_IDS = itertools.count()


def _slot_for(param: torch.nn.Parameter) -> int:
    slot_id = next(_SLOT_IDS)
    _SLOTS[slot_id] = _Slot(param)
    weakref.finalize(param, _SLOTS.pop, slot_id, None)
    return slot_id


def _live(slot_id: int) -> tuple[_Slot, torch.nn.Parameter]:
    slot = _SLOTS.get(slot_id)
    param = slot.param() if slot is not None else None
    if param is None:
        raise AscendSchemaError(
            f"main_grad slot {slot_id}: the parameter this compiled graph accumulates into no longer exists; "
            "compile the model again"
        )
    return slot, param


def main_grad_begin(slot_id: int) -> torch.Tensor:
    """The parameter's `main_grad`, brought in line with its `.grad` first (see the module docstring)."""
    slot, param = _live(slot_id)
    buffer = main_grad_of(param)
    grad = param.grad
    with torch.no_grad():
        if grad is None:
            buffer.zero_()  # optimizer.zero_grad() (set_to_none) since the last backward: the step's one fill
        elif grad is buffer or (grad is slot.published and grad._version == slot.version):
            pass  # what the last backward left: keep summing (micro-batches, or no zero_grad in between)
        else:
            buffer.copy_(grad)  # set or changed by someone else: autograd would add to it, so do we
    return buffer


@torch.fx.node.has_side_effect
def main_grad_publish(slot_id: int, summed: torch.Tensor) -> None:
    """Set `param.grad` to the float32 sum (the buffer itself for a float32 parameter, else its cast)."""
    slot, param = _live(slot_id)
    param.grad = summed
    slot.published, slot.version = summed, summed._version


def _accumulator_traffic_s(node: fx.Node, cluster: Any) -> float:
    """Extra memory time of accumulating into float32 in place: read and write 4 bytes per weight
    element where the functional GEMM wrote its output once in the output's dtype."""
    value = node.meta["val"]
    extra = value.numel() * (8 - value.element_size())
    device = cluster.device
    return extra / (device.hbm_bytes_per_s * device.memory_efficiency)


def accumulate_into_main_grads(
    gm: fx.GraphModule,
    graph_inputs: Sequence[Any] | None,
    *,
    target: str,
    emitter: Any,
    publish: bool = False,
    only_fp32: bool = False,
) -> list[fx.Node]:
    """Rewrite `gm` (a backward graph) in place as the module docstring says; returns the emitted calls.

    `emitter` is a `patterns.Emitter` on gm's graph (schema-checked torch_npu calls). A weight gradient
    is rewritten only when the graph's outputs line up with `graph_inputs` and the input at its position is
    a parameter of the gradient's shape; anything else keeps the functional lowering. `publish`: keep
    `param.grad` as torch sets it (`main_grad_begin` / `main_grad_publish`); else `.grad` stays None.
    `only_fp32`: leave the weight gradients of other parameters functional (the post-partition lowering makes
    each one K-split npu_grouped_matmul in the parameter's dtype, see `AscendBackend`'s `main_grad`).
    """
    from trex.cost_model.annotate import NodeCost, annotate_node, cluster_of

    bookkeeping = NodeCost("main_grad bookkeeping", "host", 0.0, 0.0, 0.0, note="sets .grad; no kernel")

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
            and (param.dtype == torch.float32 or not only_fp32)
            and isinstance(result.meta.get("val"), torch.Tensor)
            and tuple(result.meta["val"].shape) == tuple(param.shape)
        ):
            continue
        x, dy, offsets = result.args
        cost = annotate_node(result, cluster)
        if cost is not None:
            cost = replace(cost, time_s=cost.time_s + _accumulator_traffic_s(result, cluster))
        fake_mode = _fake_mode_of(result)
        with gm.graph.inserting_before(result):
            if publish:  # the buffer as the graph's run finds it, in line with param.grad
                buffer = gm.graph.call_function(main_grad_begin, (_slot_for(param),))
                buffer.meta[REPLACED_COST] = bookkeeping
            else:  # Megatron-style: the lowered graph holds the buffer itself
                target_name = f"_trex_main_grad_{index}"
                gm.register_buffer(target_name, main_grad_of(param), persistent=False)
                buffer = gm.graph.get_attr(target_name)
            buffer.meta["val"] = fake_mode.from_tensor(main_grad_of(param)) if fake_mode else main_grad_of(param)
            first_glue = len(emitter.glue)
            group_list = emitter.cast(offsets, torch.int64, offsets.meta["val"].dtype)
            call = emitter.npu(
                "npu_grouped_matmul_add_",
                (buffer, x, dy, group_list),
                {"transpose_x": True, "transpose_weight": False, "group_type": 2, "group_list_type": 0},
                allowed={"transpose_x": [True], "transpose_weight": [False], "group_type": [2]},
            )
            published = []
            if publish:  # a bf16/fp16 parameter's .grad has its dtype: one cast per backward, priced as glue
                summed = emitter.cast(call, param.dtype, torch.float32)
                sets = gm.graph.call_function(main_grad_publish, (buffer.args[0], summed))
                sets.meta[REPLACED_COST] = bookkeeping
                published = [buffer, sets]
        for node in [call, *emitter.glue[first_glue:], *published]:
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
