"""Ask trex's MoE ops for the routing-index dtypes torch_npu's routing ops read, before AOTAutograd.

trex's op set carries the sorted rows' source index (`perm`) as int64 and the group ends (`offsets`) as int32;
`trex.moe_experts` saves both for its backward. torch_npu's routing ops take other dtypes:
`npu_moe_init_routing_v2` returns `expanded_row_idx` as int32 (the 2.13.0 wheel's docs, `_op_plugin_docs.py`:
"数据类型支持int32"), and `npu_grouped_matmul` reads `group_list` as int64 (its meta function and docs). Lowered
after the partition, every MoE layer therefore converted the indices around the routing ops: int32 -> int64 of
`perm` after the dispatch (it is a saved value, its dtype fixed by the forward graph), int32 -> int64 of the
group ends before each backward grouped GEMM (one per backward partition that holds one). Those conversions are
not torch_npu ops and cost a kernel launch each.

So, on Dynamo's graph (`AscendBackend.prepare(..., "captured")`), every `trex.moe_experts` call is given
`perm_dtype=torch.int32, offsets_dtype=torch.int64` (trailing arguments of the op, `trex.ops.moe`): the dispatch
then produces, and the forward saves, the indices in the dtypes the torch_npu ops read, so the lowering emits no
conversion for them. The values are identical in either dtype (row indices and group ends of one routed batch are
below 2**31), so the program's meaning does not change; what runs on CPU (the emulations, or the ops' own
implementations for any node another backend takes) accepts both dtypes.
"""

from __future__ import annotations

import torch
from torch import fx

# (perm, offsets): int32 rows as npu_moe_init_routing_v2 returns them, int64 group ends as npu_grouped_matmul reads
NPU_INDEX_DTYPES = (torch.int32, torch.int64)
_ATTRIBUTES = 8  # hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation, swiglu_limit, transposed


def _is_moe_experts(node: fx.Node) -> bool:
    experts = torch.ops.trex.moe_experts
    return node.op == "call_function" and node.target in (experts, experts.default)


def request_npu_index_dtypes(gm: fx.GraphModule) -> int:
    """Give every `trex.moe_experts` call of Dynamo's graph torch_npu's index dtypes; returns how many it changed.
    A call that already names other index dtypes is an error naming the layer (two backends would disagree)."""
    changed = 0
    for node in gm.graph.nodes:
        if not _is_moe_experts(node):
            continue
        if len(node.args) < _ATTRIBUTES:
            raise ValueError(f"{node.name}: trex.moe_experts takes {_ATTRIBUTES} arguments, got {len(node.args)}")
        asked = tuple(node.args[_ATTRIBUTES:]) or tuple(node.kwargs.get(k) for k in ("perm_dtype", "offsets_dtype"))
        asked = tuple(a for a in asked if a is not None)
        if asked and asked != NPU_INDEX_DTYPES:
            raise ValueError(
                f"{node.name}: trex.moe_experts already asks for index dtypes {asked}; the Ascend backend needs "
                f"{NPU_INDEX_DTYPES} (perm, offsets). Compile it with one backend that sets them."
            )
        if asked:
            continue
        node.args = (*node.args[:_ATTRIBUTES], *NPU_INDEX_DTYPES)
        changed += 1
    if changed:
        gm.recompile()
    return changed
