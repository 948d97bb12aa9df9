"""What the garbage collector costs trex's cold first call, with and without `trex.collector` (the objects alive
before the compile frozen, fewer full collections), and torch.compile's first call beside them.

    OMP_NUM_THREADS=1 python bench/compile_collector.py --family deepseek-v4 --dtype bf16

In one process (the set-up of `bench/compile_and_step.py`: tiny model, batch 4 x 32, Inductor's caches off,
compilers warmed up): trex's first call (capture + compile + one training step) as it compiles by default,
trex's first call with the collector as the process has it (`skip_existing_objects` and `freeze_survivors`
replaced by no-ops), then torch.compile's. Printed for each: wall seconds, CPU seconds of the main thread, the
main thread's seconds inside collections (from `gc.callbacks`) and those of full collections, the number of
collections per generation, and the process's peak RSS so far.

Why: collection time is CPU time of the compiling thread, so it can be compared on a loaded machine, where
the first call's wall time moves by 2x between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import resource
import time

import compile_and_step as bench  # bench/ is the script's directory, first on sys.path
import torch

import trex
import trex.driver as driver


class CollectionClock:
    """The calling thread's CPU seconds inside the garbage collector, per generation (gc.callbacks)."""

    def __init__(self):
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.seconds[info["generation"]] += time.thread_time() - self._start
            self.count[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds, self.count = [0.0, 0.0, 0.0], [0, 0, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="deepseek-v4")
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    args = parser.parse_args()
    model, input_ids = bench.cold_compile_setup(args.family, args.dtype)
    clock = CollectionClock()
    skip, survivors = driver.skip_existing_objects, driver.freeze_survivors
    variants = [  # trex.collector's variant first: what the process's first trex compile pays once falls on it
        ("trex (trex.collector)", trex.compile, True),
        ("trex, collector as the process has it", trex.compile, False),
        ("torch.compile", lambda m: torch.compile(m, fullgraph=True), True),
    ]
    for name, compile_fn, collector in variants:
        driver.skip_existing_objects = skip if collector else contextlib.nullcontext
        driver.freeze_survivors = survivors if collector else (lambda: None)
        torch._dynamo.reset()
        gc.collect()
        module = copy.deepcopy(model)
        clock.reset()
        start, start_cpu = time.perf_counter(), time.thread_time()
        bench.TrainStep(compile_fn(module), module.parameters(), input_ids).step()
        wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{args.family} {args.dtype} {name:40s}: first call {wall:6.1f} s, main thread CPU {cpu:6.1f} s, "
            f"in collections {sum(clock.seconds):5.2f} s (full {clock.seconds[2]:5.2f} s), collections per "
            f"generation {clock.count}, peak RSS so far {rss:.0f} MiB",
            flush=True,
        )
    driver.skip_existing_objects, driver.freeze_survivors = skip, survivors


if __name__ == "__main__":
    main()
