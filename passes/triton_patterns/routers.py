"""Router rewrites of the Triton pattern pass: each MoE router region of the joint graph, forward and backward,
becomes trex's router kernels (`trex.backends.triton.kernels.router`).

Two forms, as transformers writes them:
  * softmax top-k (Qwen3-MoE): `_softmax` -> `topk` [-> renormalise]; `_match_softmax_router`.
  * gathered scores (DeepSeek-V3, DeepSeek-V4): scores = sigmoid(logits) | sqrt(softplus(logits)); the experts
    are chosen by `topk` over scores [+ the aux-free bias] [with V3's group limit], or given (V4's hash
    layers: `tid2eid[token]`); the weights are `gather(scores, indices)` [/ (sum + eps)] [* scale];
    `_match_gather_router`.
A region is rewritten only when its backward is the one autograd derives from that forward alone (the
weights' gradient G reaches the scores only through the gather's scatter_add, and the scores' gradient is
only that), so replacing the logits' gradient by the kernel's keeps the program's meaning. A region that
looks like a router but is not rewritten gets a "skip" decision saying why.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from trex.graph_inline import inline_traced
from trex.pass_manager import Decision, PassContext

aten = torch.ops.aten


def _is(node: object, *targets: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _scalar(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _shape(node: object) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


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


def _score_of(scores: fx.Node) -> tuple[str, fx.Node] | None:
    """(score function, logits) when `scores` is sigmoid(logits) or sqrt(softplus(logits)) with torch's
    default softplus (beta 1, threshold 20, which the kernels compute); else None."""
    if _is(scores, aten.sigmoid.default):
        return "sigmoid", scores.args[0]
    if _is(scores, aten.sqrt.default) and _is(scores.args[0], aten.softplus.default):
        softplus = scores.args[0]
        beta = softplus.args[1] if len(softplus.args) > 1 else softplus.kwargs.get("beta", 1)
        threshold = softplus.args[2] if len(softplus.args) > 2 else softplus.kwargs.get("threshold", 20)
        if beta == 1 and threshold == 20:
            return "sqrtsoftplus", softplus.args[0]
    return None


def _getitem_of(node: object, index: int) -> fx.Node | None:
    """The multi-output node whose output `index` `node` is, or None."""
    if _is(node, operator.getitem) and node.args[1] == index:
        return node.args[0]
    return None


def _topk_args(topk: fx.Node) -> tuple[object, object, bool]:
    k = topk.args[1]
    dim = topk.args[2] if len(topk.args) > 2 else topk.kwargs.get("dim", -1)
    largest = topk.args[3] if len(topk.args) > 3 else topk.kwargs.get("largest", True)
    return k, dim, largest


def _values_unused(topk: fx.Node) -> bool:
    """Only the indices of `topk` are read (the selection is all it does)."""
    return all(_is(u, operator.getitem) and (u.args[1] == 1 or not u.users) for u in topk.users)


_LAYOUT = (
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.clone.default,
    aten.expand.default,
    aten.unsqueeze.default,
)


def _match_group_limit(masked: fx.Node, experts: int) -> tuple[fx.Node, int, int] | None:
    """DeepSeek-V3's group limit around `masked` = masked_fill(choice, ~mask, -inf), or None; returns
    (choice, n_group, topk_group). The mask must be, per expert, whether its group is one of the topk_group
    groups with the largest sum of their two best choices:
        group_scores = sum(topk(view(choice, [T, G, E/G]), 2).values, -1)
        mask = bool(reshape(expand(unsqueeze(scatter(zeros_like(group_scores), 1, topk(group_scores,
               topk_group).indices, 1), -1), [T, G, E/G]), [T, E]))"""
    choice, inverted, fill = masked.args
    if fill != float("-inf") or not _is(inverted, aten.bitwise_not.default):
        return None
    mask = inverted.args[0]
    if not (
        _is(mask, aten._to_copy.default, torch.ops.prims.convert_element_type.default)
        and mask.meta["val"].dtype == torch.bool
    ):
        return None
    node, chain = mask.args[0], []
    while _is(node, *_LAYOUT):
        chain.append(node)
        node = node.args[0]
    scatter = node
    if not (_is(scatter, aten.scatter.value) and scatter.args[1] in (1, -1) and scatter.args[3] == 1):
        return None
    tokens, n_group = scatter.meta["val"].shape
    if experts % n_group:
        return None
    # the chain from the group mask [T, G] to the expert mask [T, E] repeats each group's flag over its experts
    unsqueezes = [n for n in chain if _is(n, aten.unsqueeze.default)]
    expands = [n for n in chain if _is(n, aten.expand.default)]
    if (
        len(unsqueezes) != 1
        or unsqueezes[0].args[1] not in (-1, 2)
        or len(expands) != 1
        or _shape(expands[0]) != (tokens, n_group, experts // n_group)
        or _shape(chain[0]) != (tokens, experts)
        or _shape(unsqueezes[0]) != (tokens, n_group, 1)
    ):
        return None
    zeros, group_topk = scatter.args[0], _getitem_of(scatter.args[2], 1)
    if not _is(zeros, aten.zeros_like.default) or not _is(group_topk, aten.topk.default):
        return None
    topk_group, dim, largest = _topk_args(group_topk)
    group_scores = group_topk.args[0]
    if dim not in (-1, 1) or not largest or not isinstance(topk_group, int) or zeros.args[0] is not group_scores:
        return None
    if not (_is(group_scores, aten.sum.dim_IntList) and list(group_scores.args[1]) in ([-1], [2])):
        return None
    if len(group_scores.args) > 2 and group_scores.args[2]:
        return None  # keepdim
    best_two = _getitem_of(group_scores.args[0], 0)
    if not _is(best_two, aten.topk.default) or _topk_args(best_two) not in ((2, -1, True), (2, 2, True)):
        return None
    grouped = best_two.args[0]
    if not (_is(grouped, aten.view.default, aten.reshape.default) and grouped.args[0] is choice):
        return None
    if _shape(grouped) != (tokens, n_group, experts // n_group):
        return None
    return choice, n_group, topk_group


def _match_selection(indices: fx.Node, scores: fx.Node) -> dict | None:
    """How `indices` chose the experts, when it is topk(choice, k).indices over choice = scores [+ bias[E]],
    optionally group-limited; None when the indices come from elsewhere (they are then given)."""
    topk = _getitem_of(indices, 1)
    if not _is(topk, aten.topk.default) or not _values_unused(topk):
        return None
    k, dim, largest = _topk_args(topk)
    if dim not in (-1, 1) or not largest or not isinstance(k, int):
        return None
    experts = _shape(scores)[1]
    choice, n_group, topk_group = topk.args[0], 1, 1
    if _is(choice, aten.masked_fill.Scalar):
        group_limit = _match_group_limit(choice, experts)
        if group_limit is None:
            return None
        choice, n_group, topk_group = group_limit
    if choice is scores:
        bias = None
    elif _is(choice, aten.add.Tensor) and choice.args[0] is scores and _shape(choice.args[1]) == (experts,):
        bias = choice.args[1]
        if not bias.meta["val"].is_floating_point() or len(choice.args) > 2 or choice.kwargs.get("alpha", 1) != 1:
            return None
    else:
        return None
    return {"topk": topk, "k": k, "bias": bias, "n_group": n_group, "topk_group": topk_group}


def _earliest(nodes, order: dict[fx.Node, int]) -> fx.Node | None:
    nodes = [n for n in nodes if n in order]
    return min(nodes, key=order.__getitem__) if nodes else None


def _match_weights(gather: fx.Node, order: dict[fx.Node, int]) -> dict | None:
    """The weights' forward after `gather`: [/ (sum(gather, -1, keepdim) [+ eps])] [* scale]; returns
    the last node (`output`), the normaliser (the denominator, None when not normalised), eps, the scale and
    whether a multiplication applies it (`scaled`)."""
    total = _earliest(
        [
            u
            for u in gather.users
            if _is(u, aten.sum.dim_IntList) and list(u.args[1]) in ([-1], [1]) and len(u.args) > 2 and u.args[2]
        ],
        order,
    )
    eps, output, normalizer = 0.0, gather, None
    if total is not None:
        denominators = [total] + [
            u for u in total.users if _is(u, aten.add.Tensor) and u.args[0] is total and _scalar(u.args[1]) is not None
        ]
        for denominator in denominators:
            divide = _earliest(
                [u for u in denominator.users if _is(u, aten.div.Tensor) and u.args == (gather, denominator)], order
            )
            if divide is not None:
                eps = 0.0 if denominator is total else _scalar(denominator.args[1])
                output, normalizer = divide, denominator
                break
        else:
            return None  # a sum of the weights that does not normalise them: not this router
    scale = 1.0
    scaled = _earliest(
        [u for u in output.users if _is(u, aten.mul.Tensor) and u.args[0] is output and _scalar(u.args[1]) is not None],
        order,
    )
    if scaled is not None:
        scale, output = _scalar(scaled.args[1]), scaled
    return {"output": output, "normalizer": normalizer, "eps": eps, "scale": scale, "scaled": scaled is not None}


def _weights_gradient(grad_gather: object, gather: fx.Node, weights: dict) -> fx.Node | None:
    """G, the gradient of the router's weights, when `grad_gather` (the gradient the gather's backward
    scatters into the scores) is what autograd derives from G through the normalisation and the scaling
    alone; else None. Normalised (w = g / D, D = sum(g) + eps; `gs` = G * scale):
        grad_gather = gs / D + expand(sum(-gs * (g / D / D), -1, keepdim))
    with g read from the gather or a copy of it (an in-place division saves a clone)."""
    normalizer, scale = weights["normalizer"], weights["scale"]
    scaled = grad_gather
    if normalizer is not None:
        if not _is(grad_gather, aten.add.Tensor) or len(grad_gather.args) != 2:
            return None
        first, second = grad_gather.args
        direct, through_sum = (first, second) if _is(first, aten.div.Tensor) else (second, first)
        if not (_is(direct, aten.div.Tensor) and direct.args[1] is normalizer):
            return None
        scaled = direct.args[0]
        if not _is(through_sum, aten.expand.default):
            return None
        summed = through_sum.args[0]
        if not (_is(summed, aten.sum.dim_IntList) and list(summed.args[1]) in ([-1], [1]) and summed.args[2]):
            return None
        product = summed.args[0]
        if not _is(product, aten.mul.Tensor):
            return None
        negated = next((a for a in product.args if _is(a, aten.neg.default) and a.args[0] is scaled), None)
        quotient = next((a for a in product.args if a is not negated), None)
        if negated is None or not (_is(quotient, aten.div.Tensor) and quotient.args[1] is normalizer):
            return None
        inner = quotient.args[0]
        if not (
            _is(inner, aten.div.Tensor) and inner.args[1] is normalizer and _through_aliases(inner.args[0]) is gather
        ):
            return None
    if not weights["scaled"]:
        return scaled if isinstance(scaled, fx.Node) else None
    if not (_is(scaled, aten.mul.Tensor) and _scalar(scaled.args[1]) == scale):
        return None
    return scaled.args[0]


def _score_backward(scatter_add: fx.Node, scores: fx.Node, score: str, logits: fx.Node) -> fx.Node | None:
    """The node giving the logits' gradient through the scores, when its only input gradient is the
    gather's `scatter_add` (so all of the scores' gradient comes through the router's weights)."""
    users = list(scatter_add.users)
    if len(users) != 1:
        return None
    (user,) = users
    if score == "sigmoid":
        if _is(user, aten.sigmoid_backward.default) and user.args[0] is scatter_add:
            return user if _through_aliases(user.args[1]) is scores else None
        return None
    # sqrt backward: grad / (2 sqrt(s)); then softplus_backward(., logits, beta 1, threshold 20)
    if not (_is(user, aten.div.Tensor) and user.args[0] is scatter_add):
        return None
    twice = user.args[1]
    if not (_is(twice, aten.mul.Scalar, aten.mul.Tensor) and _through_aliases(twice.args[0]) is scores):
        return None
    if _scalar(twice.args[1]) != 2.0 or len(user.users) != 1:
        return None
    (softplus_backward,) = user.users
    if not (_is(softplus_backward, aten.softplus_backward.default) and softplus_backward.args[1] is logits):
        return None
    return softplus_backward if list(softplus_backward.args[2:]) == [1, 20] else None


