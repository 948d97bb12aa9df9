"""DeepSeek-V4's and V3's interleaved RoPE lowered to `npu_rotary_mul` on Dynamo's graph, before AOTAutograd.

The post-partition pattern (`patterns.InterleavedRotary`) lowers this rotation's forward only: its
backward reaches the backward graph as the slice/stack/neg backward nodes of the rotation, whose inputs
are the forward's saved tables, and no post-partition rewrite can hand `npu_rotary_mul_backward` the
`self` it is documented to take. Rewritten here instead, the region becomes one `npu_rotary_mul(x, cos,
sin, rotary_mode="interleave")` call whose autograd (torch_npu's on a device, the emulation's
`register_autograd` here) makes the backward one `npu_rotary_mul_backward(grad, x, cos, sin,
"interleave")`, with x saved by the partitioner.

Region (torch-level, as transformers' DeepSeek-V4 `apply_rotary_pos_emb` writes it):
    x' * cos + [float](stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2) | .view(x.shape)) * sin
with x' = x or x.float() (both arms cast alike), 4-D x, cos and sin with x's last dimension broadcasting
to x's shape: exactly the interleave formula of npu_rotary_mul's documentation. Tables of a narrower float
dtype than x' (bf16 V4: bf16 tables times x.float(), which torch promotes to fp32 exactly) are cast to its
dtype first, as the op takes one dtype for all three.
transformers' DeepSeek-V3 form, cat([xe * c - xo * s, xo * c + xe * s], -1) with xe, xo = x[..., 0::2],
x[..., 1::2] and half-width tables, is that rotation followed by a de-interleave: npu_rotary_mul(x,
c.repeat_interleave(2, -1), s.repeat_interleave(2, -1), "interleave"), then cat of its even and odd
lanes (glue, whose backward autograd traces as usual).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from trex.backends.ascend import emulation
from trex.backends.ascend.attention_before_autograd import _erase_dead, _is_fn, _is_method, _tensor, _value
from trex.backends.ascend.schemas import check_call

OP = "npu_rotary_mul"


def _float_of(node: Any) -> Any:
    """The node `node` casts to float32 (`x.float()` / `x.to(torch.float32)`), or None."""
    if _is_method(node, "float") and len(node.args) == 1:
        return node.args[0]
    if _is_method(node, "to") and len(node.args) == 2 and node.args[1] is torch.float32 and not node.kwargs:
        return node.args[0]
    return None


def _lanes(node: Any, x: Any, start: int) -> bool:
    """node is x[..., start::2]."""
    if not _is_fn(node, {operator.getitem}) or node.args[0] is not x:
        return False
    index = node.args[1]
    return (
        isinstance(index, tuple)
        and len(index) == 2
        and index[0] is Ellipsis
        and index[1] in (slice(start, None, 2), slice(start or None, None, 2))
    )


def _rotated(flat: Any) -> tuple[fx.Node, list[fx.Node]] | None:
    """(x, nodes) of stack([-x[..., 1::2], x[..., 0::2]], -1) flattened back to x's shape."""
    if _is_method(flat, "flatten"):
        if list(flat.args[1:]) not in ([-2], [-2, -1]):
            return None
    elif not _is_method(flat, "view", "reshape"):
        return None
    stack = flat.args[0]
    if not _is_fn(stack, {torch.stack}) or len(stack.args[0]) != 2:
        return None
    dim = stack.args[1] if len(stack.args) > 1 else stack.kwargs.get("dim", 0)
    if dim not in (-1, _tensor(stack).dim() - 1):
        return None
    negated, even = stack.args[0]
    if not (_is_fn(negated, {operator.neg}) or _is_method(negated, "neg")):
        return None
    odd = negated.args[0]
    x = even.args[0] if isinstance(even, fx.Node) and even.args else None
    if x is None or not (_lanes(even, x, 0) and _lanes(odd, x, 1)):
        return None
    if list(_tensor(flat).shape) != list(_tensor(x).shape):
        return None
    return x, [flat, stack, negated, odd, even]


def _match(add: fx.Node):
    if len(add.args) != 2 or add.kwargs:
        return None
    for straight, rotated in (add.args, add.args[::-1]):
        if not (_is_fn(straight, {operator.mul}) and _is_fn(rotated, {operator.mul})):
            continue
        for flat, sin in (rotated.args, rotated.args[::-1]):
            source = _float_of(flat)
            found = _rotated(source if source is not None else flat)
            if found is None:
                continue
            x, nodes = found
            if source is not None:
                nodes = [flat, *nodes]
            for xa, cos in (straight.args, straight.args[::-1]):
                if not (xa is x if source is None else _float_of(xa) is x):
                    continue
                values = [_tensor(v) for v in (xa, cos, sin)]
                if any(v is None or v.dim() != 4 or not v.is_floating_point() for v in values):
                    continue
                if any(v.size(-1) != values[0].size(-1) for v in values):
                    continue
                if list(torch.broadcast_shapes(*(v.shape for v in values))) != list(values[0].shape):
                    continue
                # bf16 V4: x' = x.float() times bf16 tables, which torch promotes to fp32 (exactly); npu_rotary_mul
                # takes one dtype, so the tables are cast to it
                dtype = values[0].dtype
                if torch.promote_types(dtype, torch.promote_types(values[1].dtype, values[2].dtype)) != dtype:
                    continue
                if _tensor(add) is None or _tensor(add).dtype != dtype:
                    continue
                inside = {*nodes, straight, rotated, add}
                if all(set(n.users) <= inside for n in nodes + [straight, rotated]):
                    return xa, cos, sin, [*nodes, straight, rotated]
    return None


