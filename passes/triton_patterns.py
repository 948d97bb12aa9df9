"""Pattern rewrites to trex's Triton kernel library (`trex.backends.triton`).

Matches, in the aten graph, the forward of
  * RMSNorm:  pow(x, 2) -> mean(-1, keepdim) -> add(eps) -> rsqrt -> mul(x, .) [-> cast] -> mul(weight, .)
    becomes `trex_triton.rms_norm_forward(x, weight, eps)`; its rstd output replaces the rsqrt that
    the backward reads, so the backward nodes keep their meaning.
  * SwiGLU:   mul(silu(gate), up) becomes `trex_triton.swiglu(gate, up)` (the silu stays while the
    backward reads it).
and the trex MoE primitives (forward and backward, as `canonicalize_moe` leaves them in the joint graph):
  * `trex.moe_dispatch` becomes `trex_triton.moe_permute` (counting sort, padding-free, which also yields
    the inverse index map); `trex.moe_combine`, `moe_combine_backward` and `moe_dispatch_backward`
    become `trex_triton.moe_unpermute`, `moe_unpermute_backward` and `moe_permute_backward`, which
    gather through that inverse map (no scatter-add);
  * `trex.grouped_mm` / `grouped_mm_weight_grad` become `trex_triton.grouped_mm` / `grouped_mm_weight_grad`.
The rewrite is on when the compile target runs on a GPU (where the kernels compile) or when asked
(`TritonPatterns(force=True)` in `passes=`); elsewhere the pass declines, says so, and changes nothing
(on a CPU the library's ops would run their references: same meaning, no gain).
"""

from __future__ import annotations

import operator
from typing import ClassVar

import torch
from torch import fx

from trex.graph_inline import inline_traced, replace_node
from trex.pass_manager import Decision, PassContext, PassResult

aten = torch.ops.aten
GPU_DEVICE_TYPES = frozenset({"cuda", "xpu"})