def _differentiated(scores: fx.Node, logits: fx.Node) -> bool:
    """Whether the graph may hold a gradient of the scores: they are saved (AOTAutograd reads a value in the
    backward through a detach of it), or a score function's backward reads them or the logits."""
    backwards = (aten.sigmoid_backward.default, aten.softplus_backward.default)
    return any(_is(u, *_ALIASES, *backwards) for u in scores.users) or any(_is(u, *backwards) for u in logits.users)


def _match_gather_router(gather: fx.Node, order: dict[fx.Node, int]) -> dict | str | None:
    """The DeepSeek-V3/V4 router region around `gather` (see the module docstring) with its backward, as a
    dict; a string saying why a router-shaped region is not rewritten; None when `gather` is no router's."""
    scores, dim, indices = gather.args[:3]
    if dim not in (1, -1) or gather.kwargs.get("sparse_grad", False) or len(gather.args) > 3:
        return None
    found = _score_of(scores)
    if found is None:
        return None
    score, logits = found
    value = scores.meta["val"]
    if value.dim() != 2 or _shape(indices) is None or len(_shape(indices)) != 2:
        return None
    if value.dtype != torch.float32:
        return (
            f"the {score} scores are computed in {value.dtype} (the logits' dtype), the kernel computes them in "
            "float32: a different rounding, so the region stays in aten"
        )
    weights = _match_weights(gather, order)
    if weights is None:
        return None
    scatter_adds = [
        u
        for u in indices.users
        if _is(u, aten.scatter_add.default) and u.args[2] is indices and u.args[1] in (1, -1) and u is not gather
    ]
    backwards = [(s, b) for s in scatter_adds if (b := _score_backward(s, scores, score, logits)) is not None]
    if not scatter_adds and not _differentiated(scores, logits):
        grad = backward = None  # a forward-only graph (inference, or logits that need no gradient)
    elif len(backwards) != 1:
        return "no backward of the form autograd derives from the router alone (the scores get other gradients)"
    else:
        scatter_add, backward = backwards[0]
        grad = _weights_gradient(scatter_add.args[3], gather, weights)
        if grad is None or _shape(grad) != _shape(indices):
            return "the weights' gradient reaches the scores through more than the normalisation and scaling"
    return {
        "score": score,
        "logits": logits,
        "indices": indices,
        "selection": _match_selection(indices, scores),
        "grad": grad,
        "backward": backward,
        **weights,
    }


