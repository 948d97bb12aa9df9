"""Inline a traced function in place of one fx node: how a pass rewrites a node as other ops.

The function is traced by `make_fx` on the FakeTensor values of the inputs (so every new node carries
`meta["val"]`), its nodes are copied in before the node, and they inherit the node's provenance
(`nn_module_stack`, `stack_trace`, ...) so dumps, recompute and per-layer passes still place them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype, value.device)
    return (type(value), value)


class TraceCache:
    """The graphs one pass traced, keyed by what decides a trace: the caller's key for the function (the op
    and every constant it closes over) and each input's shape, stride, offset, dtype and device.

    Why: the layers of a model repeat, and a pass that rewrites one op per layer (the MoE primitives, four
    to sixty-one layers) traced the same function on the same shapes once per layer - most of its time.
    A copied trace's nodes carry the first trace's FakeTensor values (right shapes and dtypes, another
    layer's storages); the pass manager's check re-derives the values of every node a pass added
    (`trex.changed_shapes`), so the graph a pass hands on is as if each layer had been traced."""

    def __init__(self) -> None:
        self._graphs: dict[Any, fx.GraphModule] = {}
        self.hits = 0

    def trace(self, key: Any, fn: Callable[..., Any], fake_args: list[Any], decompositions: dict | None):
        full_key = (key, tuple(_layout(a) for a in fake_args), id(decompositions))
        if _symbolic(full_key):
            # A graph captured with dynamic shapes: its sizes are SymInts, which neither hash nor compare as
            # plain values (equal-looking sizes of two layers are guarded expressions), so it is traced afresh.
            return _trace(fn, fake_args, decompositions)
        sub = self._graphs.get(full_key)
        if sub is not None:
            self.hits += 1
            return sub
        sub = self._graphs[full_key] = _trace(fn, fake_args, decompositions)
        return sub


def _symbolic(value: Any) -> bool:
    """Whether a key holds a symbolic size or value (SymInt, SymFloat, SymBool) anywhere in its tuples."""
    if isinstance(value, tuple):
        return any(_symbolic(item) for item in value)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def symbolic_layouts(values: Any) -> bool:
    """Whether any of `values` is a symbolic value or a tensor with a symbolic size, stride or offset (a graph
    Dynamo captured with dynamic shapes)."""
    return _symbolic(tuple(_layout(v) for v in values))


def _trace(fn: Callable[..., Any], fake_args: list[Any], decompositions: dict | None) -> fx.GraphModule:
    mode = torch._guards.detect_fake_mode(fake_args)
    with mode:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*fake_args)


def inline_traced(
    gm: fx.GraphModule,
    node: fx.Node,
    fn: Callable[..., Any],
    inputs: list[fx.Node],
    inherit: Iterable[str],
    decompositions: dict | None = None,
    cache: tuple[TraceCache, Any] | None = None,
) -> Any:
    """Trace `fn(*inputs)` and copy its nodes in before `node`; returns the nodes of its outputs (same
    structure as `fn`'s result). The new nodes copy `node.meta[key]` for every key of `inherit`.
    `decompositions`: the table the graph was traced with (`PassContext.options["decompositions"]`), so
    the new nodes are in the same form as the rest. `cache`: a `TraceCache` and the key that names `fn`
    (equal keys only for functions that trace alike on equal inputs), to copy an earlier equal trace."""
    fake_args = [a.meta["val"] for a in inputs]
    if cache is not None:
        sub = cache[0].trace(cache[1], fn, fake_args, decompositions)
    else:
        sub = _trace(fn, fake_args, decompositions)
    inherit = [key for key in inherit if key in node.meta]
    env: dict[fx.Node, Any] = {}
    placeholders = iter(inputs)
    outputs = None
    with gm.graph.inserting_before(node):
        for sub_node in sub.graph.nodes:
            if sub_node.op == "placeholder":
                env[sub_node] = next(placeholders)
            elif sub_node.op == "output":
                outputs = fx.node.map_arg(sub_node.args[0], lambda n: env[n])
            elif sub_node.op == "get_attr":
                raise RuntimeError(f"the rewrite of {node.format_node()} traced a tensor constant ({sub_node.target})")
            else:
                new = gm.graph.node_copy(sub_node, lambda n: env[n])
                for key in inherit:
                    new.meta[key] = node.meta[key]
                env[sub_node] = new
    return outputs


def replace_node(gm: fx.GraphModule, node: fx.Node, outputs: Any) -> None:
    """Point every use of `node` (through its tuple outputs' getitems, or directly) at `outputs`; erase it."""
    if isinstance(outputs, (tuple, list)):
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(outputs[user.args[1]])
                gm.graph.erase_node(user)
            else:
                raise RuntimeError(f"{node.name} is used by {user.name} other than through its tuple outputs")
    else:
        node.replace_all_uses_with(outputs)
    gm.graph.erase_node(node)


def on_meta_device(gm: fx.GraphModule) -> bool:
    """True when the graph's inputs live on the meta device: it was captured to be priced (a meta capture
    of a full-size model), so rewrites that only make this machine run it faster do not apply."""
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            return value.device.type == "meta"
    return False
