"""The save-or-recompute problem of one joint forward+backward graph, as data.

The partitioner (`torch._functorch.partitioners.default_partition`) saves every forward value the
backward reads, except values tagged `node.meta["recompute"] = MUST_RECOMPUTE`: those the backward
recomputes from their inputs, which are saved or themselves recomputed. So a choice is a set of
forward nodes to tag, and it is valid when no tagged node is random (its replay would draw new
numbers) or impure. This module reads that problem off the graph:

* `ForwardValue`: one forward node with its output bytes (by storage, so views of one buffer are
  counted once and views of a graph input cost nothing), its recompute time (`node.meta["cost"]`,
  written by `trex.cost_model.annotate`), whether it may be recomputed, and what it reads.
* `Block`: the forward values of one decoder layer (found from `nn_module_stack`: the module path
  up to the first list index, e.g. `model.layers.3`) or of everything outside the layers.
* `Kind`: blocks with the same structure (same ops, shapes and wiring, position by position). The
  solver decides once per kind and the answer is tiled over its blocks (`Kind.blocks`), so the
  problem grows with the number of distinct layers, not with depth.

A value read by another block (a layer's output is the next layer's input) is decided by its own
block, like any other: the reader records where it lives (`ExternalValue.home`) and the solver
requires it to be available (saved or recomputed by its home kind) wherever a reader recomputes from
it. Its bytes are charged once, to its home; graph inputs cost nothing (the caller holds them).
"""

from __future__ import annotations

import operator
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._functorch.partitioners import _has_tag_is_forward, _is_fwd_seed_offset, _is_primal, _is_tangent

OUTSIDE_LAYERS = "outside the decoder layers"
_LAYER_PATH = re.compile(r"^(.*?\.\d+)(?:\.|$)")


@dataclass
class ForwardValue:
    """One forward node of a block, as the solver sees it."""

    node: fx.Node
    position: int  # index within its block: the key that tiles a decision over blocks of a kind
    storage: int  # storage group inside the block (views of one buffer share a group)
    storage_bytes: int  # bytes of that storage; 0 when it belongs to a graph input (held by the caller)
    seconds: float  # time to recompute it (node.meta["cost"].time_s)
    priced: bool  # False: `seconds` is a bandwidth estimate (the cost model has no formula for the op)
    is_tensor: bool  # only tensors can be saved (a tuple-returning op is recomputed or read via getitem)
    recomputable: bool
    why_not_recomputable: str
    backward_reads: bool  # a backward node (or a gradient output) reads it directly
    replay_bytes: int = 0  # saved when recomputed: the RNG state a seeded op replays (the partitioner saves it)
    inputs: list[int] = field(default_factory=list)  # positions (in this block) of the values it reads
    external_inputs: list[int] = field(default_factory=list)  # indices into Block.external


@dataclass
class ExternalValue:
    """A value a block reads from outside it (a graph input or another block's value)."""

    node: fx.Node
    storage_bytes: int
    is_input: bool  # a primal: already held by the caller, saving it costs nothing
    home: tuple[Block, int] | None = None  # the block that computes it and its position there


@dataclass
class Block:
    name: str
    values: list[ForwardValue] = field(default_factory=list)
    external: list[ExternalValue] = field(default_factory=list)

    def signature(self) -> tuple:
        """Equal for blocks the same decision fits, position by position."""
        parts: list[Any] = [tuple((e.storage_bytes, e.is_input, _shape_of(e.node)) for e in self.external)]
        for v in self.values:
            parts.append(
                (
                    v.replay_bytes,
                    str(v.node.target),
                    _shape_of(v.node),
                    v.storage,
                    v.storage_bytes,
                    v.recomputable,
                    v.backward_reads,
                    tuple(v.inputs),
                    tuple(v.external_inputs),
                    _constant_args(v.node),
                )
            )
        return tuple(parts)


@dataclass
class Kind:
    """Blocks that share one structure; `blocks[0]` is the one the solver reads."""

    name: str
    blocks: list[Block]

    @property
    def count(self) -> int:
        return len(self.blocks)

    @property
    def representative(self) -> Block:
        return self.blocks[0]


@dataclass
class RecomputeProblem:
    kinds: list[Kind]
    forward_names: set[str]

    @property
    def save_everything_bytes(self) -> int:
        """Saved bytes with nothing recomputed: every value the backward reads, each storage once."""
        return sum(k.count * save_everything_bytes(k.representative) for k in self.kinds)


def save_everything_bytes(block: Block) -> int:
    groups = {v.storage: v.storage_bytes for v in block.values if v.backward_reads and v.is_tensor}
    return sum(groups.values())


