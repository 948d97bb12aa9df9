"""Attention regions lowered to `npu_fusion_attention` on Dynamo's graph, before AOTAutograd traces it.

The post-partition patterns (`patterns.py`) can only lower an attention whose forward and backward
are aten's flash kernels (SDPA's CPU flash path): there the saved values are q, k, v, out and the
logsumexp `npu_fusion_attention_grad` reads. An attention written out as matmul/softmax/matmul
(DeepSeek-V4's eager attention with sinks) or one SDPA runs on its math path (DeepSeek-V3's MLA,
Dq = 192 != Dv = 128) reaches the partitioned graphs as bmm/softmax nodes whose backward reads the
softmax probabilities: no rewrite after the partition can give that backward what the fused grad op
needs. So these regions are rewritten here, on the torch-level graph Dynamo captured, into one call
of torch_npu's `npu_fusion_attention` (the CPU emulation, or torch_npu's op when an NPU is present);
AOTAutograd then traces the op's own autograd, whose backward is one `npu_fusion_attention_grad`
call, and the partitioner saves q, k, v, the output and the softmax statistics for it.

Regions (all: dropout probability 0, layout BNSD, schema-checked against torch_npu 2.13.0):
  eager   softmax(cat([q @ k^T * scale (+ mask), sink], -1) [- max]) [..., :-1] (dropout 0) (.to) @ v
          with a per-head `sink` (V4; gpt-oss), or softmax(q @ k^T * scale (+ mask)) @ v without;
          k, v may be `repeat_kv` copies of fewer heads (passed un-repeated: the op's GQA)
  sdpa    scaled_dot_product_attention with Dq != Dv (SDPA's math path; Dq == Dv takes aten's flash
          kernel, which the post-partition pattern lowers)
Masks: a bool SDPA mask (True = keep) becomes `atten_mask = ~mask`; an additive float mask becomes
`atten_mask = mask != 0` only when it is proven to hold 0 or a value below -1e30 (or -inf) in every
element (`_zero_or_masked`: where/masked_fill/new_full/new_zeros/scatter_/cat/views, in-place writes
included), so that exp(score + mask - max) is exactly 0 where the bool mask masks. `is_causal` with
Sq == Skv is sparse_mode 2 (the compressed 2048x2048 upper triangle). torch_npu takes no float bias
as a mask (its `pse` is a BNSS/BN1S/1NSS position encoding), so an attention with any other additive
mask stays as it is.
Where the eager form has no sink, a row whose keys are all masked differs (eager averages v, the op
gives 0); with a sink (V4) no row is empty.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from trex.backends.ascend import emulation
from trex.backends.ascend.schemas import check_call

OP = "npu_fusion_attention"
NEG_THRESHOLD = -1e30  # an additive mask value at or below this zeroes its probability exactly (fp32 exp)
_SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax}
_MATMUL = {torch.matmul, torch.Tensor.matmul, operator.matmul}
_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_VIEWS = {"reshape", "view", "expand", "unsqueeze", "contiguous", "transpose", "permute", "clone"}
_CASTS = {"to", "float", "type_as"}


def _value(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else node


def _tensor(node: Any) -> torch.Tensor | None:
    value = _value(node)
    return value if isinstance(value, torch.Tensor) else None


def _is_fn(node: Any, targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _is_method(node: Any, *names: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target in names


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _last_dim(node: fx.Node, dim: Any) -> bool:
    value = _tensor(node)
    return value is not None and isinstance(dim, int) and dim in (-1, value.dim() - 1)


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


# ---------------------------------------------------------------------------------------------
# Additive masks that hold only 0 or "masked" values


def _is_zero_or_neg(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (value == 0 or value <= NEG_THRESHOLD)


_FILLED = {"new_zeros": None, "new_full": 1, "zeros_like": None}
_PRESERVING_WRITES = {"scatter_": 3, "masked_fill_": 2, "fill_": 1}  # method -> index of the scalar written


def _writes_preserve(node: fx.Node, seen: set[fx.Node]) -> bool:
    """Every in-place write into `node` (or a view of it) writes 0 or a masked value."""
    for user in node.users:
        if user.op != "call_method":
            if _is_fn(user, {operator.getitem}) and user.args[0] is node and not _writes_preserve(user, seen):
                return False
            continue
        name = user.target
        if name.endswith("_"):
            index = _PRESERVING_WRITES.get(name)
            if index is None or user.args[0] is not node or len(user.args) <= index:
                return False
            if not _is_zero_or_neg(user.args[index]):
                return False
        elif name in _VIEWS and user.args[0] is node and not _writes_preserve(user, seen):
            return False
    return True


def _zero_or_masked(node: Any, seen: set[fx.Node] | None = None) -> bool:
    """True when every element of `node` is 0 or <= NEG_THRESHOLD (a where/masked_fill-built mask)."""
    if _is_zero_or_neg(node):
        return True
    if not isinstance(node, fx.Node) or _tensor(node) is None or not _tensor(node).is_floating_point():
        return False
    seen = set() if seen is None else seen
    if node in seen:
        return True
    seen.add(node)
    if not _writes_preserve(node, seen):
        return False
    if _is_fn(node, {torch.where}):
        return _zero_or_masked(node.args[1], seen) and _zero_or_masked(node.args[2], seen)
    if _is_fn(node, {torch.zeros, torch.zeros_like}) or _is_method(node, "new_zeros", "zero_"):
        return True
    if _is_fn(node, {torch.full}) or _is_method(node, "new_full"):
        return _is_zero_or_neg(_arg(node, 2 if node.op == "call_method" else 1, "fill_value"))
    if _is_method(node, "masked_fill"):
        return _zero_or_masked(node.args[0], seen) and _is_zero_or_neg(_arg(node, 2, "value"))
    if _is_fn(node, {torch.cat}):
        return all(_zero_or_masked(part, seen) for part in node.args[0])
    if _is_fn(node, {operator.getitem}):
        return _zero_or_masked(node.args[0], seen)
    if _is_method(node, *_VIEWS, *_CASTS):
        return _zero_or_masked(node.args[0], seen)
    return False


def _mask_shape_ok(mask: torch.Tensor, query: torch.Tensor, skv: int) -> bool:
    """torch_npu's atten_mask shapes: BNSS, B1SS, 11SS or SS."""
    if list(mask.shape[-2:]) != [query.size(2), skv]:
        return False
    if mask.dim() == 2:
        return True
    return mask.dim() == 4 and mask.size(0) in (1, query.size(0)) and mask.size(1) in (1, query.size(1))


