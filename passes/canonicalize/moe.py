"""MoE canonicalization: each fused MoE op becomes dispatch -> grouped_mm -> combine.

Capture leaves one `trex.moe_experts` node per MoE layer in the forward and one
`trex.moe_experts_backward` in the backward. This pass inlines both as the primitives they are
defined with (`trex.ops.moe.moe_experts_reference` and `moe_experts_backward_reference`), so the
cost model prices every grouped GEMM and a backend can claim dispatch, GEMMs and combine one by one.
Every inlined node keeps the fused node's provenance (`nn_module_stack`, `stack_trace`, `seq_nr`)
and is tagged `node.meta["trex_moe"] = MoeRegion(layer, phase, role)`, so passes that work per MoE
layer (expert parallelism, recompute of expert activations) still see each layer as a unit.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import fx

from trex.graph_inline import TraceCache
from trex.ops import moe as moe_ops
from trex.pass_manager import Decision, PassContext, PassResult

PROVENANCE_KEYS = (
    "nn_module_stack",
    "stack_trace",
    "seq_nr",
    "source_fn_stack",
    "fwd_nn_module_stack",
    "fwd_source_fn_stack",
    "partitioner_tag",
)

_ROLES = {
    torch.ops.trex.moe_dispatch.default: "dispatch",
    torch.ops.trex.grouped_mm.default: "grouped_mm",
    torch.ops.trex.grouped_mm_weight_grad.default: "grouped_mm_weight_grad",
    torch.ops.trex.moe_combine.default: "combine",
    torch.ops.trex.moe_combine_backward.default: "combine_backward",
    torch.ops.trex.moe_dispatch_backward.default: "dispatch_backward",
}


@dataclass(frozen=True)
class MoeRegion:
    """Which MoE layer a node belongs to, in which phase, and what it does there."""

    layer: str  # module path of the experts module, e.g. "model.layers.3.mlp.experts"
    phase: str  # "forward" or "backward"
    role: str  # dispatch | grouped_mm | activation | combine | ... (see _ROLES)


def experts_module_path(node: fx.Node) -> str:
    """The module path of the experts module a fused MoE node was captured from."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return "<unknown>"
    path, _ = list(stack.values())[-1]
    for prefix in ("L['self'].", "L['self']", "L['fn']."):
        if path.startswith(prefix):
            path = path[len(prefix) :]
    # Dynamo writes submodule indices as `layers[0]` or `layers.0` depending on the version.
    return path.replace("[", ".").replace("]", "").replace("'", "")


def _forward_of(backward: fx.Node) -> fx.Node | None:
    """The fused forward node whose saved outputs a fused backward node consumes."""
    for arg in backward.args:
        if (
            isinstance(arg, fx.Node)
            and arg.target is operator.getitem
            and getattr(arg.args[0], "target", None) is moe_ops.FUSED_FORWARD
        ):
            return arg.args[0]
    return None


class CanonicalizeMoe:
    """Invariant established: no `trex.moe_experts(_backward)` node remains; each MoE layer is
    `trex.moe_dispatch` -> `trex.grouped_mm` (gate/up) -> gate activation -> `trex.grouped_mm`
    (down) -> `trex.moe_combine` in the forward, and the matching backward primitives (two
    `grouped_mm` for input gradients, two `grouped_mm_weight_grad` for weight gradients), every node
    tagged with its `MoeRegion`. Outputs are unchanged: the fused ops are defined as these functions.
    Each inlined fused node consumes one unit of fuel.
    """

    name: ClassVar[str] = "canonicalize_moe"

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        decisions = []
        fused = [
            n
            for n in gm.graph.nodes
            if n.op == "call_function" and n.target in (moe_ops.FUSED_FORWARD, moe_ops.FUSED_BACKWARD)
        ]
        layers = {
            n: experts_module_path(n if n.target is moe_ops.FUSED_FORWARD else (_forward_of(n) or n)) for n in fused
        }
        traces = TraceCache()  # the layers repeat: one trace per distinct op, attributes and shapes
        for node in fused:
            if not ctx.fuel.take():
                break
            phase = "forward" if node.target is moe_ops.FUSED_FORWARD else "backward"
            name, facts, reason = node.name, _shape_facts(node), _reason(node, layers[node], phase)
            added = _inline(gm, node, layers[node], phase, ctx.options.get("decompositions"), traces)
            decisions.append(
                Decision(
                    "decompose", name, reason, {"layer": layers[node], "phase": phase, "nodes_added": added, **facts}
                )
            )
        if decisions:
            gm.graph.eliminate_dead_code()
        return PassResult(modified=bool(decisions), decisions=decisions)


