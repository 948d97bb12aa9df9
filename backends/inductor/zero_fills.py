"""Scatter-adds into zeros as sums over the index slots, so Inductor does not fill their buffers early.

The backward of a gather along the last dimension (a router picking its top-k scores, `scores.gather(-1,
top_k_index)`) is `full(0).scatter_add(-1, top_k_index, grad)`. Inductor lowers it as a zero fill of the
output buffer followed by the scatter. The fill reads nothing, so Inductor's CPU scheduler fuses it into
whatever kernel shares its outer loop - on the tiny DeepSeek-V3 the backward's first kernel, where the
three MoE layers' [tokens, experts] fills all landed: three buffers alive from the first kernel of the
backward to the last layer's router gradient, across the step's peak (the saved activations are all alive
then), which put trex's peak 4 KB above torch.compile's (bench/RESULTS.md section 11, tenth session).

Written as `where(index[..., None] == arange(E), src[..., None], 0).sum(-2)`, the output is a reduction
over `src`: Inductor computes it where `src` is computed, and its buffer lives from there. The values are
the scatter-add's: each output element sums the `src` entries whose index names it, in slot order (one
entry, or none, for top-k indices, which are distinct: exact). `where`, not a one-hot product, so an
infinite or NaN entry stays in its own element. Only a narrow scatter (at most `MAX_SLOTS` index slots per
row) is rewritten: the sum form does E comparisons per slot where the scatter writes one element.

The same holds for cross-entropy's backward one-hot (`full(0).scatter(-1, target, -1.0)`), which becomes a
pointwise `where` (`_one_hot_scatter`).
"""

from __future__ import annotations

import torch
from torch import fx

from trex.graph_inline import inline_traced, replace_node

aten = torch.ops.aten

# Most index slots per row rewritten (the router's top-k: 2-8 in the models trex targets; the sum form does
# `slots` x E work for an output of E elements per row).
MAX_SLOTS = 16


def _zero_fill(node: object) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and node.target in (aten.full.default, aten.zeros.default)
        and (node.target is aten.zeros.default or node.args[1] == 0)
    )


def _rewritable(node: fx.Node) -> bool:
    base, dim, index, src = node.args[:4]
    if node.kwargs or not _zero_fill(base) or not all(isinstance(n, fx.Node) for n in (index, src)):
        return False
    out, idx, values = node.meta.get("val"), index.meta.get("val"), src.meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (out, idx, values)) or out.dim() == 0:
        return False
    return (
        dim % out.dim() == out.dim() - 1
        and tuple(idx.shape) == tuple(values.shape)
        and tuple(idx.shape[:-1]) == tuple(out.shape[:-1])
        and idx.shape[-1] <= MAX_SLOTS
        and values.dtype == out.dtype
        and out.device.type == "cpu"  # the early fill is what Inductor's CPU scheduler did (outer-loop fusion)
    )


def _slot_sums(width: int):
    def slot_sums(index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        columns = torch.arange(width, device=index.device, dtype=index.dtype)
        chosen = index.unsqueeze(-1) == columns  # [..., slots, E]
        return torch.where(chosen, src.unsqueeze(-1), src.new_zeros(())).sum(-2)

    return slot_sums


def _one_hot_scatter(node: fx.Node) -> bool:
    """`full(0).scatter(-1, index, value)` with one index per row and a scalar value: the one-hot gradient of
    `nll_loss` (cross-entropy's backward). Inductor materialises a scatter's buffer; as `where(index ==
    arange(E), value, 0)` it is a pointwise expression Inductor computes inside the kernels that read it (the
    log-softmax backward's sum and difference), with no [tokens, vocab] buffer: on tiny V3 bf16 that fp32
    buffer (64 KiB) was alive at the step's peak, in the backward's first kernel (bench/RESULTS.md section 11,
    tenth session). The same values: exactly `value` at the index, 0 elsewhere."""
    if len(node.args) < 4 or node.kwargs or not _zero_fill(node.args[0]) or not isinstance(node.args[2], fx.Node):
        return False
    dim, index, value = node.args[1], node.args[2], node.args[3]
    out, idx = node.meta.get("val"), index.meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(idx, torch.Tensor) or out.dim() == 0:
        return False
    return (
        isinstance(value, (int, float))
        and dim % out.dim() == out.dim() - 1
        and idx.dim() == out.dim()
        and idx.shape[-1] == 1
        and tuple(idx.shape[:-1]) == tuple(out.shape[:-1])
        and out.device.type == "cpu"
    )


def _one_hot(width: int, value: float, dtype: torch.dtype):
    def one_hot(index: torch.Tensor) -> torch.Tensor:
        columns = torch.arange(width, device=index.device, dtype=index.dtype)
        hot = torch.full((), value, dtype=dtype, device=index.device)
        return torch.where(index == columns, hot, torch.zeros((), dtype=dtype, device=index.device))

    return one_hot


def scatter_adds_as_slot_sums(gm: fx.GraphModule) -> list[str]:
    """Rewrite, in place, every narrow last-dimension `scatter_add` into zeros of a CPU graph as its sums over
    the index slots (see the module docstring); the names of the nodes rewritten."""
    from torch._inductor.decomposition import select_decomp_table

    table = select_decomp_table()  # the new nodes in the form Inductor lowers (no second trace of the region)
    rewritten = []
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.scatter_add.default)):
        if not _rewritable(node):
            continue
        base, _, index, src = node.args[:4]
        slot_sums = _slot_sums(node.meta["val"].size(-1))
        out = inline_traced(
            gm,
            node,
            slot_sums,
            [index, src],
            inherit=("nn_module_stack", "stack_trace", "seq_nr"),
            decompositions=table,
        )
        replace_node(gm, node, out)
        rewritten.append(node.name)
        if not base.users:
            gm.graph.erase_node(base)
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.scatter.value)):
        if not _one_hot_scatter(node):
            continue
        base, _, index, value = node.args[:4]
        out = node.meta["val"]
        one_hot = _one_hot(out.size(-1), value, out.dtype)
        new = inline_traced(
            gm, node, one_hot, [index], inherit=("nn_module_stack", "stack_trace", "seq_nr"), decompositions=table
        )
        replace_node(gm, node, new)
        rewritten.append(node.name)
        if not base.users:
            gm.graph.erase_node(base)
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten
