"""Capture/compile time and training-step time: trex vs eager vs torch.compile, side by side.

    python bench/compile_and_step.py [--steps 20] [--inductor] [--meta]

For each tiny model family (DeepSeek-V4, DeepSeek-V3, Qwen3-MoE; fp32, CPU) it measures, in one
process (steps of the variants interleaved round by round): trex's first call (Dynamo capture, AOTAutograd joint trace, pass pipeline, partition,
lowering, one step) with its stages broken down, then the median forward+backward step time of
eager PyTorch, `torch.compile(backend="aot_eager")` (the same capture without trex's passes) and
trex; with --inductor also `torch.compile` (Inductor, CPU). With --meta it also times the
meta-device capture of the full-size models. Prints a markdown table with ratios to eager.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import trex
from trex.models import TINY_FAMILIES, build_model, tiny_config


def _step(module, input_ids) -> float:
    start = time.perf_counter()
    module(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()
    return time.perf_counter() - start


def bench_family(family: str, steps: int, inductor: bool) -> dict:
    """Compile every variant, then time them interleaved (one step of each per round), so load from
    other processes on the machine hits all variants alike; medians over the rounds."""
    config = tiny_config(family)
    model = build_model(config, seed=0)
    input_ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    row = {"family": family}
    variants = {"eager": copy.deepcopy(model)}

    torch._dynamo.reset()
    variants["trex"] = trex.compile(copy.deepcopy(model))
    row["trex_first"] = _step(variants["trex"], input_ids)
    graph = variants["trex"].trex.graphs[0]
    row["stages"] = dict(graph.seconds)
    row["joint_nodes"] = len(graph.joint.graph.nodes)

    variants["aot_eager"] = torch.compile(copy.deepcopy(model), backend="aot_eager", fullgraph=True)
    row["aot_eager_first"] = _step(variants["aot_eager"], input_ids)
    if inductor:
        variants["inductor"] = torch.compile(copy.deepcopy(model), fullgraph=True)
        row["inductor_first"] = _step(variants["inductor"], input_ids)
    _step(variants["eager"], input_ids)

    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(steps):
        for name, module in variants.items():
            times[name].append(_step(module, input_ids))
    for name, samples in times.items():
        row[f"{name}_step"] = statistics.median(samples)
    return row


def bench_meta(names: list[str]) -> list[tuple[str, float, int, int]]:
    from trex.meta_capture import capture_model

    rows = []
    for name in names:
        torch._dynamo.reset()
        capture = capture_model(name)
        rows.append((name, capture.seconds["total"], len(capture.kinds) - 1, capture.num_layers))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inductor", action="store_true", help="also time torch.compile with Inductor (slow cold compile)")
    parser.add_argument("--meta", action="store_true", help="also time meta-device capture of the full-size models")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: on a shared 2-core machine two OpenMP threads time the scheduler)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    rows = [bench_family(f, args.steps, args.inductor) for f in TINY_FAMILIES]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); batch 4 x 32 tokens, fp32, forward+backward; median of {args.steps} interleaved rounds\n")
    print("| model | trex first call (s) | of which: AOT joint trace / passes / partition+lower (s) | joint nodes | eager step (ms) | aot_eager step (ms) | trex step (ms) | trex / eager |" + (" inductor first call (s) | inductor step (ms) |" if args.inductor else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if args.inductor else ""))
    for r in rows:
        s = r["stages"]
        lower = s.get("partition", 0) + s.get("lower_forward", 0) + s.get("lower_backward", 0)
        line = (
            f"| tiny {r['family']} | {r['trex_first']:.2f} | {s['aot_trace']:.2f} / {s['passes']:.2f} / {lower:.2f} | {r['joint_nodes']} "
            f"| {r['eager_step'] * 1e3:.1f} | {r['aot_eager_step'] * 1e3:.1f} | {r['trex_step'] * 1e3:.1f} | {r['trex_step'] / r['eager_step']:.2f}x |"
        )
        if args.inductor:
            line += f" {r['inductor_first']:.1f} | {r['inductor_step'] * 1e3:.1f} |"
        print(line)
    if args.meta:
        print("\n| full-size model (meta device) | capture time (s) | layer kinds | decoder layers |")
        print("|---|---|---|---|")
        for name, seconds, kinds, layers in bench_meta(["deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3", "qwen3-235b-a22b"]):
            print(f"| {name} | {seconds:.1f} | {kinds} | {layers} |")


if __name__ == "__main__":
    main()
