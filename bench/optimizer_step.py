"""The AdamW step alone, on a tiny model's parameters: trex.optim.AdamW against torch's AdamW paths, same process.

    python bench/optimizer_step.py [--families qwen3-moe] [--dtypes fp32] [--rounds 200] [--compiled foreach|fused|none]

Why: after trex compiles the forward and backward, the optimizer is a visible share of a tiny model's CPU
training step (~0.65 ms of ~7.4 ms for Qwen3-MoE fp32). This times one `step()` + `zero_grad()` of every
AdamW path torch offers - `fused=True`, `foreach=True`, the default, and torch's compiled-optimizer recipe
(`torch.compile(optimizer.step)`, over foreach or, with --compiled fused, over fused) - and trex.optim.AdamW, each on its own copy of
the model's parameters with the same fixed gradients (a gradient tensor per parameter, handed back after each
`zero_grad` as the backward would), rounds interleaved so load hits every path alike. It prints median (min-max)
microseconds and each path's time over trex's per round, and checks that trex's parameters after the rounds
equal torch fused's bit for bit (the same kernel on the same inputs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import trex.optim
from trex.models import TINY_FAMILIES, build_model, tiny_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Path:
    """One optimizer over its own parameter copies; `run()` is one step + zero_grad(set_to_none=True)."""

    def __init__(self, make, params: list[torch.Tensor], grads: list[torch.Tensor], compiled: bool = False):
        self.params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        self.grads = grads
        self.optimizer = make(self.params)
        self.call = torch.compile(self.optimizer.step) if compiled else self.optimizer.step

    def run(self) -> float:
        for p, g in zip(self.params, self.grads):  # what AccumulateGrad does with a fresh gradient: no copy
            p.grad = g
        start = time.perf_counter()
        self.call()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def bench(family: str, dtype: torch.dtype, rounds: int, compiled: list[str]) -> None:
    model = build_model(tiny_config(family), seed=0).to(dtype)
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(0)
    grads = [(torch.randn(p.shape, generator=generator) * 1e-2).to(dtype) for p in params]
    makes = {
        "trex.optim.AdamW": (lambda ps: trex.optim.AdamW(ps, lr=1e-4), False),
        "torch fused=True": (lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True), False),
        "torch foreach=True": (lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True), False),
        "torch default": (lambda ps: torch.optim.AdamW(ps, lr=1e-4), False),
    }
    # one compiled AdamW per process: with both, the foreach one failed Dynamo's recompile after the fused one
    for kind in compiled:
        makes[f"torch.compile(step), {kind}"] = (lambda ps, k=kind: torch.optim.AdamW(ps, lr=1e-4, **{k: True}), True)
    paths = {}
    for name, (make, is_compiled) in makes.items():
        start = time.perf_counter()
        paths[name] = Path(make, params, grads, is_compiled)
        for _ in range(3):  # state made, compiled, warm
            paths[name].run()
        print(f"  {name}: first 3 steps {time.perf_counter() - start:.1f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in paths}
    failed: dict[str, str] = {}
    for round_ in range(rounds):
        for name, path in list(paths.items()):
            try:
                times[name].append(path.run())
            except Exception as error:  # a compiled path can fail when Dynamo recompiles it: report, drop it
                failed[name] = f"failed at round {round_}: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
                del paths[name], times[name]
    equal = all(torch.equal(a, b) for a, b in zip(paths["trex.optim.AdamW"].params, paths["torch fused=True"].params))
    count = sum(p.numel() for p in params)
    print(f"\ntiny {family} {str(dtype).removeprefix('torch.')}: {len(params)} parameters, {count:,} elements")
    print("| AdamW path | step + zero_grad us | time / trex's (per round) |")
    print("|---|---|---|")
    mine = times["trex.optim.AdamW"]
    for name, samples in times.items():
        ratios = [s / t for s, t in zip(samples, mine)]  # rounds both ran
        us = [s * 1e6 for s in samples]
        print(
            f"| {name} | {statistics.median(us):.0f} ({min(us):.0f}-{max(us):.0f}) | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    for name, why in failed.items():
        print(f"| {name} | {why} | |")
    print(f"trex's parameters bit-equal to torch fused's after {rounds + 3} steps: {equal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="qwen3-moe", help=f"any of {','.join(TINY_FAMILIES)}")
    parser.add_argument("--dtypes", default="fp32")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--compiled",
        default="foreach",
        help="torch.compile(step) over AdamW(foreach=True) and/or (fused=True): 'foreach', 'fused' or 'none' "
        "(~25 s to compile foreach; with both, the foreach one failed at its first timed round in torch 2.13)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True
    for family in args.families.split(","):
        for dtype in args.dtypes.split(","):
            torch._dynamo.reset()
            bench(family, DTYPES[dtype], args.rounds, [k for k in args.compiled.split(",") if k != "none"])
    load = os.getloadavg()
    print(f"\ntorch {torch.__version__}, 1 thread; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")


if __name__ == "__main__":
    main()
