"""Measure a real local instance and fit its step latencies: the check that the fitted model holds.

The instance is the worker's model (`worker.TinyEngine`: a tiny random-init transformers Llama on
this CPU with `threads` threads). Prefill steps are timed over batches of equal-length prompts,
decode steps over batches holding a KV cache of a given context; each point is the fastest of a few
repetitions (the machine may be shared: the minimum is the step's own cost, the rest is other
load). The least-squares fit (`latency_fit.fit_latency`) sees only the `fit_batches`; the
other batch sizes are held out, and `FitCheck` reports how far the fit is from their measurements.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.latency_fit import FitCheck, LatencyModel, StepSample, fit_latency, holdout_error
from trex.workloads.serving.worker import TinyEngine, WorkerModelConfig


@dataclass(frozen=True)
class ProfileGrid:
    prompt_lengths: tuple[int, ...] = (16, 48, 96, 160)
    prefill_batches: tuple[int, ...] = (1, 2, 3, 4)
    decode_contexts: tuple[int, ...] = (32, 128, 256)
    decode_batches: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16)
    fit_batches: tuple[int, ...] = (1, 3, 4, 6, 12, 16)  # the rest (2, 8) are held out
    repeats: int = 5


FAST_GRID = ProfileGrid(
    prompt_lengths=(16, 48, 96),
    prefill_batches=(1, 2, 4),
    decode_contexts=(32, 128),
    decode_batches=(1, 2, 4, 8),
    fit_batches=(1, 4, 8),
    repeats=3,
)


@dataclass(frozen=True)
class ProfileResult:
    config: WorkerModelConfig
    threads: int | None
    samples: list[StepSample]
    fit_samples: list[StepSample]
    held_out: list[StepSample]
    model: LatencyModel
    check: FitCheck
    clock: str = "wall"


def _fastest_s(fn, repeats: int, clock) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def profile_instance(
    config: WorkerModelConfig,
    threads: int | None = None,
    grid: ProfileGrid = ProfileGrid(),
    seed: int = 0,
    clock: str = "auto",
) -> ProfileResult:
    """`clock`: "wall", "cpu" (the profiling thread's CPU time: immune to other processes on a
    shared machine, exact only with one intra-op thread) or "auto" (cpu with threads=1, else wall)."""
    if clock not in ("auto", "wall", "cpu"):
        raise ServingError(f"clock must be auto, wall or cpu (got {clock!r})")
    if clock == "cpu" and threads != 1:
        raise ServingError("the cpu clock measures one thread: use --threads 1 with it, or --clock wall")
    use_cpu = clock == "cpu" or (clock == "auto" and threads == 1)
    clock_fn = time.thread_time if use_cpu else time.perf_counter
    engine = TinyEngine(config, threads)
    torch, model, clock = engine.torch, engine.model, clock_fn
    if threads:
        torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(seed)
    samples: list[StepSample] = []
    with torch.inference_mode():
        model(input_ids=torch.zeros((1, 8), dtype=torch.long))  # warm-up: first-call allocations
        for length in grid.prompt_lengths:
            for batch in grid.prefill_batches:
                ids = torch.randint(0, config.vocab, (batch, length), generator=generator)
                seconds = _fastest_s(lambda: model(input_ids=ids, use_cache=True), grid.repeats, clock)
                samples.append(StepSample("prefill", batch, batch * length, batch * length * length, 0, seconds))
        for context in grid.decode_contexts:
            for batch in grid.decode_batches:
                ids = torch.randint(0, config.vocab, (batch, context), generator=generator)
                past = model(input_ids=ids, use_cache=True).cache
                step = torch.randint(0, config.vocab, (batch, 1), generator=generator)
                times = []
                for _ in range(grid.repeats):
                    start = clock()
                    past = model(input_ids=step, cache=past, use_cache=True).cache
                    times.append(clock() - start)
                samples.append(StepSample("decode", batch, batch, 0, batch * (context + grid.repeats // 2), min(times)))
    fit_samples = [s for s in samples if s.seqs in grid.fit_batches]
    held_out = [s for s in samples if s.seqs not in grid.fit_batches]
    clock_name = "thread CPU time" if use_cpu else "wall clock"
    source = f"measured ({clock_name}): {config.describe()}, {threads or torch.get_num_threads()} threads"
    fitted = fit_latency(fit_samples, source=source)
    return ProfileResult(
        config,
        threads,
        samples,
        fit_samples,
        held_out,
        fitted,
        holdout_error(fitted, held_out),
        "cpu" if use_cpu else "wall",
    )
