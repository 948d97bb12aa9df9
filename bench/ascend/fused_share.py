"""Share of the predicted time on ascend-910c that goes to torch_npu fused ops, per model.

Two settings, both priced by trex's cost model (predictions: nothing runs on an NPU):
  * tiny: `trex.models.tiny_config(family)` with random weights, compiled with backend=["ascend"],
    one fp32 training step (batch 2 x 16) on CPU through the emulations;
  * full: the full-size config (`trex.models.load_config`), decoder layers cut to `--full-layers`
    (widths, experts and sequence stay full size), captured on the meta device with backend=["ascend"]
    (`trex.meta_capture.capture_model` lowers each layer kind's forward; its backward, which a meta
    capture never runs, is lowered here with the same backend).
For each: the share of the MoE layers' predicted time (nodes canonicalization tags `trex_moe`) and of
the whole graphs' time that the fused ops took, each fused call priced by its own formula (what `summary()`
shows), and beside it the earlier accounting (fused calls priced as the nodes they replaced); the aten glue
the rewrites add counts as not fused.
`--grads` picks how expert weight gradients are lowered: `published` (the default of backend=["ascend"]:
fp32 parameters in place into float32 `param.main_grad`, which is `.grad`; bf16 parameters one K-split
`npu_grouped_matmul` in bf16, eager's dtype flow), `main-grad-published` (`AscendBackend(main_grad=True)`:
every parameter into an fp32 `main_grad`, `.grad` set to it after each backward, a cast per backward for
bf16 parameters, priced as not fused), `main-grad` (`AscendBackend(publish_grads=False)`, Megatron's
contract: the optimizer reads `main_grad`) or `functional` (`AscendBackend(main_grad=False)`: each weight
gradient one K-split `npu_grouped_matmul` in the parameter's dtype). The once-per-step zero-fill of the buffers (and, for
`main-grad`, the cast an optimizer reading bf16 `.grad` would need) are printed apart, per optimizer step.

    python bench/ascend/fused_share.py [--families deepseek-v4 ...] [--full-layers 5] [--full-seq 4096]
                                       [--skip-tiny] [--skip-full] [--grads published|main-grad-published|main-grad|functional]
                                       [--tiny-dtype float32|bfloat16] [--list-moe] [--dispatch init-routing|permute]
                                       [--index-dtypes npu|trex]
"""

from __future__ import annotations

import argparse
import time

import torch

FULL_NAMES = {"deepseek-v4": "deepseek-v4-flash", "deepseek-v3": "deepseek-v3", "qwen3-moe": "qwen3-235b-a22b"}


def _lowerings(graphs) -> list:
    return [lowering for graph in graphs for lowering in graph.lowerings.values()]


def _compiled_children(lowerings):
    for lowering in lowerings:
        for child in lowering.module.children():
            compiled = getattr(child, "compiled", None)
            if compiled is not None:
                yield compiled


def _reports(lowerings) -> list:
    reports = {}
    for compiled in _compiled_children(lowerings):
        report = getattr(compiled, "report", None)
        if report is not None:
            reports[id(report)] = report
    return list(reports.values())


def _emitted(lowerings) -> list[str]:
    ops = set()
    for compiled in _compiled_children(lowerings):
        module = getattr(compiled, "module", None)
        nodes = module.graph.nodes if module is not None else ()
        ops |= {n.meta["trex_npu_op"] for n in nodes if "trex_npu_op" in n.meta}
    return sorted(ops)


def _shares(reports) -> dict[str, float]:
    from trex.backends.ascend.report import shares

    return shares(reports)


