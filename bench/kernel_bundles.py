"""Cold first call with and without kernel bundles (backends/inductor/kernel_bundles.py), side by side.

    python bench/kernel_bundles.py [--family qwen3-moe] [--dtype fp32] [--rounds 2]

In one process (the bench's cold-compile set-up: Inductor's caches off, compilers warmed up, one torch thread),
each round compiles the tiny model twice with `trex.compile`, once with `InductorBackend(kernel_bundles=True)`
(trex's default) and once with `kernel_bundles=False` (one g++ process per kernel, Inductor's own way), the order
alternating between rounds. For each: the first call (capture + compile + one training step), the number of
C++ builds Inductor's builder ran and their summed wall seconds (the builds run on the compile threads, so the
sum exceeds the wall time they add). Prints each run and the ratio without / with bundles (min / median / max).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from compile_and_step import TrainStep, cold_compile_setup, trex_adamw  # noqa: E402

import trex  # noqa: E402
from trex.backends.inductor import InductorBackend  # noqa: E402


def timed_builds():
    """Patch Inductor's C++ builder to record (seconds, command) of every build; returns the record list."""
    from torch._inductor import cpp_builder

    record: list[tuple[float, str]] = []
    original = cpp_builder.CppBuilder.build

    def build(self):
        start = time.perf_counter()
        original(self)
        record.append((time.perf_counter() - start, self.get_command_line()))

    cpp_builder.CppBuilder.build = build
    return record


def first_call(model: torch.nn.Module, input_ids: torch.Tensor, bundles: bool, record: list) -> dict:
    record.clear()
    base = copy.deepcopy(model)
    start = time.perf_counter()
    compiled = trex.compile(base, backend=[InductorBackend(kernel_bundles=bundles), "eager"])
    TrainStep(compiled, base.parameters(), input_ids, trex_adamw).step()
    seconds = time.perf_counter() - start
    kernels = [s for s, cmd in record if ".main.cpp" in cmd]  # kernels and bundles (not ISA probes)
    return {"first_call_s": seconds, "builds": len(kernels), "build_s": sum(kernels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen3-moe")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model, input_ids = cold_compile_setup(args.family, args.dtype)
    record = timed_builds()
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(args.rounds):
        for bundles in (True, False) if r % 2 == 0 else (False, True):
            run = first_call(model, input_ids, bundles, record)
            runs[bundles].append(run)
            label = "bundles" if bundles else "one build per kernel"
            print(
                f"round {r} {label:>20}: first call {run['first_call_s']:.1f} s, "
                f"{run['builds']} C++ builds summing to {run['build_s']:.1f} s",
                flush=True,
            )
    ratios = sorted(a["first_call_s"] / b["first_call_s"] for a, b in zip(runs[False], runs[True]))
    print(
        f"tiny {args.family} {args.dtype}: first call without / with bundles "
        f"{statistics.median(ratios):.2f}x (min {ratios[0]:.2f}, max {ratios[-1]:.2f}) over {len(ratios)} rounds"
    )


if __name__ == "__main__":
    main()
