"""Measure a real local instance and fit its step latencies: the check that the fitted model holds.

The instance is the worker's model (`worker.TinyEngine`: a tiny random-init transformers Llama on
this CPU with `threads` threads). Prefill steps are timed over batches of equal-length prompts,
decode steps over batches holding a KV cache of a given context; each point is the median of a few
repetitions. The least-squares fit (`latency_fit.fit_latency`) sees only the `fit_batches`; the
other batch sizes are held out, and `FitCheck` reports how far the fit is from their measurements.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

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


FAST_GRID = ProfileGrid(prompt_lengths=(16, 48, 96), prefill_batches=(1, 2, 4), decode_contexts=(32, 128),
                        decode_batches=(1, 2, 4, 8), fit_batches=(1, 4, 8), repeats=3)


@dataclass(frozen=True)
class ProfileResult:
    config: WorkerModelConfig
    threads: int | None
    samples: list[StepSample]
    fit_samples: list[StepSample]
    held_out: list[StepSample]
    model: LatencyModel
    check: FitCheck


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_instance(config: WorkerModelConfig, threads: int | None = None, grid: ProfileGrid = ProfileGrid(), seed: int = 0) -> ProfileResult:
    engine = TinyEngine(config, threads)
    torch, model = engine.torch, engine.model
    if threads:
        torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(seed)
    samples: list[StepSample] = []
    with torch.inference_mode():
        model(input_ids=torch.zeros((1, 8), dtype=torch.long))  # warm-up: first-call allocations
        for length in grid.prompt_lengths:
            for batch in grid.prefill_batches:
                ids = torch.randint(0, config.vocab, (batch, length), generator=generator)
                seconds = _median_s(lambda: model(input_ids=ids, use_cache=True), grid.repeats)
                samples.append(StepSample("prefill", batch, batch * length, batch * length * length, 0, seconds))
        for context in grid.decode_contexts:
            for batch in grid.decode_batches:
                ids = torch.randint(0, config.vocab, (batch, context), generator=generator)
                past = model(input_ids=ids, use_cache=True).past_key_values
                step = torch.randint(0, config.vocab, (batch, 1), generator=generator)
                times = []
                for _ in range(grid.repeats):
                    start = time.perf_counter()
                    past = model(input_ids=step, past_key_values=past, use_cache=True).past_key_values
                    times.append(time.perf_counter() - start)
                samples.append(StepSample("decode", batch, batch, 0, batch * (context + grid.repeats // 2), statistics.median(times)))
    fit_samples = [s for s in samples if s.seqs in grid.fit_batches]
    held_out = [s for s in samples if s.seqs not in grid.fit_batches]
    fitted = fit_latency(fit_samples, source=f"measured: {config.describe()}, {threads or torch.get_num_threads()} threads")
    return ProfileResult(config, threads, samples, fit_samples, held_out, fitted, holdout_error(fitted, held_out))