def forward_node_names(joint: fx.GraphModule) -> set[str]:
    """The forward nodes, by the rule `default_partition` uses: up to the last forward-tagged node.
    A joint graph without partitioner tags (loaded back from a dump, as a reproducer does) falls
    back to the nodes that depend on no tangent."""
    if not any(_has_tag_is_forward(n) for n in joint.graph.nodes):
        backward: set[fx.Node] = set()
        for node in joint.graph.nodes:
            if _is_tangent(node) or any(a in backward for a in node.all_input_nodes):
                backward.add(node)
        return {n.name for n in joint.graph.nodes if n not in backward and n.op != "output"}
    last = None
    for node in joint.graph.nodes:
        if _has_tag_is_forward(node) or _is_primal(node) or _is_fwd_seed_offset(node):
            last = node
    names = set()
    for node in joint.graph.nodes:
        if node.op != "output" and not _is_tangent(node):
            names.add(node.name)
        if node is last:
            break
    return names


def layer_of(node: fx.Node) -> str:
    """The decoder layer a forward node belongs to (module path up to the first list index)."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in stack.values():
        path = path.replace("[", ".").replace("]", "").replace("'", "")
        for prefix in ("L.self.", "L.fn."):
            path = path.removeprefix(prefix)
        match = _LAYER_PATH.match(path)
        if match:
            return match.group(1)
    return OUTSIDE_LAYERS


def _shape_of(node: fx.Node) -> Any:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (tuple(int(s) if isinstance(s, int) else str(s) for s in value.shape), str(value.dtype))
    if isinstance(value, (tuple, list)):
        return tuple(_shape_of_value(v) for v in value)
    return type(value).__name__


def _shape_of_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype))
    return type(value).__name__


def _constant_args(node: fx.Node) -> tuple:
    return tuple(repr(a) for a in (*node.args, *node.kwargs.values()) if not isinstance(a, (fx.Node, list, tuple)))


def _is_random(node: fx.Node) -> bool:
    """Seeded-random ops, except those called with a zero dropout probability (SDPA with
    dropout_p=0 carries the tag but draws nothing)."""
    tags = getattr(node.target, "tags", ())
    if torch.Tag.nondeterministic_seeded not in tags:
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return True
    values = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    values.update(zip((a.name for a in schema.arguments), node.args))
    values.update(node.kwargs)
    probability = values.get("dropout_p")
    return not (isinstance(probability, (int, float)) and probability == 0)


def _why_not_recomputable(node: fx.Node) -> str:
    if node.op != "call_function":
        return "a graph input"
    if _is_random(node):
        return "random: recomputing it would draw different numbers"
    if node.target is operator.getitem:
        return ""
    if node.is_impure(impure_random=False):
        return "has side effects"
    namespace = getattr(node.target, "namespace", "")
    if namespace in ("_c10d_functional", "c10d_functional"):
        return "a collective: recomputing it would communicate again"
    return ""


def _storage_key(value: Any) -> Any:
    try:
        from torch.multiprocessing.reductions import StorageWeakRef

        return StorageWeakRef(value.untyped_storage())
    except Exception:  # noqa: BLE001 - symbolic or storage-less tensors: their own group
        return None


def _storage_bytes(value: torch.Tensor) -> int:
    try:
        return int(value.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - unbacked sizes: the tensor's own bytes
        return int(value.numel()) * value.dtype.itemsize


def _seconds(node: fx.Node, device) -> tuple[float, bool]:
    cost = node.meta.get("cost")
    if cost is not None and cost.priced:
        return float(cost.time_s), True
    value = node.meta.get("val")
    nbytes = float(value.numel() * value.dtype.itemsize) if isinstance(value, torch.Tensor) else 0.0
    if node.target is operator.getitem or nbytes == 0.0:
        return 0.0, cost is not None and cost.priced
    # no formula: price it as a kernel that reads and writes its output once (memory bound)
    return float(device.op_time(str(node.target), "pointwise", 0.0, 2.0 * nbytes)), False


def build_problem(joint: fx.GraphModule, device) -> RecomputeProblem:
    """Read the save/recompute problem off an annotated joint graph (see the module docstring)."""
    forward = forward_node_names(joint)
    output = next(iter(joint.graph.find_nodes(op="output")))
    fw_outputs = _forward_outputs(joint, forward)
    input_storages = {
        _storage_key(n.meta.get("val"))
        for n in joint.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    input_storages.discard(None)

    blocks: OrderedDict[str, Block] = OrderedDict()
    where: dict[fx.Node, tuple[Block, int]] = {}
    for node in joint.graph.nodes:
        if node.name not in forward or node.op not in ("call_function",):
            continue
        value = node.meta.get("val")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float)):
            continue  # sizes: the partitioner saves them separately, for free
        name = layer_of(node) if node.meta.get("nn_module_stack") else _inherited_layer(node, where)
        block = blocks.setdefault(name, Block(name))
        where[node] = (block, len(block.values))
        block.values.append(_value(node, len(block.values), forward, output, fw_outputs, device))

    for block in blocks.values():
        storage_groups: dict[Any, int] = {}
        external_index: dict[fx.Node, int] = {}
        for v in block.values:
            key = _storage_key(v.node.meta.get("val")) if v.is_tensor else None
            if key is None:
                v.storage = len(storage_groups) + 10**9 + v.position  # a group of its own
            else:
                v.storage = storage_groups.setdefault(key, len(storage_groups))
            if key is not None and key in input_storages:
                v.storage_bytes = 0
            for arg in v.node.all_input_nodes:
                if arg in where and where[arg][0] is block:
                    v.inputs.append(where[arg][1])
                elif arg.name in forward and _carries_data(arg):
                    if arg not in external_index:
                        external_index[arg] = len(block.external)
                        value = arg.meta.get("val")
                        is_input = arg.op == "placeholder" or _storage_key(value) in input_storages
                        nbytes = 0 if is_input or not isinstance(value, torch.Tensor) else _storage_bytes(value)
                        block.external.append(ExternalValue(arg, nbytes, is_input))
                    v.external_inputs.append(external_index[arg])
        _renumber_storages(block)
    for block in blocks.values():
        for x in block.external:
            if not x.is_input and x.node in where:
                x.home = where[x.node]
    return RecomputeProblem(_kinds(list(blocks.values())), forward)


def _inherited_layer(node: fx.Node, where: dict) -> str:
    """A node traced without a module stack (a decomposition's helper op) belongs with what it reads."""
    for arg in node.all_input_nodes:
        if arg in where:
            return where[arg][0].name
    return OUTSIDE_LAYERS


def _carries_data(node: fx.Node) -> bool:
    return not isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float))