def _product(node: Any, a: Any, b: Any) -> bool:
    return _is_fn(node, {operator.mul}) and set(node.args) == {a, b} and len(node.args) == 2


def _match_v3(cat: fx.Node):
    """(x, c, s, nodes) of cat([xe*c - xo*s, xo*c + xe*s], -1) (transformers' DeepSeek-V3 RoPE)."""
    parts = cat.args[0] if cat.args else None
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or dim not in (-1, _tensor(cat).dim() - 1):
        return None
    first, second = parts
    if not (_is_fn(first, {operator.sub}) and _is_fn(second, {operator.add})):
        return None
    straight, cross = first.args
    if not (_is_fn(straight, {operator.mul}) and _is_fn(cross, {operator.mul})):
        return None
    for even, c in (straight.args, straight.args[::-1]):
        x = even.args[0] if _is_fn(even, {operator.getitem}) else None
        if x is None or not _lanes(even, x, 0):
            continue
        for odd, s in (cross.args, cross.args[::-1]):
            if not _lanes(odd, x, 1):
                continue
            products = [a for a in second.args if _product(a, odd, c) or _product(a, even, s)]
            if len(products) != 2 or _product(products[0], odd, c) == _product(products[1], odd, c):
                continue
            values = [_tensor(v) for v in (x, c, s)]
            if any(v is None or v.dim() != 4 for v in values) or len({v.dtype for v in values}) != 1:
                continue
            if values[0].size(-1) % 2 or any(v.size(-1) * 2 != values[0].size(-1) for v in values[1:]):
                continue
            half = list(values[0].shape[:-1]) + [values[0].size(-1) // 2]
            if list(torch.broadcast_shapes(half, values[1].shape, values[2].shape)) != half:
                continue
            nodes = [first, second, straight, cross, *products, even, odd]
            inside = {*nodes, cat}
            if all(set(n.users) <= inside for n in nodes):
                return x, c, s, nodes
    return None


def _doubled(table: torch.Tensor) -> torch.Tensor:
    """A stand-in (meta) for table.repeat_interleave(2, -1), for the schema check."""
    return torch.empty([*table.shape[:-1], 2 * table.size(-1)], dtype=table.dtype, device="meta")


def lower_rotary(gm: fx.GraphModule, *, emulate: bool | None = None, check: Callable[..., Any] = check_call) -> int:
    """Rewrite every V3- and V4-form interleaved RoPE of Dynamo's graph into npu_rotary_mul; returns how many."""
    graph = gm.graph
    target = emulation.op(OP, emulate=emulate)
    count = 0
    for cat in list(graph.nodes):
        if cat.graph is not graph or not _is_fn(cat, {torch.cat}):
            continue
        found = _match_v3(cat)
        if found is None:
            continue
        x, c, s, nodes = found
        check(OP, (_value(x), _doubled(_value(c)), _doubled(_value(s))), {"rotary_mode": "interleave"})
        with graph.inserting_before(cat):
            c2, s2 = (graph.call_method("repeat_interleave", (t, 2), {"dim": -1}) for t in (c, s))
            call = graph.call_function(target, (x, c2, s2), {"rotary_mode": "interleave"})
            lanes = [graph.call_function(operator.getitem, (call, (Ellipsis, slice(i, None, 2)))) for i in (0, 1)]
            out = graph.call_function(torch.cat, (lanes, -1))
        call.meta["trex_npu_op"] = OP
        cat.replace_all_uses_with(out)
        _erase_dead(graph, [cat, *nodes])
        count += 1
    for add in list(graph.nodes):
        if add.graph is not graph or not _is_fn(add, {operator.add}):
            continue
        found = _match(add)
        if found is None:
            continue
        xa, cos, sin, nodes = found
        dtype = _tensor(xa).dtype
        kwargs = {"rotary_mode": "interleave"}
        values = [_value(xa), *(_value(t).to(dtype) for t in (cos, sin))]
        check(OP, values, kwargs, allowed={"rotary_mode": ["interleave"]})
        with graph.inserting_before(add):
            tables = [t if _tensor(t).dtype == dtype else graph.call_method("to", (t, dtype)) for t in (cos, sin)]
            call = graph.call_function(target, (xa, *tables), kwargs)
        call.meta["trex_npu_op"] = OP
        add.replace_all_uses_with(call)
        _erase_dead(graph, [add, *nodes])
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count
