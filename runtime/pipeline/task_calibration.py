"""Each pipeline action's compute time, measured on the stage's own chunk with the engine's own backward code.

The simulation of a schedule (`cost_model.pipeline.simulate_actions`) needs, per chunk, the time of its
forward (F), its full backward (B) and, for the zero-bubble schedules, the backward's input-gradient (I) and
weight-gradient (W) passes. The cost model prices a chunk from its FLOPs and bytes; for the chunks trained
on CPU here (tiny MoE models: hidden 128, one micro-batch of 64 tokens) that is 2-3x short, because such a
chunk's time is not its GEMMs' arithmetic but the fixed cost of every operator call and autograd node
(dispatch, allocation, the engine's bookkeeping), which the FLOP pricing does not see.

The split backward shows it most. torch.distributed.pipelining runs I as `stage_backward_input` and W as
`stage_backward_weight` (`torch/distributed/pipelining/_backward.py`). Splitting halves the GEMM FLOPs
(dX = dY W^T in I, dW = X^T dY in W) but not the fixed costs, and it adds its own:

* I walks the whole autograd graph in Python twice before differentiating (`construct_reverse_graph`, then
  `get_param_groups`: a reverse closure from every parameter), registers a Python pre-hook on every node
  where a parameter's path meets the input's, and then evaluates every autograd node on the path to the
  chunk's input - all of them but the parameter leaves' own - with all their non-GEMM operators (norms,
  softmax, routing, index/scatter, attention's backward, which sit on the input path only);
* W calls `torch.autograd.grad` once per parameter group - each parameter is its own group in these
  layers - each call a new graph task from the saved intermediates to the parameter, and re-evaluates the
  nodes between (the weight GEMMs, and the per-expert index/select backward of the MoE experts);
* the first chunk (token ids in, no input gradient) skips I, and its W is the whole backward (the engine's
  `backward_weight_one_chunk` for stage 0).

Measured on the bench model's middle 2-layer chunk (bench lock, bench/RESULTS.md 14.4): B runs 203 autograd nodes
and ~1,800 ATen calls in ~4.2 ms; I runs 167 nodes and ~1,240 ATen calls in ~3.8 ms; W runs 58 nodes, ~670
ATen calls and 22 `autograd.grad` calls in ~4.0 ms. So I + W ~ 2 B here, where a FLOP model says I + W = B.
On a large model on an accelerator the GEMMs dominate and the split costs what FLOPs say.

So the times are measured, not modelled, once per job and chunk, before the schedule is simulated, by
running what the stage runs: the chunk's forward (with the loss on the last chunk) on a real micro-batch
(the first chunk's token ids; for the other chunks, hidden states of the activation's shape), the engine's
`stage_backward` (B), and, when the schedule splits the backward, `stage_backward_input` and then
`stage_backward_weight` on a fresh forward (I, W; on the first chunk I = 0 and W is `stage_backward`).
Median over repeats after warm-ups; the collector paused, as in the step. Ranks of different pipeline
stages take turns (a barrier between turns) so each time is the chunk's own on an otherwise idle host: the
simulation applies the cores' sharing itself (`cores`). Ranks of the same pipeline stage (its data- and
expert-parallel replicas) measure together, since the chunk's forward may hold their collectives (the
experts' all-to-all). The parameters' gradients are saved before and restored after.

Each turn starts with one more sample of the rank's first chunk, kept apart (`first_in_turn`), before the
samples that are medianed. The first passes a rank runs after its wait in the barrier (the other ranks' turns,
20-40 ms asleep) are slow: in the lead's idle bench runs (bench/RESULTS.md 14.14) the first forward of each
rank's turn was calibrated 15-35% above the same chunk's forward in the training run (GPipe / 1F1B m=8: 7.7 /
8.2 ms against 6.4 / 6.5; ZB-V m=8 chunks 0 and 1: 5.1 / 5.2 against 4.2 / 3.9), while the rank's second chunk,
timed next, came within a few percent (3.5 / 3.7 against 3.7 / 3.9). In the training run a rank waits a few ms
at most between its actions, so its passes are the warm ones. Timed first in its turn, the first chunk looked
slower than its neighbours: an imbalance between chunks the training does not have, which the simulation then
turns into bubble. The cold sample is returned too, so the bench can price the old calibration on the same run.

With `concurrent` the same samples are also taken with every pipeline rank at once, after the turns of each round
(a diagnostic the bubble bench asks for; the prediction does not use them). On the quiet host they came out equal
to the in-turn ones (within ~5% per chunk), and the training's own passes ran 1.05-1.25x above both (bench/
RESULTS.md 14.16): with a core per rank, running beside the other rank is not what slows the training's passes.
They differ where another process holds a core: then the ranks at once share what is left, as the training does.

The turns go sample by sample (each round, every rank in turn times one micro-batch of each of its chunks),
not rank by rank. A shared host's speed drifts over seconds (other processes, the cores' clocks); when each
rank took all its samples in one window of its own, the median of each chunk carried its window's speed,
and two equal chunks came out unequal: on the bench model (pp=2, two 4-layer chunks) the calibrated forwards
of the two ranks differed by up to 1.6x within one job (11.4 vs 18.0 ms) while the same job's run measured
16.7 vs 20.0 ms, and a spurious imbalance between stages is bubble the simulation then predicts (bench/
RESULTS.md 14.5). With the samples interleaved, a slow window slows every chunk's sample of that round alike
and the medians keep the chunks' real ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.distributed as dist

KINDS = ("F", "B", "I", "W")


def chunk_task_sampler(
    chunk: torch.nn.Module,
    first: bool,
    last: bool,
    make_input: Callable[[], torch.Tensor],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    split_backward: bool,
    context: Callable[[], object] = nullcontext,
) -> Callable[[], tuple[float, float, float, float]]:
    """A function that runs one micro-batch's F, B and (with `split_backward`) I and W through `chunk` and
    returns their seconds (I and W 0 when not split); see `time_chunk_tasks` for the arguments."""
    from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

    def forward() -> tuple[torch.Tensor, torch.Tensor, float]:
        x = make_input()
        start = time.perf_counter()
        with context():
            out = chunk(x)
            if last:
                out = loss_of(out)
        return x, out, time.perf_counter() - start

    def output_grads(out: torch.Tensor) -> list[torch.Tensor] | None:
        return None if last else [torch.randn_like(out)]  # the last chunk differentiates its loss

    def timed(function: Callable, *args) -> tuple[object, float]:
        start = time.perf_counter()
        with context():
            result = function(*args)
        return result, time.perf_counter() - start

    def sample() -> tuple[float, float, float, float]:
        x, out, seconds = forward()
        _, backward = timed(stage_backward, out if last else [out], output_grads(out), [x])
        inputs = weights = 0.0
        if split_backward:
            x, out, _ = forward()
            grads = output_grads(out)
            if first:  # the engine skips the first stage's input pass; its weight pass is the full backward
                _, weights = timed(stage_backward, out if last else [out], grads, [x])
            else:
                (_, groups), inputs = timed(stage_backward_input, [out], grads, [x], chunk.parameters())
                _, weights = timed(stage_backward_weight, chunk.parameters(), groups)
        return seconds, backward, inputs, weights

    return sample


def time_chunk_tasks(
    chunk: torch.nn.Module,
    first: bool,
    last: bool,
    make_input: Callable[[], torch.Tensor],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    split_backward: bool,
    repeats: int = 7,
    warmups: int = 2,
    context: Callable[[], object] = nullcontext,
) -> dict[str, float]:
    """Median seconds of one micro-batch's F, B, I and W through `chunk` (see the module docstring);
    `make_input()`: a fresh input (token ids for the first chunk, else a hidden-state tensor that requires
    grad); `loss_of(output)`: the last chunk's loss; `split_backward`: also time the I and W passes (else
    they are 0); `context()`: entered around every pass (the step's autocast)."""
    sample = chunk_task_sampler(chunk, first, last, make_input, loss_of, split_backward, context)
    samples = [sample() for _ in range(warmups + repeats)][warmups:]
    return {kind: statistics.median(values) for kind, values in zip(KINDS, zip(*samples))}


def measure_stage_tasks(*args, **kwargs) -> dict[str, list[float]]:
    """The task times of `measure_stage_tasks_first_in_turn` (same arguments), without the opening samples'."""
    return measure_stage_tasks_first_in_turn(*args, **kwargs)[0]


def measure_stage_tasks_first_in_turn(
    chunks: list,
    runners: list[torch.nn.Module],
    make_input: Callable[[object], torch.Tensor],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    split_backward: bool,
    stage_rank: int,
    pp: int,
    chunk_count: int,
    pipeline_group,
    context: Callable[[], object] = nullcontext,
    repeats: int = 9,
    warmups: int = 2,
    concurrent: bool = False,
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]] | None]:
    """Per task kind, the seconds of every chunk of the pipeline (chunk index order), measured by the rank that
    runs it, the pipeline ranks taking turns sample by sample (see the module docstring): each round, every
    rank in turn runs one sample of each of its chunks (`chunk_task_sampler`), after a first sample of its first
    chunk that is kept apart; the median over the rounds after `warmups`. Every rank of the world calls it;
    `chunks`: this rank's `ChunkModule`s, `runners`: what runs them (the chunk or its compiled module);
    `make_input(chunk)`: a fresh input for the chunk. Returned with the same times where each rank's first chunk
    is timed by the samples that open its turns (right after the barrier: the calibration before that sample was
    kept apart), and, with `concurrent` (else None), with every chunk timed by the samples that all pipeline ranks
    take at once after the turns of each round (the ranks beside each other, as in the training run; each rank's
    first sample of that phase kept apart too: the rank that slept through the last turn opens it cold)."""
    from trex.runtime.pipeline.timing import collector_paused

    params = [p for runner in runners for p in runner.parameters()]
    saved = [(p, None if p.grad is None else p.grad.detach().clone()) for p in params]
    samplers = {
        module.chunk.index: chunk_task_sampler(
            runner,
            module.chunk.first,
            module.chunk.last,
            lambda module=module: make_input(module),
            loss_of,
            split_backward,
            context,
        )
        for module, runner in zip(chunks, runners)
    }
    samples: dict[int, list[tuple[float, ...]]] = {index: [] for index in samplers}
    opening = next(iter(samplers), None)  # the rank's first chunk: it opens every turn
    cold: list[tuple[float, ...]] = []
    together: dict[int, list[tuple[float, ...]]] = {index: [] for index in samplers}
    try:
        for round_ in range(warmups + repeats):
            for turn in range(pp):
                if turn == stage_rank:
                    with collector_paused():
                        if opening is not None:
                            times = samplers[opening]()
                            if round_ >= warmups:
                                cold.append(times)
                        for index, sample in samplers.items():
                            times = sample()
                            if round_ >= warmups:
                                samples[index].append(times)
                dist.barrier()
            if not concurrent:
                continue
            with collector_paused():  # the same samples with every rank at once, as the training runs them
                if opening is not None:  # the rank that slept through the last turn opens cold: kept apart
                    samplers[opening]()
                for index, sample in samplers.items():
                    times = sample()
                    if round_ >= warmups:
                        together[index].append(times)
            dist.barrier()
    finally:
        for p, grad in saved:
            p.grad = grad

    def medians(rows: list[tuple[float, ...]]) -> dict[str, float]:
        return {kind: statistics.median(values) for kind, values in zip(KINDS, zip(*rows))}

    mine = {index: medians(rows) for index, rows in samples.items()}
    opened = {**mine, opening: medians(cold)} if cold else mine
    at_once = {index: medians(rows) for index, rows in together.items()} if concurrent else mine
    everyone: list = [None] * dist.get_world_size(pipeline_group)
    dist.all_gather_object(everyone, (mine, opened, at_once), group=pipeline_group)
    merged = [{index: times for parts in everyone for index, times in parts[k].items()} for k in range(3)]
    missing = sorted(set(range(chunk_count)) - set(merged[0]))
    if missing:
        raise RuntimeError(f"internal: no task times measured for pipeline chunks {missing}")
    times, opened_times, together_times = (
        {kind: [per_chunk[c][kind] for c in range(chunk_count)] for kind in KINDS} for per_chunk in merged
    )
    return times, opened_times, together_times if concurrent else None


def full_backward_split(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """Times for a schedule that never splits the backward (I and W unmeasured): the split's I and W set from B
    as the engine would run them on the first chunk (W = B) and as halves elsewhere, only so that every kind
    has a value; the simulation of such a schedule never reads them."""
    if any(times["I"]) or any(times["W"]):
        return times
    from trex.runtime.pipeline.bubble import split_backward

    return {"F": times["F"], "B": times["B"], **split_backward(times["B"])}
