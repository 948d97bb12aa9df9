"""passes.compute_once on and off: a whole training step of tiny models compiled twice by trex in one process.

    python bench/compute_once.py [--families qwen3-moe,deepseek-v3,deepseek-v4] [--dtypes fp32,bf16] [--steps 60]

Each model is compiled by `trex.compile` twice - the default pipeline, and the same without `compute_once`
(`passes="-compute_once"`) - and stepped (forward, backward, trex.optim.AdamW) alternately, so both see the same
load. Printed per row: the median step of each (thread CPU milliseconds: with one torch thread the step's whole
cost), the ratio off / on per step pair (median, min-max), and the pass's decisions (how many values it marked
in the forward and the backward). Run it with OMP_NUM_THREADS=1 under the bench lock like
bench/compile_and_step.py. Dynamo is reset before each row (each model's code would otherwise hit its recompile
limit), never between a row's two compiles (both would then run the second one).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compile_and_step import TrainStep, trex_adamw  # noqa: E402

import trex  # noqa: E402
from trex.models import build_model, tiny_config  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def marks(step: TrainStep) -> dict[str, int]:
    """How many values compute_once marked in each graph of the compiled model."""
    counted: dict[str, int] = {}
    for graph in step.module.trex.graphs:
        for record in graph.report.records:
            if record.name == "compute_once":
                for decision in record.decisions:
                    if decision.action == "compute_once":
                        which = decision.data.get("graph", "?")
                        counted[which] = counted.get(which, 0) + 1
    return counted


def bench(family: str, dtype: torch.dtype, steps: int) -> str:
    config = tiny_config(family)
    model = build_model(config, seed=0).to(dtype)
    input_ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    variants: dict[str, TrainStep] = {}
    torch._dynamo.reset()  # once per row, not between its two compiles (both would then run the second)
    for name, passes in (("on", None), ("off", "-compute_once")):
        base = copy.deepcopy(model)
        variants[name] = TrainStep(trex.compile(base, passes=passes), base.parameters(), input_ids, trex_adamw)
        variants[name].step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(steps):
        for name, variant in variants.items():
            times[name].append(variant.step()[1])
    ratios = [off / on for on, off in zip(times["on"], times["off"])]
    on, off = (statistics.median(times[k]) * 1e3 for k in ("on", "off"))
    return (
        f"| tiny {family} | {str(dtype).removeprefix('torch.')} | {on:.2f} | {off:.2f} | "
        f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {marks(variants['on'])} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="qwen3-moe,deepseek-v3,deepseek-v4")
    parser.add_argument("--dtypes", default="fp32")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; batch 4 x 32 tokens; {args.steps} interleaved step pairs")
    print("| model | dtype | step ms, compute_once on | off | off / on per step pair | values marked |")
    print("|---|---|---|---|---|---|")
    for family in args.families.split(","):
        for dtype in args.dtypes.split(","):
            print(bench(family, DTYPES[dtype], args.steps), flush=True)


if __name__ == "__main__":
    main()