def _shape_facts(node: fx.Node) -> dict[str, Any]:
    if node.target is moe_ops.FUSED_FORWARD:  # (hidden, top_k_index, top_k_weights, gate_up_proj, ...)
        hidden, top_k_index, _, gate_up_proj = (a.meta["val"] for a in node.args[:4])
    else:  # (grad_out, hidden, top_k_weights, gate_up_proj, ...); top_k_weights is shaped like the index
        hidden, top_k_index, gate_up_proj = (node.args[i].meta["val"] for i in (1, 2, 3))
    experts, two_intermediate = gate_up_proj.shape[0], gate_up_proj.shape[1]
    return {
        "tokens": int(hidden.shape[0]),
        "top_k": int(top_k_index.shape[-1]),
        "experts": int(experts),
        "hidden": int(hidden.shape[-1]),
        "gate_up_width": int(two_intermediate),
        "dtype": str(gate_up_proj.dtype).removeprefix("torch."),
    }


def _reason(node: fx.Node, layer: str, phase: str) -> str:
    facts = _shape_facts(node)
    gemms = "2 grouped_mm" if phase == "forward" else "2 grouped_mm + 2 grouped_mm_weight_grad"
    return (
        f"fused MoE {phase} of {layer} ({facts['experts']} experts, {facts['tokens']} tokens x top-{facts['top_k']}) "
        f"inlined as dispatch, {gemms}, combine, so the cost model and the backends see each grouped GEMM"
    )


def _reference_for(node: fx.Node):
    """The reference function with its trailing non-tensor attributes bound, and the tensor arguments."""
    reference = (
        moe_ops.moe_experts_reference
        if node.target is moe_ops.FUSED_FORWARD
        else moe_ops.moe_experts_backward_reference
    )
    # the tensors come first; then activation, swiglu_limit, weights_transposed (and, on the forward, the index
    # dtypes a backend asked for before AOTAutograd, `trex.ops.moe` module docstring)
    count = len([a for a in node.args if isinstance(a, fx.Node)])
    tensors, attributes, keywords = list(node.args[:count]), tuple(node.args[count:]), dict(node.kwargs)

    def bound(*tensor_values):
        return reference(*tensor_values, *attributes, **keywords)

    return bound, tensors


def _inline(
    gm: fx.GraphModule,
    node: fx.Node,
    layer: str,
    phase: str,
    decompositions: dict | None = None,
    traces: TraceCache | None = None,
) -> int:
    fn, tensor_args = _reference_for(node)
    fake_args = [a.meta["val"] for a in tensor_args]
    # the reference is decided by the op and its trailing attributes (activation, limits, layout, index dtypes);
    # traced with the table the graph was traced with (PassContext.options["decompositions"])
    key = (node.target, repr(node.args[len(tensor_args) :]), repr(sorted(node.kwargs.items())))
    sub = (traces or TraceCache()).trace(key, fn, fake_args, decompositions)
    graph = gm.graph
    env: dict[fx.Node, Any] = {}
    placeholders = iter(tensor_args)
    outputs = None
    added = 0
    with graph.inserting_before(node):
        for sub_node in sub.graph.nodes:
            if sub_node.op == "placeholder":
                env[sub_node] = next(placeholders)
            elif sub_node.op == "output":
                outputs = fx.node.map_arg(sub_node.args[0], lambda n: env[n])
            else:
                if sub_node.op == "get_attr":
                    raise RuntimeError(
                        f"the MoE reference traced a tensor constant ({sub_node.target}); it must be written with its inputs only"
                    )
                new = graph.node_copy(sub_node, lambda n: env[n])
                for key in PROVENANCE_KEYS:
                    if key in node.meta:
                        new.meta[key] = node.meta[key]
                new.meta["trex_moe"] = MoeRegion(
                    layer, phase, _ROLES.get(new.target, "activation" if phase == "forward" else "activation_backward")
                )
                env[sub_node] = new
                added += 1
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
        else:
            raise RuntimeError(f"{node.name} is used by {user.name} other than through its tuple outputs")
    graph.erase_node(node)
    return added
