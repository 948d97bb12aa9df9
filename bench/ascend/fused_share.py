"""Share of the predicted time on ascend-910c that goes to torch_npu fused ops, per model.

Two settings, both priced by trex's cost model (predictions, nothing runs on an NPU):
  * tiny: `trex.models.tiny_config(family)` built with random weights, compiled with backend=["ascend"],
    one training step (batch 2 x 16) on CPU through the emulations;
  * full: the full-size config (`trex.models.load_config`), decoder layers cut to `--full-layers`
    (the widths, experts and sequence stay full size), captured on the meta device with backend=["ascend"]
    (`trex.meta_capture.capture_model`), so every layer kind's forward and backward graph is lowered.
For each, the share of the MoE layers' time (nodes canonicalization tags `trex_moe`) and of the
whole graphs' time that the fused ops took, the glue the rewrites added counted as not fused.

    python bench/ascend/fused_share.py [--families deepseek-v4 ...] [--full-seq 4096] [--skip-full]
"""

from __future__ import annotations

import argparse
import time

import torch

FULL_NAMES = {"deepseek-v4": "deepseek-v4-flash", "deepseek-v3": "deepseek-v3", "qwen3-moe": "qwen3-235b-a22b"}


def _reports(graphs) -> list:
    reports = {}
    for graph in graphs:
        for lowering in graph.lowerings.values():
            for child in lowering.module.children():
                report = getattr(getattr(child, "compiled", None), "report", None)
                if report is not None:
                    reports[id(report)] = report
    return list(reports.values())


def _shares(reports) -> tuple[float, float, float, float]:
    total = sum(r.total_s + r.glue_s for r in reports)
    moe = sum(r.moe_total_s + r.moe_glue_s for r in reports)
    fused = sum(r.fused_s for r in reports)
    moe_fused = sum(r.moe_fused_s for r in reports)
    return moe_fused / moe if moe else 0.0, moe * 1e6, fused / total if total else 0.0, total * 1e6


def tiny(family: str):
    import trex
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    model = build_model(config, dtype=torch.float32, seed=1)
    compiled = trex.compile(model, backend=["ascend"])
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    compiled(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return _reports(compiled.trex.graphs), compiled.trex.lowered_ops()["ascend"]


def full(family: str, layers: int, seq: int):
    from trex.meta_capture import capture_model
    from trex.models import load_config

    config = load_config(FULL_NAMES[family])
    config.num_hidden_layers = layers
    for name in ("layer_types", "mlp_layer_types"):
        if isinstance(getattr(config, name, None), list):
            setattr(config, name, getattr(config, name)[:layers])
    capture = capture_model(config, batch=1, seq=seq, include_ends=False, backend=["ascend"])
    graphs = [k.graph for k in capture.kinds if k.graph is not None]
    ops = sorted(
        {
            n.meta["trex_npu_op"]
            for g in graphs
            for lw in g.lowerings.values()
            for c in lw.module.children()
            for n in getattr(getattr(getattr(c, "compiled", None), "module", None), "graph", fx_empty()).nodes
            if "trex_npu_op" in n.meta
        }
    )
    return _reports(graphs), ops, [k.name for k in capture.kinds]


def fx_empty():
    from torch import fx

    return fx.Graph()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FULL_NAMES))
    parser.add_argument("--full-layers", type=int, default=4)
    parser.add_argument("--full-seq", type=int, default=4096)
    parser.add_argument("--skip-full", action="store_true")
    args = parser.parse_args()
    print("| model | setting | MoE layers: fused share (of us) | whole graphs: fused share (of us) | seconds |")
    print("|---|---|---|---|---|")
    for family in args.families:
        start = time.perf_counter()
        reports, ops = tiny(family)
        moe, moe_us, whole, whole_us = _shares(reports)
        print(
            f"| {family} | tiny, batch 2 x 16 | {100 * moe:.1f}% ({moe_us:.0f}) | {100 * whole:.1f}% ({whole_us:.0f}) "
            f"| {time.perf_counter() - start:.0f} |",
            flush=True,
        )
        print(f"<!-- {family} tiny emitted: {sorted(set(ops))} -->", flush=True)
        if args.skip_full:
            continue
        start = time.perf_counter()
        reports, ops, kinds = full(family, args.full_layers, args.full_seq)
        moe, moe_us, whole, whole_us = _shares(reports)
        print(
            f"| {family} | {FULL_NAMES[family]}, {args.full_layers} layers ({', '.join(kinds)}), batch 1 x "
            f"{args.full_seq} | {100 * moe:.1f}% ({moe_us:.0f}) | {100 * whole:.1f}% ({whole_us:.0f}) "
            f"| {time.perf_counter() - start:.0f} |",
            flush=True,
        )
        print(f"<!-- {family} full emitted: {ops} -->", flush=True)


if __name__ == "__main__":
    main()