# ---------------------------------------------------------------------------------------------
# Region recognition


class Region:
    """One attention region: what the fused call takes, the node it replaces, the nodes it removes."""

    def __init__(self, kind: str, out: fx.Node, nodes: list[fx.Node], **call: Any):
        self.kind, self.out, self.nodes, self.call = kind, out, nodes, call
        self.repeats: list[fx.Node] = []  # repeat_kv nodes the call no longer reads (erased when dead)


def _unrepeated(node: fx.Node, heads: int, dropped: list[fx.Node]) -> fx.Node:
    """`repeat_kv(x)` -> x ([B, Nkv, S, D] with Nkv dividing the query heads; the op's GQA), its three
    nodes added to `dropped`; else the node itself."""
    if not _is_method(node, "reshape", "view") or not _is_method(node.args[0], "expand"):
        return node
    expand = node.args[0]
    source = expand.args[0]
    if not _is_fn(source, {operator.getitem}):
        return node
    index = source.args[1]
    inner = source.args[0]
    value = _tensor(inner)
    if (
        value is None
        or value.dim() != 4
        or not isinstance(index, tuple)
        or len(index) != 5
        or index[2] is not None
        or any(i != slice(None) for i in index[:2] + index[3:])
        or heads % value.size(1)
    ):
        return node
    dropped += [node, expand, source]
    return inner