def _route(selection: dict, score: str, normalize: bool, eps: float, scale: float):
    """router_topk over the logits (and the bias when there is one), for `inline_traced`."""
    args = (selection["k"], score, normalize, eps, scale, selection["n_group"], selection["topk_group"])
    if selection["bias"] is None:
        return lambda logits: torch.ops.trex_triton.router_topk(logits, None, *args)
    return lambda logits, bias: torch.ops.trex_triton.router_topk(logits, bias, *args)


def _given(score: str, normalize: bool, eps: float, scale: float):
    return lambda logits, indices: (
        torch.ops.trex_triton.router_weights(logits, indices, score, normalize, eps, scale),
    )


def _logits_gradient(score: str, normalize: bool, eps: float, scale: float, dtype: torch.dtype):
    def backward(grad, logits, indices):
        grad_logits = torch.ops.trex_triton.router_topk_backward(grad, logits, indices, score, normalize, eps, scale)
        return (grad_logits.to(dtype),)

    return backward


def _rewrite_gather_routers(gm: fx.GraphModule, ctx: PassContext) -> list[Decision]:
    """Each DeepSeek-V3/V4 router (`_match_gather_router`) -> `trex_triton.router_topk` (the experts chosen
    in the kernel) or `router_weights` (the experts given), and `router_topk_backward` for the logits'
    gradient; the aten nodes they replace are then dead and go."""
    from trex.passes.canonicalize.moe import PROVENANCE_KEYS

    decisions: list[Decision] = []
    for gather in [n for n in gm.graph.nodes if _is(n, aten.gather.default)]:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        match = _match_gather_router(gather, order)
        if isinstance(match, str):
            decisions.append(Decision("skip", gather.name, f"router-shaped region not rewritten: {match}"))
            continue
        if match is None or not ctx.fuel.take():
            continue
        score, logits, selection = match["score"], match["logits"], match["selection"]
        normalize = match["normalizer"] is not None
        constants = (score, normalize, match["eps"], match["scale"])
        tokens, experts = _shape(logits)
        if selection is not None:
            old_indices = match["indices"]
            first_use = _earliest(old_indices.users, order)
            inputs = [logits] if selection["bias"] is None else [logits, selection["bias"]]
            weights, indices = inline_traced(gm, first_use, _route(selection, *constants), inputs, PROVENANCE_KEYS)
            old_indices.replace_all_uses_with(indices)
            kernel = "router_topk"
            how = (
                f"top-{selection['k']} of {experts} experts"
                + (", aux-free bias in the choice" if selection["bias"] is not None else "")
                + (
                    f", group-limited ({selection['topk_group']} of {selection['n_group']} groups)"
                    if selection["n_group"] > 1
                    else ""
                )
            )
        else:
            indices = match["indices"]
            (weights,) = inline_traced(gm, gather, _given(*constants), [logits, indices], PROVENANCE_KEYS)
            kernel = "router_weights"
            how = f"{_shape(indices)[1]} given experts of {experts} (chosen outside the router: hash routing)"
        match["output"].replace_all_uses_with(weights)
        backward = match["backward"]
        if backward is not None:
            (grad_logits,) = inline_traced(
                gm,
                backward,
                _logits_gradient(*constants, backward.meta["val"].dtype),
                [match["grad"], logits, indices],
                PROVENANCE_KEYS,
            )
            backward.replace_all_uses_with(grad_logits)
        decisions.append(
            Decision(
                "rewrite",
                gather.name,
                f"{score} router over {tokens} tokens: {how}"
                + (f", normalised (eps {match['eps']:g})" if normalize else "")
                + (f", scaled by {match['scale']:g}" if match["scale"] != 1.0 else "")
                + f" -> trex_triton.{kernel}"
                + (" (+ router_topk_backward)" if backward is not None else " (forward only: no gradient here)"),
                {
                    "kernel": kernel,
                    "score": score,
                    "n_group": selection["n_group"] if selection else None,
                    "topk_group": selection["topk_group"] if selection else None,
                },
            )
        )
    return decisions


def rewrite_routers(gm: fx.GraphModule, ctx: PassContext) -> list[Decision]:
    """Every router region of the graph, both forms (module docstring)."""
    return _rewrite_routers(gm, ctx) + _rewrite_gather_routers(gm, ctx)
