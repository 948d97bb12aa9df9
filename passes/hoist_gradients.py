"""Weight gradients of grouped GEMMs computed as soon as their operands exist, when that lowers the backward's live bytes.

A backward graph returns every parameter gradient: a grouped GEMM's weight gradient (the MoE experts'
`[G, K, N]` reduction) lives from the GEMM to the end of the backward wherever it runs. Its operands - the
expert activations and output gradients of one layer - die at their last reader. AOTAutograd and the
decompositions emit each layer's expert backward as data gradients first, weight gradients last, so the
operands of the last weight gradient (e.g. the down projection's: the expert-output gradient and the
recomputed SwiGLU activation) stay alive across the other GEMMs of that layer, including the gate/up weight
gradient, whose own output and per-expert fp32 upcasts (`trex.extern_aten_grouped_mm`) make it the step's
memory peak on the tiny bf16 DeepSeek-V3 (bench/RESULTS.md section 11, tenth and eleventh sessions). Inductor
schedules an extern call where the graph puts it (its peak-memory reordering does not move these), so the
order has to be right in the graph it receives.

Only the GEMMs that make working copies are moved: a low-precision `trex.extern_aten_grouped_mm`, which runs
one group at a time on fp32 upcasts of its operands (`grouped_mm_on_group_upcasts`), so that while it runs the
process also holds a group's fp32 operands and product - the bytes that made it the step's peak. An fp32 weight
gradient (`trex.extern_grouped_mm_weight_grad`, `aten._grouped_mm`) allocates only its output; moving it only
moves its operands' and output's bytes, which the measured peaks did not need (tiny Qwen3-MoE fp32: 2.33 MiB
unmoved, 2.27 moved, torch.compile 2.41), and the moved order cost the cold compile: Inductor no longer fused
the layers' backward pointwise chains alike, so it built 21 C++ kernels for the backward instead of 15 (+3.5 s
of the first call; bench/RESULTS.md section 11, twelfth session).

The pass moves each such GEMM (with the single-use views of its operands) to just after the last producer
of its operands, when that lowers the live bytes of the graph between the two positions: the bytes of
operands whose last reader it then is are freed earlier, its output is allocated earlier. Live bytes are
simulated on the graph as it runs (each value from its producer to its last reader, views sharing their
base's bytes, inputs freed at their last reader as AOTAutograd's boxed call does); a move is kept only if the
highest live bytes over the moved interval do not rise and their sum over the interval's nodes falls. (The
highest point of the graph's own simulation is often an unfused pointwise intermediate next to the operands'
producer, the same in both orders; the code generator fuses those away, and what is left between the two
positions - the other GEMMs of the layer - then holds fewer bytes at every step.) Nothing is computed differently: the same nodes, the same operands, an
order the data dependencies allow.
"""

from __future__ import annotations

import operator
from typing import ClassVar

import torch
from torch import fx

from trex.pass_manager import Decision, PassContext, PassResult

# The grouped GEMMs whose result is a weight gradient (the reduction over a group's rows): opaque extern
# calls to a code generator, which runs them where the graph puts them.
GROUPED_GEMMS = frozenset(
    {
        torch.ops.trex.extern_aten_grouped_mm.default,
        torch.ops.trex.extern_grouped_mm_weight_grad.default,
        torch.ops.trex.grouped_mm_weight_grad.default,
        torch.ops.aten._grouped_mm.default,
    }
)


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _is_view(node: fx.Node) -> bool:
    """The node's output shares its first tensor input's storage (an aliasing op, or a tuple element)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None and node.all_input_nodes)


def _storage_bases(nodes: list[fx.Node]) -> dict[fx.Node, fx.Node]:
    """Each node's storage owner: itself, or for a view the owner of the value it views."""
    base: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        base[node] = base.get(node.all_input_nodes[0], node) if _is_view(node) else node
    return base