def _forward_outputs(joint: fx.GraphModule, forward: set[str]) -> set[fx.Node]:
    """Output-node arguments computed in the forward (the user-visible outputs, gradients excluded)."""
    output = next(iter(joint.graph.find_nodes(op="output")))
    descs = output.meta.get("desc")
    leaves = [a for a in torch.utils._pytree.tree_leaves(output.args) if isinstance(a, fx.Node)]
    if descs is not None:
        from torch.utils._pytree import tree_leaves

        flat_descs = tree_leaves(descs)
        if len(flat_descs) == len(leaves):
            return {n for n, d in zip(leaves, flat_descs) if "Grad" not in type(d).__name__}
    return {n for n in leaves if n.name in forward}


def _value(
    node: fx.Node, position: int, forward: set[str], output: fx.Node, fw_outputs: set[fx.Node], device
) -> ForwardValue:
    value = node.meta.get("val")
    is_tensor = isinstance(value, torch.Tensor)
    why = _why_not_recomputable(node)
    backward_reads = any(u.name not in forward and u.op != "output" for u in node.users) or (
        output in node.users and node not in fw_outputs
    )
    seconds, priced = _seconds(node, device)
    replay = (
        _rng_state_bytes(node)
        if not why and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
        else 0
    )
    return ForwardValue(
        node,
        position,
        0,
        _storage_bytes(value) if is_tensor else 0,
        seconds,
        priced,
        is_tensor,
        not why,
        why,
        backward_reads,
        replay,
    )


def _rng_state_bytes(node: fx.Node) -> int:
    """Bytes of the RNG state `functionalize_rng_ops` saves to replay a recomputed seeded op (the CPU
    generator's whole state; a philox seed and offset elsewhere)."""
    values = [v for v in (node.meta.get("val"),) if isinstance(v, torch.Tensor)]
    values += (
        [v for v in (node.meta.get("val") or ()) if isinstance(v, torch.Tensor)]
        if isinstance(node.meta.get("val"), tuple)
        else []
    )
    device = values[0].device.type if values else "cpu"
    return int(torch.get_rng_state().numel()) if device in ("cpu", "meta") else 16


def _renumber_storages(block: Block) -> None:
    """Storage groups numbered 0.. in order of first appearance (part of the block signature)."""
    numbers: dict[int, int] = {}
    for v in block.values:
        v.storage = numbers.setdefault(v.storage, len(numbers))


def _kinds(blocks: list[Block]) -> list[Kind]:
    by_signature: OrderedDict[tuple, list[Block]] = OrderedDict()
    for block in blocks:
        by_signature.setdefault(block.signature(), []).append(block)
    kinds = []
    for members in by_signature.values():
        names = [b.name for b in members]
        label = (
            names[0]
            if len(names) == 1
            else f"{names[0]} (+{len(names) - 1} alike: {', '.join(n.rsplit('.', 1)[-1] for n in names[1:])})"
        )
        kinds.append(Kind(label, members))
    return kinds