def _per_step(params, target: str = "ascend-910c") -> str:
    """The once-per-optimizer-step work of main_grad buffers: zero-fill (4 B/element) and, for an
    optimizer reading bf16 `.grad`, the cast (4 B read + 2 B write per element), priced as streaming."""
    from trex.cost_model.annotate import cluster_of

    buffers = [p.main_grad for p in params if p is not None and getattr(p, "main_grad", None) is not None]
    if not buffers:
        return ""
    elements = sum(b.numel() for b in buffers)
    device = cluster_of(target).device
    rate = device.hbm_bytes_per_s * device.memory_efficiency
    zero, cast = 4 * elements / rate + device.kernel_overhead_s, 6 * elements / rate + device.kernel_overhead_s
    return (
        f"<!-- per optimizer step, not per backward: {len(buffers)} main_grad buffers, {elements / 1e9:.2f} G "
        f"elements: zero-fill {zero * 1e6:.0f} us (each per buffer set; with --grads main-grad-published, after "
        f"zero_grad(set_to_none)); with --grads main-grad, an optimizer reading bf16 .grad would add a cast of "
        f"{cast * 1e6:.0f} us (--grads main-grad-published prices that cast in the graph, every backward, for bf16 "
        "parameters) -->"
    )


GRADS = {
    "published": {},  # AscendBackend()'s defaults, what backend=["ascend"] gets (bf16 parameters: K-split)
    "main-grad-published": {"main_grad": True},  # fp32 main_grad for every parameter, .grad published
    "main-grad": {"publish_grads": False},
    "functional": {"main_grad": False},
}


DISPATCH = "init-routing"  # --dispatch: npu_moe_init_routing_v2 (the default) or the earlier permute lowering
INDEX_DTYPES = "npu"  # --index-dtypes: routing indices in torch_npu's dtypes (the default) or trex's (int64 perm)


def _ascend(grads: str):
    from trex.backends.ascend import AscendBackend
    from trex.backends.ascend.patterns import PATTERNS, MoeDispatch

    patterns = [MoeDispatch(init_routing=False) if isinstance(p, MoeDispatch) else p for p in PATTERNS]
    return AscendBackend(
        **GRADS[grads],
        **({"patterns": patterns} if DISPATCH == "permute" else {}),
        npu_index_dtypes=INDEX_DTYPES == "npu",
    )


