"""Does lowering the backward while the forward's C++ kernels build shorten trex's cold first call?

    OMP_NUM_THREADS=1 python bench/kernel_build_overlap.py --family deepseek-v4 --dtype bf16 [--rounds 2]

In one process (the model, batch, warm-up and training step of `bench/compile_and_step.py`, Inductor's caches
off), each round compiles a fresh copy of the model with trex twice: once with the Inductor backend's background
builds (`InductorBackend(background_builds=True)`, opt-in: the backward is lowered right after the forward and
each graph's kernel wait is at its first call, backends/inductor/kernel_builds.py) and once without (the
default: the forward waits for its kernels inside its compile and the backward is lowered at the first
backward call, as torch.compile does). The order alternates between rounds, so load from other processes and anything warmed by
the first compile of a round fall on both variants alike. Printed per first call: wall seconds, CPU seconds of
this process and of its finished children (the C++ compiler runs), and the ratio without / with per round.

Why a separate script: the overlap changes only wall time (the same lowering and the same C++ builds run,
concurrently), so it must be compared in wall time, and on a shared machine only against itself in the same
run.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import time

import compile_and_step as bench  # bench/ is the script's directory, first on sys.path
import torch

import trex
from trex.backends.inductor import InductorBackend


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def first_call(model, input_ids, background: bool) -> tuple[float, float, float]:
    """(wall s, this process's CPU s, its children's CPU s) of trex's capture + compile + one training step."""
    torch._dynamo.reset()
    module = copy.deepcopy(model)
    own0, children0 = _cpu_seconds()
    start = time.perf_counter()
    compiled = trex.compile(module, backend=[InductorBackend(background_builds=background), "eager"])
    bench.TrainStep(compiled, module.parameters(), input_ids).step()
    wall = time.perf_counter() - start
    own1, children1 = _cpu_seconds()
    return wall, own1 - own0, children1 - children0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen3-moe")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model, input_ids = bench.cold_compile_setup(args.family, args.dtype)
    ratios = []
    for round_ in range(args.rounds):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        results = {}
        for background in order:
            results[background] = first_call(model, input_ids, background)
            wall, own, children = results[background]
            name = "background builds" if background else "waits in compile"
            load = os.getloadavg()[0]
            print(
                f"round {round_} {name:17s}: first call {wall:6.1f} s, CPU {own:6.1f} s + C++ compiler {children:6.1f} s "
                f"(load {load:.1f})",
                flush=True,
            )
        ratios.append(results[False][0] / results[True][0])
    print(
        f"{args.family} {args.dtype}: first call without / with background builds, median "
        f"{statistics.median(ratios):.3f}x (min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} rounds"
    )


if __name__ == "__main__":
    main()
