"""Cost-driven fusion: group producer -> consumer chains of memory-bound ops (pointwise, reductions,
norms, softmax) where the cost model says fusing saves memory traffic, and tag each group so
backends receive it whole.

A fused chain does not write its intermediate values to memory and read them back: each one saves
(1 + users) x its bytes. The pass walks the graph in order and merges a producer's group into its
consumer's group when (a) both are memory-bound under the cost model, (b) the producer is the only
value leaving its group and every user of it is already in the consumer's group (so a group has one
output path and merging can never create a cycle), and (c) the saving under the target's memory
model is at least `fusion_min_saving_s` (PassContext.options; default: one kernel launch is worth it).
GEMMs, attention, collectives and trex's MoE ops are never fused here (a backend may still fuse
epilogues into its GEMMs itself).

Every merge is a Decision with the bytes and the predicted seconds it saves; every node of a group
of two or more carries `node.meta["fusion_group"]` (a name) and every priced node `node.meta["cost"]`.
The lowering gives a group to the first backend that supports all of its nodes.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

import torch
from torch import fx

from trex.pass_manager import Decision, PassContext, PassResult

MEMORY_BOUND_KINDS = frozenset({"pointwise", "reduction", "norm", "softmax", "copy"})
MAX_GROUP_NODES = 64  # past this a generated kernel's register/cache pressure outweighs one more saved buffer


def _output_bytes(node: fx.Node) -> int:
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class CostDrivenFusion:
    """Invariant established: nodes sharing `meta["fusion_group"]` form a connected, single-output,
    cycle-free chain of memory-bound ops whose fusion the cost model prices as a saving. The graph's
    nodes and edges are unchanged (grouping is a decision for the backends, not a rewrite).
    """

    name: ClassVar[str] = "cost_driven_fusion"

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        from trex.cost_model.annotate import annotate_node, cluster_of

        cluster = cluster_of(ctx.target)
        device = cluster.device
        min_saving_s = float(ctx.options.get("fusion_min_saving_s", 0.0))
        memory_bound: set[fx.Node] = set()
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            cost = node.meta.get("cost")
            if cost is None:
                cost = annotate_node(node, cluster)
                node.meta["cost"] = cost
            if (
                cost is not None
                and cost.priced
                and cost.kind in MEMORY_BOUND_KINDS
                and isinstance(node.meta.get("val"), torch.Tensor)
            ):
                memory_bound.add(node)

        group: dict[fx.Node, int] = {}
        members: dict[int, list[fx.Node]] = {}
        ids = itertools.count()
        decisions: list[Decision] = []
        for node in gm.graph.nodes:
            if node not in memory_bound:
                continue
            group[node] = next(ids)
            members[group[node]] = [node]
            for producer in dict.fromkeys(node.all_input_nodes):
                if producer not in memory_bound or group[producer] == group[node]:
                    continue
                if any(group.get(user) != group[node] for user in producer.users):
                    continue  # its value leaves the chain anyway: nothing saved, and merging could form a cycle
                saved_bytes = (1 + len(producer.users)) * _output_bytes(producer)
                saved_s = device.memory_time(saved_bytes, 1)  # traffic plus the launch the fused kernel saves
                size = len(members[group[producer]]) + len(members[group[node]])
                subject = f"{producer.name} -> {node.name}"
                data = {"saved_bytes": saved_bytes, "saved_s": saved_s, "group_nodes": size}
                if saved_s < min_saving_s or size > MAX_GROUP_NODES:
                    why = (
                        f"group would have {size} nodes (limit {MAX_GROUP_NODES})"
                        if size > MAX_GROUP_NODES
                        else f"saves {saved_s * 1e6:.2f} us < {min_saving_s * 1e6:.2f} us"
                    )
                    decisions.append(Decision("keep_apart", subject, why, data))
                    continue
                if not ctx.fuel.take():
                    continue
                absorbed = members.pop(group[producer])
                for member in absorbed:
                    group[member] = group[node]
                members[group[node]] = absorbed + members[group[node]]
                decisions.append(
                    Decision(
                        "fuse",
                        subject,
                        f"{producer.name}'s {saved_bytes} bytes stay in registers/cache: "
                        f"saves {saved_s * 1e6:.2f} us on {device.name}",
                        data,
                    )
                )

        fused_groups = 0
        for nodes in members.values():
            if len(nodes) > 1:
                name = f"fusion_{ctx.graph_id}_{fused_groups}"
                fused_groups += 1
                for member in nodes:
                    member.meta["fusion_group"] = name
        return PassResult(modified=False, decisions=decisions)