def _is(node: object, *targets: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _scalar(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _match_rms_norm(rsqrt: fx.Node) -> dict | None:
    """The RMSNorm forward around `rsqrt`, or None."""
    add = rsqrt.args[0]
    if not _is(add, aten.add.Tensor, aten.add.Scalar) or _scalar(add.args[1]) is None:
        return None
    mean = add.args[0]
    if (
        not _is(mean, aten.mean.dim)
        or list(mean.args[1]) not in ([-1], [mean.args[0].meta["val"].dim() - 1])
        or not (len(mean.args) > 2 and mean.args[2])
    ):
        return None
    square = mean.args[0]
    if not _is(square, aten.pow.Tensor_Scalar) or square.args[1] != 2:
        return None
    x = square.args[0]
    for normed in rsqrt.users:
        if not _is(normed, aten.mul.Tensor) or set(normed.args) != {x, rsqrt}:
            continue
        cast = next(
            (u for u in normed.users if _is(u, aten._to_copy.default, torch.ops.prims.convert_element_type.default)),
            None,
        )
        scaled_input = cast if cast is not None else normed
        for out in scaled_input.users:
            if not _is(out, aten.mul.Tensor):
                continue
            weight = out.args[0] if out.args[1] is scaled_input else out.args[1]
            value = weight.meta.get("val") if isinstance(weight, fx.Node) else None
            if isinstance(value, torch.Tensor) and value.dim() == 1 and value.shape[0] == x.meta["val"].shape[-1]:
                source = x.args[0] if _is(x, aten._to_copy.default, torch.ops.prims.convert_element_type.default) else x
                if cast is not None and source.meta["val"].dtype != cast.meta["val"].dtype:
                    continue  # the kernel casts the normalised value back to the input's dtype; this graph does not
                if cast is None and source is not x:
                    continue
                return {"x": source, "weight": weight, "eps": _scalar(add.args[1]), "rsqrt": rsqrt, "out": out}
    return None


class TritonPatterns:
    """Invariant established: with the rewrite on, no RMSNorm or SwiGLU forward of the matched form
    remains in aten ops; each is one `trex_triton` op whose outputs replace the values the rest of the
    graph read. Loss and gradients are unchanged (the ops compute the same function)."""

    name: ClassVar[str] = "triton_patterns"

    def __init__(self, force: bool = False):
        self.force = force

    def wants_undecomposed_graph(self, target: str) -> bool:
        """True when the pass will rewrite: its patterns are the undecomposed aten forms (`_softmax`, `topk`,
        `mean`), so the compile driver must not trace the joint graph with a code generator's decompositions."""
        from trex.targets import get_target

        return self.force or get_target(target).device_type in GPU_DEVICE_TYPES

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        from trex.backends.triton import NAMESPACE  # noqa: F401 - registers the trex_triton ops
        from trex.targets import get_target

        device_type = get_target(ctx.target).device_type
        if not self.force and device_type not in GPU_DEVICE_TYPES:
            return PassResult(
                False,
                [
                    Decision(
                        "skip",
                        "graph",
                        f"target {ctx.target!r} runs on {device_type}, where the Triton kernels do not compile; "
                        "TritonPatterns(force=True) rewrites anyway",
                    )
                ],
            )
        decisions: list[Decision] = []
        graph = gm.graph
        for rsqrt in [n for n in graph.nodes if _is(n, aten.rsqrt.default)]:
            match = _match_rms_norm(rsqrt)
            if match is None or not ctx.fuel.take():
                continue
            out = match["out"]
            order = {n: i for i, n in enumerate(graph.nodes)}
            first_use = min(rsqrt.users, key=order.__getitem__)
            if isinstance(match["weight"], fx.Node) and order[match["weight"]] > order[first_use]:
                continue  # the weight is computed after the normalisation starts: no single place for the fused op
            with graph.inserting_before(first_use):
                fused = graph.call_function(
                    torch.ops.trex_triton.rms_norm_forward.default, (match["x"], match["weight"], match["eps"])
                )
                y = graph.call_function(operator.getitem, (fused, 0))
                rstd = graph.call_function(operator.getitem, (fused, 1))
                rstd_keepdim = graph.call_function(aten.view.default, (rstd, list(rsqrt.meta["val"].shape)))
            for new in (fused, y, rstd, rstd_keepdim):
                new.meta.update(
                    {k: v for k, v in out.meta.items() if k in ("nn_module_stack", "stack_trace", "seq_nr")}
                )
            y.meta["val"] = out.meta["val"]
            rstd_keepdim.meta["val"] = rsqrt.meta["val"]
            x_val, rstd_val = match["x"].meta["val"], rsqrt.meta["val"]
            rstd.meta["val"] = rstd_val.reshape(-1)
            fused.meta["val"] = (out.meta["val"], rstd.meta["val"])
            out.replace_all_uses_with(y)
            rsqrt.replace_all_uses_with(rstd_keepdim)
            decisions.append(
                Decision(
                    "rewrite",
                    out.name,
                    f"RMSNorm over {x_val.shape[-1]} features ({x_val.numel() // x_val.shape[-1]} rows) "
                    "-> trex_triton.rms_norm_forward",
                    {"kernel": "rms_norm"},
                )
            )
        for mul in [n for n in graph.nodes if _is(n, aten.mul.Tensor)]:
            silu = next((a for a in mul.args if _is(a, aten.silu.default)), None)
            if silu is None or mul.args[0] is mul.args[1]:
                continue
            up = mul.args[1] if mul.args[0] is silu else mul.args[0]
            gate = silu.args[0]
            if not isinstance(up, fx.Node) or up.meta["val"].shape != gate.meta["val"].shape or not ctx.fuel.take():
                continue
            with graph.inserting_before(mul):
                fused = graph.call_function(torch.ops.trex_triton.swiglu.default, (gate, up))
            fused.meta.update(mul.meta)
            mul.replace_all_uses_with(fused)
            decisions.append(
                Decision(
                    "rewrite",
                    mul.name,
                    f"SwiGLU over {tuple(gate.meta['val'].shape)} -> trex_triton.swiglu",
                    {"kernel": "swiglu"},
                )
            )
        decisions += _rewrite_routers(gm, ctx)
        decisions += _rewrite_moe_primitives(gm, ctx)
        if decisions:
            graph.eliminate_dead_code()
            gm.recompile()
        return PassResult(bool(decisions), decisions)


def _float32_of(node: fx.Node) -> fx.Node:
    """The node an fp32 upcast reads (the upcast's source), or `node` itself."""
    upcast = _is(node, aten._to_copy.default, torch.ops.prims.convert_element_type.default)
    return node.args[0] if upcast and node.meta["val"].dtype == torch.float32 else node


_ALIASES = (aten.detach.default, aten.clone.default, aten.alias.default)


def _through_aliases(node: object) -> object:
    """The value `node` copies or aliases (AOTAutograd reads saved values through `detach` chains)."""
    while _is(node, *_ALIASES):
        node = node.args[0]
    return node


def _match_softmax_router(softmax: fx.Node, backwards: dict[fx.Node, list[fx.Node]]) -> dict | None:
    """A softmax top-k router around `softmax` in the joint graph (transformers' Qwen3-MoE router), or None.

    forward:  [fp32 upcast of] logits[T,E] -> _softmax(-1) -> topk(k, -1) -> values, indices
              [-> values / values.sum(-1, keepdim)]                              (normalised: `norm_topk_prob`)
    backward: _softmax_backward_data(grad of the probabilities, softmax (through detaches), -1, fp32) - the
              gradient of the logits, fed by the gradient G of the router's weights: `div(G, sum)`
              (normalised) or the top-k backward's scatter of G into the selected slots.
    `backwards`: each softmax's `_softmax_backward_data` nodes.
    """
    x, dim, half_to_float = softmax.args
    logits = _float32_of(x)
    value = x.meta["val"]
    if half_to_float or value.dtype != torch.float32 or value.dim() != 2 or dim not in (-1, 1):
        return None
    topks = [u for u in softmax.users if _is(u, aten.topk.default)]
    if len(topks) != 1 or any(u is not topks[0] and not _is(u, *_ALIASES) for u in softmax.users):
        return None
    if len(backwards.get(softmax, [])) != 1:
        return None
    topk, backward = topks[0], backwards[softmax][0]
    k, topk_dim = topk.args[1], topk.args[2] if len(topk.args) > 2 else topk.kwargs.get("dim", -1)
    largest = topk.args[3] if len(topk.args) > 3 else topk.kwargs.get("largest", True)
    if topk_dim not in (-1, 1) or not largest or not isinstance(k, int):
        return None
    items = {u.args[1]: u for u in topk.users if _is(u, operator.getitem)}
    if set(items) != {0, 1}:
        return None
    values, indices = items[0], items[1]
    total = next((u for u in values.users if _is(u, aten.sum.dim_IntList) and u.args[0] is values), None)
    if total is not None and not (list(total.args[1]) in ([-1], [1]) and len(total.args) > 2 and total.args[2]):
        total = None
    divide = next(
        (u for u in values.users if total is not None and _is(u, aten.div.Tensor) and u.args == (values, total)),
        None,
    )
    if divide is not None:  # normalised: G enters the backward as div(G, sum); values / sum and its
        # second division by sum (the gradient of the sum) divide copies of the values, not G
        grads = [
            u.args[0]
            for u in total.users
            if _is(u, aten.div.Tensor)
            and u.args[1] is total
            and u is not divide
            and _through_aliases(u.args[0]) is not values
            and not (_is(u.args[0], aten.div.Tensor) and u.args[0].args[1] is total)
        ]
        output = divide
    else:  # raw top-k values: G enters the top-k backward (a scatter into the selected slots)
        grads = [
            u.args[3]
            for u in indices.users
            if _is(u, aten.scatter.src) and len(u.args) == 4 and u.args[2] is indices and u.args[1] in (-1, 1)
        ] + [
            u.args[0]
            for u in indices.users
            if _is(u, aten.value_selecting_reduction_backward.default) and u.args[2] is indices
        ]
        output = values
    if len(grads) != 1 or not isinstance(grads[0], fx.Node):
        return None
    return {
        "logits": logits,
        "k": k,
        "normalize": divide is not None,
        "output": output,
        "indices": indices,
        "grad": grads[0],
        "backward": backward,
    }


def _router_forward(top_k: int, normalize: bool):
    return lambda logits: torch.ops.trex_triton.router_topk(logits, None, top_k, "softmax", normalize, 0.0, 1.0)


def _router_backward(normalize: bool, dtype: torch.dtype):
    def backward(grad, logits, indices):
        grad_logits = torch.ops.trex_triton.router_topk_backward(grad, logits, indices, "softmax", normalize, 0.0, 1.0)
        return (grad_logits.to(dtype),)

    return backward


def _rewrite_routers(gm: fx.GraphModule, ctx: PassContext) -> list[Decision]:
    """Each softmax top-k router (forward and backward, see `_match_softmax_router`) -> `trex_triton.router_topk`
    and `router_topk_backward`: the weights, the chosen experts and the logits' gradient come from the kernels;
    the aten nodes they replace (softmax, topk, the normalisation, their backward) are then dead and go."""
    from trex.passes.canonicalize.moe import PROVENANCE_KEYS

    decisions: list[Decision] = []
    backwards: dict[fx.Node, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if _is(node, aten._softmax_backward_data.default):
            backwards.setdefault(_through_aliases(node.args[1]), []).append(node)
    for softmax in [n for n in gm.graph.nodes if _is(n, aten._softmax.default)]:
        match = _match_softmax_router(softmax, backwards)
        if match is None or not ctx.fuel.take():
            continue
        logits, backward, normalize = match["logits"], match["backward"], match["normalize"]
        after_topk = match["indices"].args[0].next  # before every use of the router's outputs
        weights, indices = inline_traced(
            gm, after_topk, _router_forward(match["k"], normalize), [logits], PROVENANCE_KEYS
        )
        match["output"].replace_all_uses_with(weights)
        match["indices"].replace_all_uses_with(indices)
        dtype = backward.meta["val"].dtype
        (grad_logits,) = inline_traced(
            gm, backward, _router_backward(normalize, dtype), [match["grad"], logits, indices], PROVENANCE_KEYS
        )
        backward.replace_all_uses_with(grad_logits)
        tokens, experts = logits.meta["val"].shape
        decisions.append(
            Decision(
                "rewrite",
                softmax.name,
                f"softmax top-{match['k']} router over {experts} experts ({tokens} tokens"
                f"{', normalised' if normalize else ''}) -> trex_triton.router_topk (+ router_topk_backward)",
                {"kernel": "router_topk"},
            )
        )
    return decisions


# Closures over one node's constants, for `inline_traced` (make_fx traces every parameter of the function it
# is given, so the constants cannot be default arguments).


def _permute(experts: int):
    return lambda hidden, index: torch.ops.trex_triton.moe_permute(hidden, index, experts)


def _permute_backward(tokens: int):
    return lambda grad, inverse: (torch.ops.trex_triton.moe_permute_backward(grad, inverse, tokens),)


def _grouped(kernel):
    return lambda a, b, offsets: (kernel(a, b, offsets),)


def _rewrite_moe_primitives(gm: fx.GraphModule, ctx: PassContext) -> list[Decision]:
    """Each trex MoE primitive -> its trex_triton kernel op (see the module docstring), in graph order, so a
    layer's dispatch is rewritten (and its inverse map known) before the combine and backwards that use it."""
    from trex.passes.canonicalize.moe import PROVENANCE_KEYS

    trex_ops, kernels = torch.ops.trex, torch.ops.trex_triton
    inherit = (*PROVENANCE_KEYS, "trex_moe")
    inverses: dict[fx.Node, fx.Node] = {}  # perm -> the inverse map moe_permute made with it
    decisions: list[Decision] = []

    def inverse_of(perm: fx.Node, node: fx.Node) -> fx.Node:
        if perm not in inverses:  # a permutation from elsewhere: invert it here (one scatter)
            (inverses[perm],) = inline_traced(
                gm,
                node,
                lambda p: (torch.empty_like(p).scatter_(0, p, torch.arange(p.numel(), device=p.device)),),
                [perm],
                inherit,
            )
        return inverses[perm]

    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not hasattr(trex_ops, "moe_dispatch"):
            continue
        target = node.target
        if target is trex_ops.moe_dispatch.default:
            hidden, index, experts = node.args
            if not ctx.fuel.take():
                break
            permuted, perm, inverse, offsets = inline_traced(gm, node, _permute(experts), [hidden, index], inherit)
            replace_node(gm, node, (permuted, perm, offsets))
            inverses[perm] = inverse
            what = "trex_triton.moe_permute (counting sort with index maps, padding-free)"
        elif target is trex_ops.moe_combine.default:
            expert_out, perm, weights = node.args
            if not ctx.fuel.take():
                break
            inverse = inverse_of(perm, node)
            (out,) = inline_traced(
                gm, node, lambda o, i, w: (kernels.moe_unpermute(o, i, w),), [expert_out, inverse, weights], inherit
            )
            replace_node(gm, node, out)
            what = "trex_triton.moe_unpermute (gather through the inverse map, weighted sum in fp32)"
        elif target is trex_ops.moe_combine_backward.default:
            grad, expert_out, perm, weights = node.args
            if not ctx.fuel.take():
                break
            inverse = inverse_of(perm, node)
            outputs = inline_traced(
                gm,
                node,
                lambda g, o, i, w: kernels.moe_unpermute_backward(g, o, i, w),
                [grad, expert_out, inverse, weights],
                inherit,
            )
            replace_node(gm, node, outputs)
            what = "trex_triton.moe_unpermute_backward"
        elif target is trex_ops.moe_dispatch_backward.default:
            grad, perm, tokens = node.args
            if not ctx.fuel.take():
                break
            inverse = inverse_of(perm, node)
            (out,) = inline_traced(gm, node, _permute_backward(tokens), [grad, inverse], inherit)
            replace_node(gm, node, out)
            what = "trex_triton.moe_permute_backward (each token's k row gradients gathered and summed)"
        elif target in (trex_ops.grouped_mm.default, trex_ops.grouped_mm_weight_grad.default):
            if not ctx.fuel.take():
                break
            name = "grouped_mm" if target is trex_ops.grouped_mm.default else "grouped_mm_weight_grad"
            kernel = getattr(kernels, name)
            (out,) = inline_traced(gm, node, _grouped(kernel), list(node.args), inherit)
            replace_node(gm, node, out)
            what = f"trex_triton.{name} (one launch for every expert, no padding)"
        else:
            continue
        decisions.append(Decision("rewrite", node.name, f"{target} -> {what}", {"kernel": what.split()[0]}))
    return decisions