def tiny(family: str, grads: str = "published", dtype: torch.dtype = torch.float32):
    import trex
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    model = build_model(config, dtype=dtype, seed=1)
    compiled = trex.compile(model, backend=[_ascend(grads)])
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    compiled(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    lowerings = _lowerings(compiled.trex.graphs)
    reports = _reports(lowerings)
    return reports, _emitted(lowerings), _per_step(model.parameters()) + "\n" + _own_prices(lowerings, reports)


def full(family: str, layers: int, seq: int, grads: str = "published"):
    from trex.backends import get_backend, lower_graph
    from trex.meta_capture import capture_model
    from trex.models import load_config
    from trex.targets import get_target

    config = load_config(FULL_NAMES[family])
    config.num_hidden_layers = layers
    for name in ("layer_types", "mlp_layer_types"):
        if isinstance(getattr(config, name, None), list):
            setattr(config, name, getattr(config, name)[:layers])
    capture = capture_model(config, batch=1, seq=seq, include_ends=False, backend=[_ascend(grads)])
    graphs = [k.graph for k in capture.kinds if k.graph is not None]
    lowerings = _lowerings(graphs)
    params = []
    for graph in graphs:
        if "backward" not in graph.lowerings and graph.backward is not None:
            backends = [_ascend(grads), get_backend("eager")]
            inputs = graph.graph_inputs
            lowerings.append(
                lower_graph(graph.backward, backends, get_target("cpu"), phase="backward", graph_inputs=inputs)
            )
            params += inputs or []
    return _reports(lowerings), _emitted(lowerings), [k.name for k in capture.kinds], _per_step(params)


def _where(reports) -> str:
    """Where the MoE layers' time that is not in fused ops goes: unfused ops and glue (us)."""
    from collections import Counter

    left, glue = Counter(), Counter()
    for r in reports:
        left.update(r.unfused_by_op(moe_only=True))
        glue.update(r.glue_by_op)
    fmt = lambda c: ", ".join(f"{k.removeprefix('aten.')} {v * 1e6:.0f}" for k, v in c.most_common(6) if v > 0)  # noqa: E731
    return f"<!-- MoE unfused: {fmt(left) or 'none'}; glue (all): {fmt(glue) or 'none'} -->"


def _own_prices(lowerings, reports) -> str:
    """The emitted calls of the lowered graphs priced by their own formulas (`cost_model/torch_npu_formulas.py`),
    beside the reports' fused time (the same pricing, summed as the backend lowered them: a cross-check) and the
    earlier accounting's (calls priced as the nodes they replaced)."""
    from trex.backends.ascend.report import emitted_call_costs

    own = sum(
        cost.time_s
        for compiled in _compiled_children(lowerings)
        if getattr(compiled, "module", None) is not None
        for _, cost in emitted_call_costs(compiled.module.graph, "ascend-910c")
    )
    fused = sum(r.fused_s for r in reports)
    replaced = sum(r.replaced_split()[0] for r in reports)
    return (
        f"<!-- whole graphs: emitted calls at their own formulas {own * 1e6:.0f} us; reports' fused {fused * 1e6:.0f} "
        f"us; as the nodes they replaced {replaced * 1e6:.0f} us -->"
    )


def _moe_listing(reports) -> str:
    """Node by node, the MoE layers' predicted time that is not in fused ops: unfused graph nodes, then glue."""
    lines = []
    for r in reports:
        for name in sorted(r.moe_nodes - r.fused_nodes, key=lambda n: -r.node_seconds[n]):
            if r.node_seconds[name] > 0:
                lines.append(f"<!--   unfused {name} {r.node_ops[name]} {r.node_seconds[name] * 1e6:.1f} us -->")
        lines += [f"<!--   glue {n} {op} {s * 1e6:.1f} us -->" for n, op, s, moe in r.glue_nodes if moe and s > 0]
    return "\n".join(lines)


def _row(family: str, setting: str, reports, seconds: float) -> str:
    got = _shares(reports)
    return (
        f"| {family} | {setting} | {100 * got['moe']:.1f}% ({got['moe_us']:.0f}) | {100 * got['moe_replaced']:.1f}% "
        f"| {100 * got['whole']:.1f}% ({got['whole_us']:.0f}) | {100 * got['whole_replaced']:.1f}% | {seconds:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FULL_NAMES))
    parser.add_argument("--full-layers", type=int, default=5)  # V4-Flash: 3 hash-MoE layers, then MoE ones
    parser.add_argument("--full-seq", type=int, default=4096)
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--grads", choices=list(GRADS), default="published")
    parser.add_argument("--tiny-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--list-moe", action="store_true", help="list each MoE-layer node not in a fused op")
    parser.add_argument(
        "--dispatch",
        choices=["init-routing", "permute"],
        default="init-routing",
        help="trex.moe_dispatch as npu_moe_init_routing_v2 (default) or npu_moe_token_permute + compute_expert_tokens",
    )
    parser.add_argument(
        "--index-dtypes",
        choices=["npu", "trex"],
        default="npu",
        help="MoE routing indices produced in torch_npu's dtypes (int32 rows, int64 group ends; the default) or in "
        "trex's defaults (int64 rows, int32 ends), which the lowering converts around the routing ops",
    )
    args = parser.parse_args()
    global DISPATCH, INDEX_DTYPES
    DISPATCH, INDEX_DTYPES = args.dispatch, args.index_dtypes
    print(
        "| model | setting | MoE layers: fused share (of us) | MoE, calls priced as replaced nodes "
        "| whole graphs: fused share (of us) | whole, as replaced | seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    for family in args.families:
        if not args.skip_tiny:
            start = time.perf_counter()
            reports, ops, per_step = tiny(family, args.grads, getattr(torch, args.tiny_dtype))
            print(
                _row(family, f"tiny, {args.tiny_dtype}, batch 2 x 16", reports, time.perf_counter() - start), flush=True
            )
            print(f"<!-- {family} tiny emitted: {ops} -->\n{_where(reports)}\n{per_step}", flush=True)
            if args.list_moe:
                print(_moe_listing(reports), flush=True)
        if not args.skip_full:
            start = time.perf_counter()
            reports, ops, kinds, per_step = full(family, args.full_layers, args.full_seq, args.grads)
            setting = f"{FULL_NAMES[family]}, {args.full_layers} layers ({'; '.join(kinds)}), batch 1 x {args.full_seq}"
            print(_row(family, setting, reports, time.perf_counter() - start), flush=True)
            print(f"<!-- {family} full emitted: {ops} -->\n{_where(reports)}\n{per_step}", flush=True)


if __name__ == "__main__":
    main()
