"""MoE decomposition for code generators: each trex MoE primitive becomes the core aten ops it computes.

After `canonicalize_moe` a MoE layer is dispatch -> grouped_mm -> activation -> grouped_mm -> combine
(and the matching backward primitives). A backend that generates code from aten (Inductor) runs a
primitive as an opaque extern call: its Python body behind the custom-op dispatcher, its gathers and
sums unfused, its outputs saved for the backward whether or not they are cheap to recompute. When
the leading backend declares `decomposes_moe_primitives`, this pass inlines every primitive as its
aten form (`trex.ops.moe_decompositions`): the gathers, routing-weight products and per-token sums
become pointwise/reduction ops the code generator fuses, the GEMMs become `aten._grouped_mm` extern
calls, and the min-cut partitioner may recompute a gather instead of saving its output. One inverse
permutation (an `index_put` into `empty`) per layer serves combine, the combine backward and the dispatch backward.

The pass runs last among the MoE passes, so passes that work per MoE layer (expert parallelism,
recompute, the Ascend patterns) still see the primitives; with any other leading backend it declines
and the graph keeps the primitives. Grouped GEMMs in dtypes `aten._grouped_mm` does not trace (fp32)
become `trex.extern_grouped_mm(_weight_grad)`: the same kernel without the custom-op wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import fx

from trex.graph_inline import TraceCache, inline_traced, on_meta_device, replace_node
from trex.ops import moe_decompositions as aten_form
from trex.pass_manager import Decision, PassContext, PassResult
from trex.passes.canonicalize.moe import PROVENANCE_KEYS

ops = torch.ops.trex
# PassContext.options key the compile driver sets: does the leading backend want the aten form?
OPTION = "decompose_moe"


class DecomposeMoe:
    """Invariant established (when the leading backend asks for it, or `force=True`): no trex MoE
    primitive (`trex.moe_dispatch`, `grouped_mm`, `grouped_mm_weight_grad`, `moe_combine`,
    `moe_combine_backward`, `moe_dispatch_backward`) remains; every value they produced is computed by
    core aten ops, the GEMMs by `aten._grouped_mm` (bf16) or `trex.extern_grouped_mm(_weight_grad)`,
    with the same shapes and dtypes. Each inlined
    primitive keeps its provenance and `trex_moe` tag and consumes one unit of fuel.
    """

    name: ClassVar[str] = "decompose_moe"

    def __init__(self, force: bool = False):
        self.force = force

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        if not self.force and on_meta_device(gm):
            return PassResult(
                modified=False,
                decisions=[Decision("decline", "graph", "a graph of meta tensors is captured to be priced, never run")],
            )
        from trex.ops.moe import asks_other_index_dtypes

        declined = None
        if not (self.force or ctx.options.get(OPTION, False)):
            declined = (
                "the leading backend runs the MoE primitives as ops of their own (it does not declare "
                "decomposes_moe_primitives), so they stay"
            )
        elif asks_other_index_dtypes(gm.graph):
            declined = (
                "a backend asked the MoE dispatch for other index dtypes than the aten form's (int64 perm, int32 "
                "offsets), so the primitives stay as ops"
            )
        if declined is not None:
            return PassResult(modified=False, decisions=[Decision("decline", "graph", declined)])
        decisions: list[Decision] = []
        inverses: dict[fx.Node, fx.Node] = {}  # perm value -> its inverse permutation
        traces = TraceCache()  # the layers repeat: one trace per distinct primitive and shapes
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _RULES:
                continue
            rule = _RULES[node.target]
            if not ctx.fuel.take():
                break
            fn, inputs, reason = rule(node, inverses)
            # the function is decided by the op, its constants and which inverse permutation it reads (the reason)
            key = (node.target, repr([a for a in node.args if not isinstance(a, fx.Node)]), reason)
            outputs = inline_traced(
                gm,
                node,
                fn,
                inputs,
                inherit=(*PROVENANCE_KEYS, "trex_moe"),
                decompositions=ctx.options.get("decompositions"),
                cache=(traces, key),
            )
            if node.target is ops.moe_combine.default:
                _save_combined(outputs)
            if node.target is ops.moe_dispatch.default:
                sorted_hidden, perm, offsets, inverse = outputs
                outputs = (sorted_hidden, perm, offsets)
                inverses[perm] = inverse
            replace_node(gm, node, outputs)
            decisions.append(Decision("decompose", node.name, reason, {"op": str(node.target)}))
        if any(d.action == "decompose" for d in decisions):
            gm.graph.eliminate_dead_code()
            gm.graph.lint()
            gm.recompile()
        return PassResult(modified=any(d.action == "decompose" for d in decisions), decisions=decisions)


Plan = tuple[Callable[..., Any], list[fx.Node], str]


def _save_combined(outputs: Any) -> None:
    """The combined tokens are saved for the backward, never recomputed there (as the primitive's output was).

    Recomputed, the combine is a gather Inductor inlines into whichever backward kernel its scheduler places it
    with: the first MoE layer of the backward put it in another kernel than the other layers, so their kernels
    became distinct sources, each one more C++ build on a cold compile. Saved, it costs one [tokens, hidden]
    activation per layer, the size of the layer's output, whose gather inputs are saved anyway for the
    combine backward.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    for out in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
        if isinstance(out, fx.Node):
            out.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def _val(node: Any) -> Any:
    return node.meta["val"] if isinstance(node, fx.Node) else node


def _inverse_of(perm: fx.Node, inverses: dict[fx.Node, fx.Node]) -> tuple[fx.Node | None, str]:
    inverse = inverses.get(perm)
    return inverse, "the layer's inverse permutation" if inverse is not None else "its own inverse permutation"


def _dispatch(node: fx.Node, inverses) -> Plan:
    hidden, top_k_index, num_experts = node.args[:3]
    return (
        lambda h, i: aten_form.moe_dispatch(h, i, num_experts),
        [hidden, top_k_index],
        "sort once, gather rows, offsets by counting the sorted ids; also the inverse permutation for combine and backward",
    )


def _grouped_mm(node: fx.Node, inverses) -> Plan:
    input, weight, _ = node.args
    if aten_form.grouped_mm_decomposable(_val(input), _val(weight)):
        return aten_form.grouped_mm, list(node.args), "aten._grouped_mm (extern GEMM; no Python body around it)"
    return aten_form.grouped_mm, list(node.args), "trex.extern_grouped_mm (aten._grouped_mm traces in bf16 only)"


def _grouped_mm_weight_grad(node: fx.Node, inverses) -> Plan:
    a, b, _ = node.args
    if aten_form.grouped_mm_decomposable(_val(a), _val(b)):
        return aten_form.grouped_mm_weight_grad, list(node.args), "aten._grouped_mm over a^T (extern GEMM)"
    return aten_form.grouped_mm_weight_grad, list(node.args), "trex.extern_grouped_mm_weight_grad"


def _with_inverse(perm: fx.Node, inverses, using: Callable[..., Any], others: list[fx.Node]) -> tuple[Callable, list]:
    """`using(*others, inverse)`, with the layer's inverse permutation if dispatch made one, else computed here."""
    inverse = inverses.get(perm)
    if inverse is not None:
        return using, [*others, inverse]
    return (lambda *args: using(*args[:-1], aten_form.inverse_permutation(args[-1]))), [*others, perm]


def _combine(node: fx.Node, inverses) -> Plan:
    expert_out, perm, top_k_weights = node.args
    _, source = _inverse_of(perm, inverses)
    fn, inputs = _with_inverse(
        perm,
        inverses,
        lambda out, weights, inverse: aten_form.moe_combine(out, inverse, weights),
        [
            expert_out,
            top_k_weights,
        ],
    )
    return fn, inputs, f"gather each token's k rows through {source}, scale, sum over k (fusable)"


def _combine_backward(node: fx.Node, inverses) -> Plan:
    grad_out, expert_out, perm, top_k_weights = node.args
    _, source = _inverse_of(perm, inverses)
    fn, inputs = _with_inverse(
        perm,
        inverses,
        lambda g, out, p, weights, inverse: aten_form.moe_combine_backward(g, out, p, inverse, weights),
        [grad_out, expert_out, perm, top_k_weights],
    )
    return fn, inputs, f"routing-weight gradient gathered through {source} (no scatter)"


def _dispatch_backward(node: fx.Node, inverses) -> Plan:
    grad_sorted, perm, num_tokens = node.args
    _, source = _inverse_of(perm, inverses)
    fn, inputs = _with_inverse(
        perm, inverses, lambda g, inverse: aten_form.moe_dispatch_backward(g, inverse, num_tokens), [grad_sorted]
    )
    return fn, inputs, f"sum of each token's k row gradients through {source} (no scatter-add)"


_RULES: dict[Any, Callable[[fx.Node, dict], Plan]] = {
    ops.moe_dispatch.default: _dispatch,
    ops.grouped_mm.default: _grouped_mm,
    ops.grouped_mm_weight_grad.default: _grouped_mm_weight_grad,
    ops.moe_combine.default: _combine,
    ops.moe_combine_backward.default: _combine_backward,
    ops.moe_dispatch_backward.default: _dispatch_backward,
}
