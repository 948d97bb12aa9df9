"""trex's CPU grouped GEMM kernel against aten's `_grouped_mm` (one oneMKL call per group), side by side.

    python bench/cpu_ops/grouped_gemm_kernel.py [--rounds 7] [--step qwen3-moe,deepseek-v3] [--steps 60]

1. Problems: each layout a training step gives a grouped GEMM - rows times a weight (the weight's rows
   contiguous: the input gradient of transformers' experts), rows times a transposed weight (their forward), the
   weight gradient - at the tiny models' shapes and larger ones, the rows split unevenly over the groups (seeded).
   Each round times aten and trex back to back (the order alternating); a round's time is the best of 20 calls.
   Printed: median microseconds per call of each, and the ratio aten / trex per round (median, min-max).
2. --step: a whole fp32 training step (forward, backward, trex.optim.AdamW) of a tiny model compiled twice by trex
   in one process, its grouped GEMMs on aten's kernel (`InductorBackend(cpu_grouped_gemm="aten")`) and as the
   default lowering places them ("timed"); steps interleaved, ratio aten-step / timed-step per step (median,
   min-max). One torch thread throughout.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from trex.backends.inductor import cpu_grouped_gemm
from trex.passes.cpu_gemm_precision.timing import best_seconds_per_call

# (rows, depth, columns, groups): tiny Qwen3-MoE's four, then larger experts
PROBLEMS = [(256, 64, 64, 8), (256, 32, 64, 8), (256, 64, 32, 8), (1024, 128, 96, 8), (2048, 256, 128, 16)]
LAYOUTS = ("weight rows", "weight transposed", "weight gradient")


def _offsets(rows: int, groups: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randint(0, rows + 1, (groups - 1,), generator=generator).tolist())
    return torch.tensor([*cuts, rows], dtype=torch.int32)


def _calls(layout: str, rows: int, depth: int, cols: int, groups: int):
    torch.manual_seed(0)
    offsets = _offsets(rows, groups, seed=rows + depth)
    a = torch.randn(rows, depth)
    if layout == "weight gradient":
        b = torch.randn(rows, cols)
        out = torch.empty(groups, depth, cols)
        return (
            lambda: torch._grouped_mm(a.t(), b, offs=offsets),
            lambda: cpu_grouped_gemm.grouped_mm_weight_grad(a, b, offsets, out=out),
        )
    if layout == "weight rows":
        b = torch.randn(groups, depth, cols)
    else:
        b = torch.randn(groups, cols, depth).transpose(1, 2)
    out = torch.empty(rows, cols)
    return lambda: torch._grouped_mm(a, b, offs=offsets), lambda: cpu_grouped_gemm.grouped_mm(a, b, offsets, out=out)


def _cell(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def bench_problems(rounds: int) -> None:
    cpu_grouped_gemm.kernel()  # built before any timing
    print("| problem (rows x depth x columns, groups) | layout | aten us | trex us | aten / trex |")
    print("|---|---|---|---|---|")
    for rows, depth, cols, groups in PROBLEMS:
        for layout in LAYOUTS:
            aten_call, trex_call = _calls(layout, rows, depth, cols, groups)
            aten, ours = [], []
            for r in range(rounds):
                order = [(aten_call, aten), (trex_call, ours)]
                for call, times in order if r % 2 == 0 else order[::-1]:
                    times.append(best_seconds_per_call(call, rounds=1, calls=20) * 1e6)
            ratios = [x / y for x, y in zip(aten, ours)]
            print(
                f"| {rows} x {depth} x {cols}, {groups} | {layout} | {statistics.median(aten):.1f} | "
                f"{statistics.median(ours):.1f} | {_cell(ratios)} |"
            )


def bench_step(family: str, steps: int) -> None:
    import trex
    from trex.backends.inductor.backend import InductorBackend
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    model = build_model(config, seed=0).to(torch.float32)
    tokens = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    variants = {}
    for policy in ("aten", "timed"):
        copy_ = copy.deepcopy(model)
        compiled = trex.compile(copy_, backend=[InductorBackend(cpu_grouped_gemm=policy), "eager"])
        variants[policy] = (compiled, trex.optim.AdamW(copy_.parameters(), lr=1e-4))

    def step(policy: str) -> float:
        compiled, optimizer = variants[policy]
        start = time.perf_counter()
        compiled(input_ids=tokens, labels=tokens, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for _ in range(5):
        step("aten"), step("timed")
    times = {"aten": [], "timed": []}
    for i in range(steps):
        for policy in ("aten", "timed") if i % 2 == 0 else ("timed", "aten"):
            times[policy].append(step(policy) * 1e3)
    ratios = [a / t for a, t in zip(times["aten"], times["timed"])]
    notes = [
        n
        for g in variants["timed"][0].trex.graphs
        for lowering in g.lowerings.values()
        for n in lowering.notes
        if "cpu grouped GEMM" in n
    ]
    print(
        f"| tiny {family} fp32 | {_cell(times['aten'])} | {_cell(times['timed'])} | {_cell(ratios)} |"
        + "".join(f"\n  {n}" for n in notes)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--step", default="", help="tiny model families whose training step to compare, e.g. qwen3-moe")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench_problems(args.rounds)
    families = [f for f in args.step.split(",") if f]
    if families:
        print("\n| model | step ms, grouped GEMMs on aten | step ms, placed by timing (default) | aten / timed |")
        print("|---|---|---|---|")
        for family in families:
            bench_step(family, args.steps)
    print(f"\ntorch {torch.__version__}, 1 thread; median (min-max) over rounds")


if __name__ == "__main__":
    main()