def _is_scalar(value: Any) -> bool:
    """A Python float, or a graph value Dynamo kept symbolic (a SymFloat, e.g. an unspecialized
    `module.scaling`): the op's `float scale` takes either."""
    value = _value(value)
    return isinstance(value, (float, torch.SymFloat)) or (isinstance(value, int) and not isinstance(value, bool))


def _scaled_scores(node: Any) -> tuple[fx.Node, fx.Node, float, Any, list[fx.Node]] | None:
    """(q, k, scale, additive mask or None, nodes) of `q @ k^T * scale (+ mask)`."""
    nodes: list[fx.Node] = []
    mask = None
    if _is_fn(node, {operator.add, torch.add}) and len(node.users) == 1:
        scores, mask = node.args[0], node.args[1]
        nodes.append(node)
        node = scores
    scale = 1.0
    if _is_fn(node, {operator.mul}) and _is_scalar(node.args[1]) and len(node.users) == 1:
        scale = node.args[1]
        nodes.append(node)
        node = node.args[0]
    elif _is_fn(node, {operator.truediv}) and isinstance(node.args[1], float) and len(node.users) == 1:
        scale = 1.0 / node.args[1]
        nodes.append(node)
        node = node.args[0]
    if not _is_fn(node, _MATMUL) or len(node.users) != 1:
        return None
    q, k_t = node.args[0], node.args[1]
    nodes.append(node)
    if not (_is_method(k_t, "transpose") and sorted(k_t.args[1:]) in ([2, 3], [-2, -1])) or len(k_t.users) != 1:
        return None
    nodes.append(k_t)
    return q, k_t.args[0], scale, mask, nodes


def _match_eager(softmax: fx.Node) -> Region | None:
    """softmax(cat([scores, sink], -1) - max) [..., :-1] -> dropout(0) -> to -> @ v, or without a sink."""
    if not _last_dim(softmax, _arg(softmax, 1, "dim")):
        return None
    nodes = [softmax]
    logits = softmax.args[0]
    if _is_fn(logits, {operator.sub}) and len(logits.users) == 1:  # x - x.max(-1, keepdim=True) (shift-free)
        shifted, row_max = logits.args
        if not (_is_fn(row_max, {operator.getitem}) and row_max.args[1] == 0 and _is_method(row_max.args[0], "max")):
            return None
        max_call = row_max.args[0]
        if max_call.args[0] is not shifted or not _last_dim(shifted, _arg(max_call, 1, "dim")):
            return None
        if not _arg(max_call, 2, "keepdim", False) or len(max_call.users) != 1 or len(row_max.users) != 1:
            return None
        nodes += [logits, row_max, max_call]
        logits = shifted
    sink = None
    probs = softmax
    if _is_fn(logits, {torch.cat}):
        parts = logits.args[0]
        if len(parts) != 2 or not _last_dim(logits, _arg(logits, 1, "dim", 0)):
            return None
        scores, sink_column = parts
        sink = sink_column
        while _is_method(sink, "expand", "reshape", "view", "unsqueeze"):
            nodes.append(sink)
            sink = sink.args[0]
        sink_value, scores_value = _tensor(sink), _tensor(scores)
        if sink_value is None or scores_value is None or sink_value.dim() != 1:
            return None
        if sink_value.size(0) != scores_value.size(1) or list(_tensor(sink_column).shape[-1:]) != [1]:
            return None
        nodes.append(logits)
        logits = scores
        dropped = _only_user(softmax)  # probs[..., :-1]: the sink's column dropped
        if not _is_fn(dropped, {operator.getitem}) or dropped.args[1] not in (
            (Ellipsis, slice(None, -1, None)),
            (slice(None), slice(None), slice(None), slice(None, -1, None)),
        ):
            return None
        nodes.append(dropped)
        probs = dropped
    found = _scaled_scores(logits)
    if found is None:
        return None
    q, k, scale, mask, score_nodes = found
    nodes += score_nodes
    # the probabilities' way to the second matmul: dropout(p=0), a cast
    node = probs
    while True:
        user = _only_user(node)
        no_dropout = _is_fn(user, {F.dropout}) and _arg(user, 1, "p", 0.5) == 0.0
        if not (no_dropout or _is_method(user, "to", "float", "type_as")) or user.args[0] is not node:
            break
        nodes.append(user)
        node = user
    out = _only_user(node)
    if not _is_fn(out, _MATMUL) or out.args[0] is not node:
        return None
    v = out.args[1]
    return _region("eager", out, nodes, q, k, v, scale, mask=mask, sink=sink, causal=False)