def live_bytes(nodes: list[fx.Node]) -> list[int]:
    """Bytes alive while each node runs, in this order: every value owned by a node (views own nothing) from
    its producer (inputs: from the start) to its last reader through any of its views; the graph's outputs to
    the end. Each entry counts the node's own output and its operands."""
    base = _storage_bases(nodes)
    position = {node: i for i, node in enumerate(nodes)}
    last = {}
    for node in nodes:
        for arg in node.all_input_nodes:
            owner = base.get(arg, arg)
            last[owner] = len(nodes) if node.op == "output" else max(last.get(owner, -1), position[node])
    frees: list[int] = [0] * (len(nodes) + 1)
    allocs: list[int] = [0] * len(nodes)
    start = 0
    for node in nodes:
        if base[node] is not node or node.op == "output":
            continue
        size = _tensor_bytes(node.meta.get("val"))
        end = last.get(node, position[node])
        if node.op == "placeholder":
            start += size
        else:
            allocs[position[node]] = size
        frees[end] += size
    curve, alive = [], start
    for i in range(len(nodes)):
        alive += allocs[i]
        curve.append(alive)
        alive -= frees[i]
    return curve


def _carried_views(node: fx.Node) -> list[fx.Node]:
    """The operands of `node` that are views read by nothing else (they move with it), innermost first."""
    carried: list[fx.Node] = []

    def visit(arg: fx.Node) -> None:
        if _is_view(arg) and len(arg.users) == 1 and arg.target is not operator.getitem:
            visit(arg.all_input_nodes[0])
            carried.append(arg)

    for arg in node.all_input_nodes:
        visit(arg)
    return carried


def makes_working_copies(node: fx.Node) -> bool:
    """The grouped GEMM runs on fp32 working copies of its operands, one group at a time (a low-precision
    `trex.extern_aten_grouped_mm`): what the pass moves (see the module docstring)."""
    if node.target is not torch.ops.trex.extern_aten_grouped_mm.default:
        return False
    values = [a.meta.get("val") for a in node.args[:2] if isinstance(a, fx.Node)]
    return any(isinstance(v, torch.Tensor) and v.dtype != torch.float32 for v in values)


class HoistGradients:
    """Invariant established: in a backward graph, no grouped-GEMM weight gradient that makes working copies
    (`makes_working_copies`; a node every reader of which is the graph's output) runs later than the last producer of its operands when running it there
    does not raise the simulated live bytes anywhere in the interval between the two positions and lowers
    their sum. The graph computes the same
    nodes on the same operands; only their order changes. Each move consumes one unit of fuel.
    """

    name: ClassVar[str] = "hoist_gradients"
    # the graphs that run: which values a backward holds is decided by the partition before it
    stage: ClassVar[str] = "partitioned"

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        if ctx.phase != "backward":
            return PassResult(modified=False)
        graph = gm.graph
        output = next(n for n in graph.nodes if n.op == "output")
        decisions = []
        for node in list(graph.nodes):
            if node.target not in GROUPED_GEMMS or set(node.users) != {output}:
                continue
            if not makes_working_copies(node):
                decisions.append(
                    Decision(
                        "keep",
                        node.name,
                        "a weight gradient without working copies (fp32 operands): it allocates only its output, "
                        "and moving it changes how Inductor fuses the layers' backward kernels",
                    )
                )
                continue
            nodes = list(graph.nodes)
            position = {n: i for i, n in enumerate(nodes)}
            carried = _carried_views(node)
            sources = [a for a in node.all_input_nodes if a not in carried]
            sources += [a for view in carried for a in view.all_input_nodes if a not in carried]
            anchor = max(sources, key=position.__getitem__)
            old = position[node]
            if position[anchor] + len(carried) + 1 >= old:
                continue  # already next to its operands
            moved = [n for n in nodes if n not in (*carried, node)]
            at = moved.index(anchor) + 1
            reordered = moved[:at] + carried + [node] + moved[at:]
            before = live_bytes(nodes)[position[anchor] : old + 1]
            after = live_bytes(reordered)[at - 1 : old + 1]
            if max(after) > max(before) or sum(after) >= sum(before):
                continue
            if not ctx.fuel.take():
                break
            decisions.append(
                Decision(
                    "hoist",
                    node.name,
                    f"a weight gradient, run right after {anchor.name} (its operands' last producer): operands "
                    "read by nothing after it are freed earlier",
                    {
                        "peak_live_bytes": [max(before), max(after)],
                        "mean_live_bytes": [sum(before) // len(before), sum(after) // len(after)],
                        "moved_past_nodes": old - position[anchor] - 1 - len(carried),
                    },
                )
            )
            for n in [*carried, node]:
                anchor.append(n)
                anchor = n
        moved = any(d.action == "hoist" for d in decisions)
        if moved:
            graph.lint()
            gm.recompile()
        return PassResult(modified=moved, decisions=decisions)
