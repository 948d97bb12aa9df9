"""Values a code generator would recompute in every kernel that reads them, computed once when that is cheaper.

Inductor lowers a pointwise value as an expression and inlines it into each consumer's loop; it realizes it into
a buffer only when a heuristic says so (`StorageBox.should_realize_on_reuse`, torch/_inductor/ir.py: on CPU a
multi-reader value whose expression uses exp/log/sigmoid/tanh, or one past an op-count or read-count
threshold). A small value read *broadcast* escapes all of these: the rotary embedding's cos and sin tables
(`[1, S, D]`, from `positions x inv_freq -> cat -> cos/sin -> x scaling`) are read by the query and key products
of every layer as `[B, H, S, D]`, so every element of every one of those kernels - forward, and backward where
the partitioner recomputes the tables - evaluates a cos or sin, the frequency product and the `cat`'s index
select. On tiny Qwen3-MoE (fp32, 2-vCPU EPYC) computing them once took 5-7% off the whole training step
(bench/RESULTS.md section 11, sixteenth session).

Candidates are pointwise values some reader reads broadcast (more elements than the value has, through views), that no
graph output or extern op reads directly (the backend makes those a buffer anyway), and whose inlined chain -
the single-reader pointwise, copy and view producers back to the first value that is a buffer anyway (an input,
a GEMM, a reduction, a value already marked) or is shared - holds a link the cost model prices like a transcendental (>= 4 FLOPs per
element: exp/log, sin/cos at ~20 as a range reduction and a polynomial, a non-integral power; `x ** 3` is two
multiplies). Cheap arithmetic is what a code generator is right to inline, and leaving it alone keeps the graphs
the backend fuses as they were. Copies (`cat`, `clone`) are not marked: Inductor lowers a `cat` as a buffer its
inputs' kernels write in most forms, and marking tiny DeepSeek-V4's rotated-key `cat`s (read by every query head)
measured 3% slower in bf16 and no faster in fp32 (bench/RESULTS.md section 11, sixteenth session). The pass prices both ways with the cost model (the op formulas and the target's
device profile):

* inlined: every element each reader computes evaluates the chain, `reads x chain FLOPs per element` at the
  device's vector rate. The chain counted stops at producers other nodes read too (the backend may realize a
  shared value by itself), which keeps this side low; it is high where the backend fuses two readers into one
  loop that shares one evaluation (readers in different layers, separated by GEMMs, cannot share one);
* once: one kernel computes the value (`numel x chain FLOPs`), writes it and each reader reads it
  (`numel x itemsize x (1 + readers)` bytes through the device's memory model, one kernel launch).

Where once is cheaper it inserts `trex.compute_once(value)` (trex_compiler/ops/compute_once.py) and points the
value's readers at it; the leading backend's lowering realizes it
(Inductor: backends/inductor/compute_once_lowering.py). Each candidate's decision, with both predicted times, is
in the dump. The pass runs on the partitioned forward and backward graphs (stage "partitioned"), so the
partitioner's save-or-recompute choice is made on the graph without the marks; it runs only when the leading
backend declares `inlines_pointwise_into_consumers` (or `ComputeOnce(force=True)`).

Values are unchanged: the op's value is its input's (a copy outside a code generator).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import fx

import trex.ops.compute_once  # noqa: F401 - defines torch.ops.trex.compute_once
from trex.pass_manager import Decision, PassContext, PassResult

# PassContext.options key the compile driver sets: does the leading backend inline pointwise values?
OPTION = "inlines_pointwise_into_consumers"
# op-formula kinds a code generator inlines into a consumer's loop (a chain link) and those that read their
# inputs element by element inside their own loop (a consumer that recomputes an inlined input)
INLINED_KINDS = frozenset({"pointwise", "copy", "view"})
COMPUTING_READER_KINDS = frozenset({"pointwise", "copy", "reduction", "norm", "softmax"})
# what the mark inherits from the value it marks: its value, source line and module (regional compilation
# groups nodes by module)
_COPIED_META = ("val", "tensor_meta", "stack_trace", "nn_module_stack", "fwd_nn_module_stack")


def _numel(node: fx.Node) -> int:
    value = node.meta.get("val")
    return value.numel() if isinstance(value, torch.Tensor) else 0


def _formula(node: fx.Node):
    from trex.cost_model.op_formulas import formula_for

    return formula_for(node.target) if node.op == "call_function" else None


def _kind(node: fx.Node) -> str | None:
    formula = _formula(node)
    return formula.kind if formula is not None else None


def inlined_chain(value: fx.Node) -> list[fx.Node]:
    """The nodes a code generator surely inlines when it inlines `value`: `value` and its pointwise, copy and view
    producers read by nothing else, back to values that are buffers anyway (inputs, GEMMs, reductions, marked
    values) or that other nodes read too (a shared producer the backend may realize by itself: counting it as a
    buffer keeps the inlined price a lower bound, so a mark is not made on a recomputation that may not happen)."""
    chain: list[fx.Node] = []
    stack, seen = [value], {value}
    while stack:
        node = stack.pop()
        chain.append(node)
        for producer in node.all_input_nodes:
            if producer in seen or producer.target is torch.ops.trex.compute_once.default:
                continue
            if (
                _kind(producer) in INLINED_KINDS
                and len(producer.users) == 1
                and isinstance(producer.meta.get("val"), torch.Tensor)
            ):
                seen.add(producer)
                stack.append(producer)
    return chain


def computing_readers(value: fx.Node) -> list[tuple[fx.Node, int]]:
    """The nodes that read `value` (through views) element by element in their own loops, each with the
    number of elements it computes (its output's, or the broadcast view it reads, whichever is larger)."""
    readers: list[tuple[fx.Node, int]] = []
    stack = [(value, _numel(value))]
    while stack:
        node, read = stack.pop()
        for user in node.users:
            kind = _kind(user)
            if kind == "view":
                stack.append((user, max(read, _numel(user))))
            elif kind in COMPUTING_READER_KINDS:
                readers.append((user, max(read, _numel(user))))
    return readers


# a link priced like the op formulas' exp/log class or above (trig, a general power) makes recomputation costly
TRANSCENDENTAL_FLOPS_PER_ELEMENT = 4.0


def flops_per_element(node: fx.Node, cluster) -> float:
    """What the cost model prices one element of `node` at (0 for unpriced and empty nodes)."""
    from trex.cost_model.annotate import annotate_node

    cost = annotate_node(node, cluster)
    numel = _numel(node)
    return cost.flops / numel if cost is not None and cost.priced and numel else 0.0


class ComputeOnce:
    """Invariant established (when the leading backend inlines pointwise values, or `force=True`): every
    pointwise value whose inlined chain holds a transcendental op and whose recomputation in its readers the
    cost model prices above computing it once is read through `trex.compute_once`. The values computed are
    unchanged. Each insertion consumes one unit of fuel.
    """

    name: ClassVar[str] = "compute_once"
    # the graphs that run: the partitioner decides what the backward recomputes before values are marked
    stage: ClassVar[str] = "partitioned"

    def __init__(self, force: bool = False):
        self.force = force

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        if not (self.force or ctx.options.get(OPTION, False)):
            return PassResult(
                modified=False,
                decisions=[
                    Decision(
                        "skip",
                        "graph",
                        "the leading backend computes each value once by itself (it does not declare "
                        "inlines_pointwise_into_consumers)",
                    )
                ],
            )
        from trex.cost_model.annotate import cluster_of

        cluster = cluster_of(ctx.target)
        device = cluster.device
        graph = gm.graph
        decisions: list[Decision] = []
        inserted = 0
        for node in list(graph.nodes):
            value = node.meta.get("val")
            if _kind(node) != "pointwise" or not isinstance(value, torch.Tensor) or value.numel() == 0:
                continue
            if any(user.op == "output" or _kind(user) not in (*COMPUTING_READER_KINDS, "view") for user in node.users):
                continue  # a buffer anyway: the backend realizes values a graph output or an extern op reads
            readers = computing_readers(node)
            reads = sum(elements for _, elements in readers)
            if not any(elements > value.numel() for _, elements in readers):
                continue  # no reader broadcasts it: the backend's own reuse heuristics see every read
            chain = inlined_chain(node)
            link_flops = [flops_per_element(link, cluster) for link in chain]
            if max(link_flops) < TRANSCENDENTAL_FLOPS_PER_ELEMENT:
                continue  # cheap arithmetic: what a code generator is right to inline
            chain_flops = sum(link_flops)
            inlined_s = reads * chain_flops / device.vector_flops()
            traffic = value.numel() * value.element_size() * (1 + len(readers))
            once_s = device.elementwise_time(value.numel() * chain_flops, traffic, 1)
            data = {
                "reads": reads,
                "numel": value.numel(),
                "readers": len(readers),
                "chain_ops": len(chain),
                "chain_flops_per_element": chain_flops,
                "inlined_s": inlined_s,
                "once_s": once_s,
            }
            if once_s >= inlined_s:
                decisions.append(
                    Decision(
                        "keep_inlined",
                        node.name,
                        f"recomputing it in its {len(readers)} readers ({inlined_s * 1e6:.2f} us) costs no more than "
                        f"a buffer ({once_s * 1e6:.2f} us) on {device.name}",
                        data,
                    )
                )
                continue
            if not ctx.fuel.take():
                break
            with graph.inserting_after(node):
                once = graph.call_function(torch.ops.trex.compute_once.default, (node,))
            once.meta.update({k: v for k, v in node.meta.items() if k in _COPIED_META})
            node.replace_all_uses_with(once, delete_user_cb=lambda user, mark=once: user is not mark)
            inserted += 1
            decisions.append(
                Decision(
                    "compute_once",
                    node.name,
                    f"its {len(chain)}-op chain ({chain_flops:g} FLOPs per element, with a transcendental op) "
                    f"is read {reads / value.numel():.0f}x per element by {len(readers)} readers: computed once "
                    f"{once_s * 1e6:.2f} us, inlined {inlined_s * 1e6:.2f} us on {device.name}",
                    data,
                )
            )
        if inserted:
            graph.lint()
            gm.recompile()
        return PassResult(modified=bool(inserted), decisions=decisions)
