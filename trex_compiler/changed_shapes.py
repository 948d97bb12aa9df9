"""Re-propagate FakeTensor values only where a pass changed the graph.

The pass manager checks every pass that modified the graph by recomputing `node.meta["val"]` and comparing
the graph's output shapes and dtypes. Recomputing every node (`FakeTensorProp` over the whole graph) was
three quarters of trex's pass time on tiny DeepSeek-V4 (four full propagations of 2,500-6,700-node graphs
for passes that rewrote a few hundred nodes; bench/RESULTS.md 11, tenth session), and it is the same work
for every node the pass did not touch.

So the manager records each node's target, args and kwargs before the pass (`NodeStates`) and after it
recomputes, in graph order, exactly the nodes that are new, whose target/args/kwargs changed, or that
read a recomputed value whose shape, dtype, stride, offset or device changed, or that alias one (a view
of a recomputed tensor: its value must share the new tensor's storage, as a full propagation gives it;
Inductor's reinplacing reads these storages). Every other node keeps its value, which is what a full
propagation would compute again: its op and inputs are unchanged. The check is as strict as before on
what a pass can break through the graph; a pass that edits `meta["val"]` of a node it did not rewrite is
not re-derived (no pass in trex does; `check_graph` without states still propagates every node).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx


class NodeStates:
    """Each node's (target, args, kwargs) objects at one moment: fx replaces a node's args tuple and kwargs
    dict whenever they change (`Node.args = ...`, `replace_all_uses_with`), so an identity check finds every
    edited node without comparing contents."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self._states = {node: (node.target, node.args, node.kwargs) for node in gm.graph.nodes}

    def changed(self, node: fx.Node) -> bool:
        state = self._states.get(node)
        return state is None or state[0] is not node.target or state[1] is not node.args or state[2] is not node.kwargs


def _tensors(value: Any) -> list[torch.Tensor]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [item for item in items if isinstance(item, torch.Tensor)]


def _same_layout(a: Any, b: Any) -> bool:
    """Whether two node values describe the same tensors (shape, dtype, stride, offset, device) and scalars."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.device == b.device
            and tuple(a.shape) == tuple(b.shape)
            and tuple(a.stride()) == tuple(b.stride())
            and a.storage_offset() == b.storage_offset()
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return type(a) is type(b) and (a is b or a == b)


def _storages(value: Any) -> set:
    from torch.multiprocessing.reductions import StorageWeakRef

    return {StorageWeakRef(t.untyped_storage()) for t in _tensors(value)}


def propagate_changed_shapes(gm: fx.GraphModule, before: NodeStates, mode: Any) -> int:
    """Recompute `meta["val"]` of the nodes a pass changed and of those their change reaches (see the
    module docstring), under the graph's FakeTensorMode `mode`. Returns how many nodes were recomputed."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    interpreter = FakeTensorProp(gm, mode)
    reached: set[fx.Node] = set()
    recomputed = 0
    with mode:
        for node in gm.graph.nodes:
            if node.op == "output":  # its value is the tuple of the outputs' values, as a full propagation sets it
                interpreter.run_node(node)
                continue
            if node.op != "placeholder" and (node in reached or before.changed(node) or "val" not in node.meta):
                old = node.meta.get("val")
                interpreter.env[node] = interpreter.run_node(node)
                recomputed += 1
                if not _same_layout(old, node.meta.get("val")):
                    reached.update(node.users)
                else:
                    old_storages = _storages(old)
                    if old_storages:
                        reached.update(u for u in node.users if _storages(u.meta.get("val")) & old_storages)
            else:
                interpreter.env[node] = node.meta["val"]
    return recomputed
