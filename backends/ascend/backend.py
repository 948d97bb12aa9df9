"""`AscendBackend` ("ascend"): lowers MoE training graphs to torch_npu's fused operators.

supports(node) says yes for the nodes of the regions `patterns.find_matches` recognises in the
node's graph (matched once per graph, with every node priced on the Ascend target by
`trex.cost_model.annotate`); lower(gm) re-matches the regions inside the partition it is given,
emits the fused calls (each checked against torch_npu's schema), and returns the rewritten graph.
Without torch_npu and an NPU the fused calls are the CPU emulations (`emulation.py`), so a graph
lowered for Ascend runs here and is compared with eager.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import fx

from trex.backends.ascend import attention_before_autograd, rotary_before_autograd
from trex.backends.ascend.main_grad import PREPARED, accumulate_into_main_grads, main_grad_publish
from trex.backends.ascend.patterns import PATTERNS, Emitter, Match, Pattern, find_matches
from trex.backends.ascend.report import AscendGraphReport, describe, price_graph
from trex.backends.ascend.routing_indices import request_npu_index_dtypes
from trex.backends.ascend.schemas import check_call, shipped_schemas
from trex.backends.backend import Backend
from trex.graph_copy import copy_graph_module

DEFAULT_TARGET = "ascend-910c"


class AscendLoweredModule:
    """A partition lowered for Ascend: the rewritten graph, the torch_npu ops it calls, its report."""

    def __init__(
        self, module: fx.GraphModule, emitted_ops: list[str], matches: list[Match], report: AscendGraphReport | None
    ):
        self.module = module
        self.emitted_ops = emitted_ops  # torch_npu op names, one entry per emitted call
        self.patterns = [m.pattern for m in matches]
        self.report = report

    def __call__(self, *args: Any) -> Any:
        return self.module(*args)


@dataclass
class _GraphState:
    claimed: set[fx.Node] = field(default_factory=set)
    report: AscendGraphReport | None = None


class AscendBackend(Backend):
    name: ClassVar[str] = "ascend"
    # its GEMMs become torch_npu ops for an NPU (emulated here), not this CPU's kernels: cpu_gemm_precision stays out
    runs_gemms_on_this_cpu: ClassVar[bool] = False
    description: ClassVar[str] = (
        "torch_npu fused ops (RMSNorm, SwiGLU, RoPE, flash attention, MoE gating/permute/unpermute, "
        "grouped GEMMs; forward and backward), checked against torch_npu's schemas; CPU emulation without an NPU"
    )

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        patterns: Sequence[Pattern] = PATTERNS,
        *,
        emulate: bool | None = None,
        check: Callable[..., Any] | None = None,
        main_grad: bool | None = None,
        publish_grads: bool = True,
        npu_index_dtypes: bool = True,
    ):
        """`main_grad`: whether the routed experts' weight gradients accumulate in place into a persistent float32
        `param.main_grad` through `npu_grouped_matmul_add_` (Megatron-LM's `gradient_accumulation_fusion`,
        MindSpeed's DeepSeek recipes; see `main_grad.py`). None (the default) decides per parameter:
          - float32 parameters: yes (the buffer is `.grad` itself: no cast, no extra memory, the accumulation
            fused into the GEMM);
          - bfloat16/float16 parameters with `publish_grads=False` (the optimizer reads the fp32 `main_grad`,
            Megatron's contract): yes;
          - bfloat16/float16 parameters whose optimizer reads `.grad` (`publish_grads=True`): no - each weight
            gradient is one K-split `npu_grouped_matmul(group_type=2)` writing the parameter's dtype, eager's own
            dtype flow (autograd's bf16 GEMM result summed into the bf16 `.grad`), instead of an fp32 buffer
            (4 B per element) that would be cast to a bf16 `.grad` after every backward (6 B per element moved).
        `main_grad=True` accumulates in fp32 for every parameter (a bf16 `.grad` is then the cast of the fp32 sum
        of the step's micro-batches: more precise than eager's bf16 sum); `main_grad=False` never does (K-split
        for all). `publish_grads` (default on): `param.grad` holds the gradient as torch would leave it, so
        plain torch optimizers work unchanged; `publish_grads=False` is the Megatron contract: `.grad` stays
        None, the optimizer reads `main_grad` and the caller zero-fills it once per step (`zero_main_grads`).
        `npu_index_dtypes` (default on): the MoE layers produce and save their routing indices in the dtypes
        torch_npu's routing ops read (int32 rows, int64 group ends; `routing_indices.py`) instead of trex's
        defaults, which the lowering would convert around every routing op; False keeps trex's defaults."""
        self.target = target
        self.main_grad = main_grad
        self.publish_grads = publish_grads
        self.npu_index_dtypes = npu_index_dtypes
        self.patterns = tuple(patterns)
        self.emulate = emulate
        self.check = check
        self._graphs: weakref.WeakKeyDictionary[fx.Graph, _GraphState] = weakref.WeakKeyDictionary()
        self._current: _GraphState | None = None
        self.reports: list[AscendGraphReport] = []
        self.captured_attention = 0  # attention regions rewritten before AOTAutograd (all graphs)
        self.captured_rotary = 0  # V4-form RoPE regions rewritten before AOTAutograd
        self.captured_index_dtypes = 0  # MoE layers asked for torch_npu's routing-index dtypes before AOTAutograd

    def _state(self, graph: fx.Graph) -> _GraphState:
        state = self._graphs.get(graph)
        if state is None:
            matches = find_matches(graph, self.patterns)
            prepared = {n for n in graph.nodes if n.meta.get(PREPARED)}
            captured = _captured_npu_calls(graph)
            captured |= {
                u for n in captured for u in n.users if u.op == "call_function" and u.target is operator.getitem
            }
            state = _GraphState({n for m in matches for n in m.nodes} | prepared | captured)
            state.report = price_graph(graph, self.target, matches)
            state.report.publishes_grads = any(
                n.op == "call_function" and n.target is main_grad_publish for n in graph.nodes
            )
            self.reports.append(state.report)
            self._graphs[graph] = state
        self._current = state
        return state

    def summary_lines(self, subgraphs: Sequence[Any]) -> list[str]:
        """The share of predicted time that went to torch_npu fused ops (see `report.describe`)."""
        reports = list({id(r): r for s in subgraphs if (r := getattr(s.compiled, "report", None)) is not None}.values())
        return describe(reports)

    def supports(self, node: fx.Node) -> bool:
        try:
            return node in self._state(node.graph).claimed
        except Exception:  # noqa: BLE001 - supports() never raises; an unmatched graph is simply not ours
            return False

    def prepare(self, gm: fx.GraphModule, phase: str, graph_inputs: Sequence[Any] | None) -> None:
        """Before AOTAutograd ("captured"): attention regions become npu_fusion_attention, whose autograd
        gives the backward npu_fusion_attention_grad (`attention_before_autograd`), and V4's interleaved
        RoPE npu_rotary_mul, whose backward is npu_rotary_mul_backward (`rotary_before_autograd`); the MoE layers
        are asked for torch_npu's routing-index dtypes (`routing_indices`). Unless `main_grad`
        is False, the backward's expert weight gradients (of float32 parameters only, by default with published
        `.grad`s) become in-place accumulations."""
        if phase == "captured":
            regions = attention_before_autograd.lower_attention(
                gm, emulate=self.emulate, **({"check": self.check} if self.check else {})
            )
            self.captured_attention += len(regions)
            self.captured_rotary += rotary_before_autograd.lower_rotary(
                gm, emulate=self.emulate, **({"check": self.check} if self.check else {})
            )
            if self.npu_index_dtypes:
                self.captured_index_dtypes += request_npu_index_dtypes(gm)
            return
        if self.main_grad is not False and phase == "backward":
            emitter = Emitter(gm.graph, emulate=self.emulate, **({"check": self.check} if self.check else {}))
            accumulate_into_main_grads(
                gm,
                graph_inputs,
                target=self.target,
                emitter=emitter,
                publish=self.publish_grads,
                only_fp32=self.main_grad is None and self.publish_grads,
            )

    def lower(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        gm = copy_graph_module(gm)
        # torch_npu calls a whole-graph rewrite (prepare) already emitted: kept as they are
        prepared = [n for n in gm.graph.nodes if n.meta.get(PREPARED) and "trex_npu_op" in n.meta]
        # torch_npu calls traced from Dynamo's graph (the attention rewritten before AOTAutograd, and the
        # backward op its autograd calls): named, re-checked against the schema, kept as they are
        for node in sorted(_captured_npu_calls(gm.graph) - set(prepared), key=list(gm.graph.nodes).index):
            node.meta["trex_npu_op"] = _npu_op_name(node)
            (self.check or check_call)(node.meta["trex_npu_op"], node.args, node.kwargs)
            prepared.append(node)
        matches = find_matches(gm.graph, self.patterns)
        emitter = Emitter(gm.graph, emulate=self.emulate, **({"check": self.check} if self.check else {}))
        glue_of: list[tuple[Match, list[fx.Node], list[fx.Node]]] = []
        for match in matches:
            anchor = match.nodes[-1]
            first_glue, first_call = len(emitter.glue), len(emitter.calls)
            with gm.graph.inserting_after(anchor):
                emitter.replace(match.emit(emitter))
            glue_of.append((match, emitter.glue[first_glue:], emitter.calls[first_call:]))
        fused_nodes = {n.name for m in matches for n in m.nodes}
        emitted = [n.meta["trex_npu_op"] for n in prepared] + emitter.emitted
        _topological_sort(gm.graph)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        remaining = {n.name for n in gm.graph.nodes}
        report = self._current.report if self._current is not None else None
        if report is not None:
            from trex.cost_model.annotate import annotate_node, cluster_of

            cluster = cluster_of(report.target)
            live = set(gm.graph.nodes)
            calls = []  # each emitted call by its own formula (torch_npu_formulas), in a MoE layer or not
            for match, glue, new_calls in glue_of:
                in_moe = any(n.name in report.moe_nodes for n in match.nodes)
                report.record_glue([n for n in glue if n in live], moe=in_moe)
                for call in new_calls:
                    if call in live:
                        cost = annotate_node(call, cluster)
                        report.unpriced += cost is None or not cost.priced
                        calls.append((cost.time_s if cost is not None else 0.0, in_moe))
            report.record_fused((fused_nodes - remaining) | {n.name for n in prepared}, emitted, calls)
        return AscendLoweredModule(gm, emitted, matches, report)


def _npu_op_name(node: fx.Node) -> str:
    return node.target._schema.name.split("::")[-1]


def _captured_npu_calls(graph: fx.Graph) -> set[fx.Node]:
    """Calls of torch_npu's ops (or their emulations) that were in the graph before lowering: AOTAutograd
    traced them from Dynamo's graph after `prepare(..., "captured")`."""
    namespaces = ("npu_emul", "npu")
    return {
        n
        for n in graph.nodes
        if n.op == "call_function"
        and getattr(n.target, "namespace", None) in namespaces
        and _npu_op_name(n) in shipped_schemas()
        and not n.meta.get(PREPARED)
    }


def _topological_sort(graph: fx.Graph) -> None:
    """Reorder nodes so every node follows its inputs, keeping the order otherwise (emitted calls sit
    after the region's anchor, which may come after uses of the region's intermediate results)."""
    from torch._inductor.pattern_matcher import stable_topological_sort

    stable_topological_sort(graph)