def _match_sdpa(node: fx.Node) -> Region | None:
    q, k, v = node.args[:3]
    mask = _arg(node, 3, "attn_mask")
    if _arg(node, 4, "dropout_p", 0.0) != 0.0:
        return None
    causal = bool(_arg(node, 5, "is_causal", False))
    scale = _arg(node, 6, "scale")
    qv, vv = _tensor(q), _tensor(v)
    if qv is None or vv is None or qv.size(-1) == vv.size(-1):  # Dq == Dv: aten's flash kernel, lowered later
        return None
    if not _arg(node, 7, "enable_gqa", False) and _tensor(k) is not None and _tensor(k).size(1) != qv.size(1):
        return None
    if scale is None:
        scale = 1.0 / math.sqrt(qv.size(-1))
    elif not _is_scalar(scale):
        return None
    return _region("sdpa", node, [node], q, k, v, scale, mask=mask, sink=None, causal=causal)


def _region(kind, out, nodes, q, k, v, scale, *, mask, sink, causal) -> Region | None:
    qv = _tensor(q)
    if qv is None or qv.dim() != 4:
        return None
    heads = qv.size(1)
    repeats: list[fx.Node] = []
    k, v = _unrepeated(k, heads, repeats), _unrepeated(v, heads, repeats)
    kv, vv = _tensor(k), _tensor(v)
    if kv is None or vv is None or kv.dim() != 4 or vv.dim() != 4:
        return None
    if kv.size(-1) != qv.size(-1) or kv.size(-1) < vv.size(-1) or heads % kv.size(1) or kv.shape[:3] != vv.shape[:3]:
        return None  # the op's layout: Dq = Dk >= Dv, key/value heads dividing the query heads
    if kv.dtype != qv.dtype or vv.dtype != qv.dtype:
        return None
    mask_kind = None
    if mask is not None:
        mv = _tensor(mask)
        if mv is None or not _mask_shape_ok(mv, qv, kv.size(2)) or causal:
            return None
        if mv.dtype == torch.bool:
            mask_kind = "keep"
        elif _zero_or_masked(mask):
            mask_kind = "additive"
        else:
            return None
    if causal and qv.size(2) != kv.size(2):
        return None
    if sink is not None and _tensor(sink).dtype != torch.float32:
        return None  # the op takes a float32 sink (its docs' example); a cast would change V4's numbers
    region = Region(kind, out, nodes, q=q, k=k, v=v, scale=scale, mask=mask, mask_kind=mask_kind, sink=sink)
    region.call["causal"] = causal
    region.repeats = repeats
    return region


def find_regions(graph: fx.Graph) -> list[Region]:
    regions = []
    for node in graph.nodes:
        if _is_fn(node, _SOFTMAX) or _is_method(node, "softmax"):
            region = _match_eager(node)
        elif _is_fn(node, _SDPA):
            region = _match_sdpa(node)
        else:
            continue
        if region is not None and _closed(region):
            regions.append(region)
    return regions


