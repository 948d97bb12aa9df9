"""Measure a real local instance and fit its step latencies: the check that the fitted model holds.

The instance is the worker itself: its model (`worker.TinyEngine`, a tiny random-init transformers
Llama on this CPU with `threads` threads) driven through the worker's continuous-batching engine
(`batching.BatchingEngine`), so what is timed is exactly the worker's two kinds of step:

* prefill: one prompt alone (the worker prefills one prompt per step), at several prompt lengths;
* decode: one step over a batch of `B` running sequences of `c` tokens each (the left-padded
  batch cache, the attention mask, RoPE positions - the worker's code path), at several B and c;
* re-pack: the copy of a batch's cache that the engine makes when a sequence joins or leaves, on
  batches of unequal contexts as in service (every shorter row is padded), at the decode grid's
  sizes (fitted as r0 + r_ctx * context tokens; charged by the simulator to the decode step after a
  join or leave).

Each point is the median of `repeats` timed runs after `warmup` untimed rounds (the median, not the
minimum: the simulator must predict a typical step, and one lucky run is not one); the runs are
interleaved - every round times each point once - so a burst of other load spreads thin. The default
clock on one thread is the thread's CPU time, which other processes on a shared machine cannot
inflate. The least-squares fit (`latency_fit.fit_latency`) sees only the `fit_batches` and the
prompt lengths not in `held_out_prompts`; the rest are held out and `FitCheck` reports how far the
fit is from their measurements, per step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from trex.workloads.serving.batching import BatchedRequest, BatchingEngine
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.instance_model import EngineLimits
from trex.workloads.serving.latency_fit import FitCheck, LatencyModel, StepSample, fit_latency, holdout_error
from trex.workloads.serving.worker import TinyEngine, WorkerModelConfig


@dataclass(frozen=True)
class ProfileGrid:
    prompt_lengths: tuple[int, ...] = (8, 16, 24, 32, 48, 64, 80, 96, 128, 160)
    held_out_prompts: tuple[int, ...] = (24, 80)
    decode_contexts: tuple[int, ...] = (16, 48, 96, 192)
    decode_batches: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    fit_batches: tuple[int, ...] = (1, 3, 4, 8, 16)  # the rest (2, 6, 12) are held out
    repeats: int = 7
    warmup: int = 2


FAST_GRID = ProfileGrid(
    prompt_lengths=(8, 24, 48, 96),
    held_out_prompts=(24,),
    decode_contexts=(16, 64),
    decode_batches=(1, 2, 4, 8),
    fit_batches=(1, 4, 8),
    repeats=3,
    warmup=1,
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
    limits: EngineLimits = EngineLimits(max_num_seqs=16, max_prefill_seqs=1)


def _interleaved(runs: dict, grid: ProfileGrid, clock) -> dict:
    """The median time of each run over `repeats` rounds after `warmup` rounds; every round times each
    run once, so a burst of load on a shared machine spreads over many points instead of ruining one."""
    times: dict = {key: [] for key in runs}
    for round_ in range(grid.warmup + grid.repeats):
        for key, run in runs.items():
            start = clock()
            run()
            if round_ >= grid.warmup:
                times[key].append(clock() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def profile_instance(
    config: WorkerModelConfig,
    threads: int | None = None,
    grid: ProfileGrid = ProfileGrid(),
    seed: int = 0,
    clock: str = "auto",
    max_num_seqs: int = 16,
) -> ProfileResult:
    """`clock`: "wall", "cpu" (the profiling thread's CPU time: immune to other processes on a
    shared machine, exact only with one intra-op thread) or "auto" (cpu with threads=1, else wall)."""
    if clock not in ("auto", "wall", "cpu"):
        raise ServingError(f"clock must be auto, wall or cpu (got {clock!r})")
    if clock == "cpu" and threads != 1:
        raise ServingError("the cpu clock measures one thread: use --threads 1 with it, or --clock wall")
    if max(grid.decode_batches) > max_num_seqs:
        raise ServingError(
            f"the grid decodes batches up to {max(grid.decode_batches)} but the worker batches at most "
            f"{max_num_seqs} (--max-num-seqs)"
        )
    use_cpu = clock == "cpu" or (clock == "auto" and threads == 1)
    clock_fn = time.thread_time if use_cpu else time.perf_counter
    engine = TinyEngine(config, threads)
    torch = engine.torch
    if threads:
        torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(seed)

    def prompt(length: int) -> list[int]:
        return torch.randint(0, config.vocab, (length,), generator=generator).tolist()

    samples: list[StepSample] = []
    with torch.inference_mode():
        prompts = {length: prompt(length) for length in grid.prompt_lengths}
        prefill = BatchingEngine(engine.model, torch, max_num_seqs=max_num_seqs)
        times = _interleaved(
            {length: (lambda ids=ids: prefill.prefill(BatchedRequest(ids, 2))) for length, ids in prompts.items()},
            grid,
            clock_fn,
        )
        for length, seconds in times.items():
            samples.append(StepSample("prefill", 1, length, length * length, 0, seconds))
        batches = {}
        for context in grid.decode_contexts:
            for batch in grid.decode_batches:
                batching = BatchingEngine(engine.model, torch, max_num_seqs=max_num_seqs)
                for _ in range(batch):  # prompts of `context` tokens, each with its first token
                    batching.prefill(
                        BatchedRequest(prompt(context), grid.repeats + grid.warmup + 3)
                    )  # + 3: none finishes
                batching.decode()  # joins the batch (re-pack); the timed steps are plain decode steps
                batches[(context, batch)] = batching
        times = _interleaved({key: batching.decode for key, batching in batches.items()}, grid, clock_fn)
        middle = 1 + grid.warmup + grid.repeats // 2  # tokens the median step's sequences hold beyond the prompt
        for (context, batch), seconds in times.items():
            samples.append(StepSample("decode", batch, batch, 0, batch * (context + middle), seconds))
        # re-packing a batch's cache (what the engine does when a sequence joins or leaves). In service the
        # sequences' contexts differ - they arrived at different times with different prompts - so every row
        # shorter than the longest is padded (a new zero block and a concatenation per row and layer), which a
        # batch of equal contexts never does: measured on a 6x384 worker, B = 8, 8.1 ms equal, 22.6 ms ragged.
        # Time it on ragged batches: contexts spread evenly over [context / 2, 3 context / 2], the decode
        # grid's batch sizes and tokens in all
        ragged = {}
        for context in grid.decode_contexts:
            for batch in grid.decode_batches:
                batching = BatchingEngine(engine.model, torch, max_num_seqs=max_num_seqs)
                for i in range(batch):
                    length = max(1, round(context * (0.5 + (i + 0.5) / batch)))
                    batching.prefill(BatchedRequest(prompt(length), 3))
                batching.decode()  # joins the batch
                ragged[(context, batch)] = batching
        repacks = {key: (lambda b=batching: b.batch.repack([])) for key, batching in ragged.items()}
        times = _interleaved(repacks, grid, clock_fn)
        for (context, batch), seconds in times.items():
            held_context = sum(seq.context for seq in ragged[(context, batch)].batch.sequences)
            samples.append(StepSample("repack", batch, 0, 0, held_context, seconds))
    held_prompts = set(grid.held_out_prompts)

    def held(sample: StepSample) -> bool:
        if sample.kind == "prefill":
            return sample.tokens in held_prompts
        if sample.kind == "repack":
            return False
        return sample.seqs not in grid.fit_batches

    fit_samples = [s for s in samples if not held(s)]
    held_out = [s for s in samples if held(s)]
    clock_name = "thread CPU time" if use_cpu else "wall clock"
    source = (
        f"measured ({clock_name}, median of {grid.repeats}): {config.describe()}, "
        f"{threads or torch.get_num_threads()} threads, continuous batching up to {max_num_seqs}"
    )
    fitted = fit_latency(fit_samples, source=source)
    return ProfileResult(
        config,
        threads,
        samples,
        fit_samples,
        held_out,
        fitted,
        holdout_error(fitted, held_out) if held_out else FitCheck(float("nan"), float("nan"), 0, None),
        "cpu" if use_cpu else "wall",
        EngineLimits(max_num_seqs=max_num_seqs, max_prefill_seqs=1),
    )