def _closed(region: Region) -> bool:
    """No node of the region but its output is read outside it (e.g. attention weights returned)."""
    inside = set(region.nodes) | {region.out}
    return all(set(n.users) <= inside for n in region.nodes if n is not region.out)


# ---------------------------------------------------------------------------------------------
# Emission


def _mask_shape(call: dict, query: torch.Tensor) -> list[int] | None:
    if call["causal"] and call["mask"] is None:
        return [2048, 2048]
    return list(_tensor(call["mask"]).shape) if call["mask"] is not None else None


def _checked_call(check: Callable[..., Any], args: tuple, kwargs: dict, *, mask_shape: list[int] | None) -> None:
    """Bind the call against torch_npu's schema, the graph's nodes standing as their example values (the
    bool mask the rewrite adds as a meta tensor of its shape)."""
    kwargs = dict(kwargs)
    if kwargs.get("atten_mask") is not None:
        kwargs["atten_mask"] = torch.empty(mask_shape, dtype=torch.bool, device="meta")
    values = torch.utils._pytree.tree_map_only(fx.Node, _value, (args, kwargs))
    check(OP, values[0], values[1], allowed={"keep_prob": [1.0], "sparse_mode": [0, 2], "input_layout": ["BNSD"]})


def call_arguments(call: dict, heads: int, atten_mask: Any, sparse_mode: int) -> tuple[tuple, dict]:
    """npu_fusion_attention's arguments for a region (BNSD, no dropout; `sink` only when the region has one)."""
    scale = call["scale"] if isinstance(call["scale"], fx.Node) else float(call["scale"])
    kwargs = {"atten_mask": atten_mask, "scale": scale, "keep_prob": 1.0, "sparse_mode": sparse_mode}
    if call["sink"] is not None:
        kwargs["sink"] = call["sink"]
    return (call["q"], call["k"], call["v"], heads, "BNSD"), kwargs


def lower_attention(
    gm: fx.GraphModule, *, emulate: bool | None = None, check: Callable[..., Any] = check_call
) -> list[Region]:
    """Rewrite every recognised attention region of Dynamo's graph `gm` into one npu_fusion_attention
    call (in place); returns the regions rewritten."""
    regions = find_regions(gm.graph)
    target = emulation.op(OP, emulate=emulate)
    graph = gm.graph
    for region in regions:
        c = region.call
        qv = _tensor(c["q"])
        with graph.inserting_before(region.out):
            sparse_mode, atten_mask = 0, None
            if c["mask_kind"] == "keep":
                atten_mask = graph.call_function(torch.logical_not, (c["mask"],))
            elif c["mask_kind"] == "additive":
                atten_mask = graph.call_function(torch.ne, (c["mask"], 0))
            elif c["causal"]:
                ones = graph.call_function(torch.ones, (2048, 2048), {"dtype": torch.bool, "device": qv.device})
                atten_mask = graph.call_function(torch.triu, (ones, 1))
                sparse_mode = 2
            args, kwargs = call_arguments(c, qv.size(1), atten_mask, sparse_mode)
            _checked_call(check, args, kwargs, mask_shape=_mask_shape(c, qv))
            call = graph.call_function(target, args, kwargs)
            call.meta["trex_npu_op"] = OP
            out = graph.call_function(operator.getitem, (call, 0))
            if _tensor(region.out).dtype != qv.dtype:
                out = graph.call_function(torch.Tensor.to, (out, _tensor(region.out).dtype))
        region.out.replace_all_uses_with(out)
        _erase_dead(graph, [region.out, *region.nodes, *region.repeats])
    if regions:
        graph.lint()
        gm.recompile()
    return regions


def _erase_dead(graph: fx.Graph, candidates: list[fx.Node]) -> None:
    """Erase the candidates nothing reads any more (users first)."""
    left = list(dict.fromkeys(candidates))
    while True:
        dead = [n for n in left if not n.users]
        if not dead:
            return
        for node in dead:
            graph.erase_node(node)
        left = [n for n in left if n not in dead]
