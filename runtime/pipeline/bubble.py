"""The pipeline bubble: measured from one step's action timestamps, predicted by the cost model.

Measured (per rank, per step): 1 - busy / step, where busy sums the rank's compute intervals
(forward, backward or its input/weight halves, the loss) and step is the wall time of the schedule's
`step()` on that rank. The first step is left out when there are more (it infers shapes and warms up).

Predicted: the cost model's event simulation (`cost_model.pipeline.simulate_actions`) of the
schedule's own per-rank action lists (the engine's `pipeline_order`), with the cost model's task
times in seconds (`estimate_step(...).chunks`; without them, a chunk's forward in proportion to its
layers and the backward twice the forward, split evenly into input and weight gradients), and what
the calibration run measured on the same process group (`calibration.measure_overheads`): the
runtime's work per action, the link's p2p time, the late receive of gloo's rendezvous sends (where
the engine posts each receive: `schedules.receive_posts`), the step's head and tail, and the host's
slowdowns, replayed onto the actions over several sampled windows. For GPipe, 1F1B and interleaved
1F1B the papers' closed form is reported next to it (`closed_form_bubble`). A third number simulates
the same action lists with the *measured* mean task times: how much of the measured bubble the
model explains when its compute times are right.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from trex.cost_model.pipeline import (
    CLOSED_FORM_SCHEDULES,
    closed_form_bubble,
    simulate_actions,
    simulated_bubble,
    slowed_actions,
)


def measured_bubble(records_by_rank: list, stages: int) -> dict:
    """`records_by_rank`: per rank (pipeline rank, [(step seconds, intervals, step start), ...]). Returns the
    mean bubble over ranks and steps, the mean per pipeline rank, and the mean task times (kind -> per chunk
    seconds)."""
    per_rank, by_stage = [], defaultdict(list)
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    for stage_rank, records in records_by_rank:
        fractions = []
        for seconds, intervals, *_ in records:
            busy = sum(i.end - i.start for i in intervals)
            fractions.append(max(0.0, 1.0 - busy / seconds) if seconds > 0 else 0.0)
            for i in intervals:
                durations[(i.kind, i.stage)].append(i.end - i.start)
        if fractions:
            per_rank.append(statistics.fmean(fractions))
            by_stage[stage_rank].append(statistics.fmean(fractions))
    times = {
        kind: [statistics.fmean(durations[(kind, s)]) if durations.get((kind, s)) else 0.0 for s in range(stages)]
        for kind in ("F", "B", "I", "W", "L")
    }
    return {
        "bubble": statistics.fmean(per_rank) if per_rank else None,
        "by_stage": [statistics.fmean(by_stage[s]) for s in sorted(by_stage)],
        "task_seconds": times,
    }


def split_backward(backward: list[float]) -> dict[str, list[float]]:
    """The backward's input- and weight-gradient passes: halves (GEMMs of equal FLOPs), except on the first
    chunk, whose input is token ids: it has no input gradient, and its weight pass runs the whole backward
    (measured: its input pass takes ~0.1 ms, its weight pass as long as a full backward)."""
    inputs = [0.0 if c == 0 else b / 2 for c, b in enumerate(backward)]
    return {"I": inputs, "W": [b - i for b, i in zip(backward, inputs)]}


def model_task_times(layers_per_chunk: tuple[int, ...]) -> dict[str, list[float]]:
    """Relative task times per chunk (forward in proportion to the layers, see the module docstring): the
    fallback when the cost model cannot price the chunks in seconds."""
    forward = [float(n) for n in layers_per_chunk]
    backward = [2 * f for f in forward]
    return {"F": forward, "B": backward, **split_backward(backward)}


def chunk_task_times(chunks) -> dict[str, list[float]]:
    """The cost model's seconds per micro-batch of each chunk (`StepEstimate.chunks`): forward, backward,
    and the backward's input- and weight-gradient passes (`split_backward`)."""
    forward = [c.forward_s for c in chunks]
    backward = [c.backward_s for c in chunks]
    return {"F": forward, "B": backward, **split_backward(backward)}


def predicted_bubble(
    pipe,
    schedule: str,
    split,
    microbatches: int,
    measured_times: dict | None = None,
    task_times: dict | None = None,
    overheads=None,
    cores: float | None = None,
) -> dict:
    """The predicted bubble: the simulation of the schedule's own action lists with the cost model's task
    times in seconds (`task_times`, relative ones when None) and, with `overheads` (a measured
    `calibration.PipelineOverheads`), the per-action runtime work, the link's p2p time per cross-rank
    dependency, the late receive where the engine posts a receive after its message was sent, the host's
    slowdowns (mean over `slowdown_windows`) and the step's head and tail; `cores`: the cores the pipeline's
    ranks share (None: one
    each). Beside it the papers' closed form (GPipe, 1F1B, interleaved), the simulation without the
    runtime's costs (`predicted_compute_only`), and with `measured_times` the same simulation fed with
    the measured task times (what the model explains when its compute times are right)."""
    from trex.runtime.pipeline.schedules import compute_actions, receive_posts

    orders = compute_actions(pipe)
    stages = len(split.chunks)
    times = task_times or model_task_times(split.layers_per_chunk)
    runtime = {}
    if overheads is not None and task_times is not None:
        runtime = {
            "p2p": overheads.p2p_s,
            "overhead": overheads.action_s,
            "cores": cores,
            "late_recv": overheads.late_recv_s,
            "posts": receive_posts(pipe, orders),
        }
    edges = {"head": overheads.head_s, "tail": overheads.tail_s} if runtime else {}

    slowdowns = getattr(overheads, "slowdowns", ()) if runtime else ()

    def bubble(durations: dict, **costs) -> float:
        if not (costs and slowdowns):
            tasks = simulate_actions(orders, durations, stages, **costs)
            return simulated_bubble(tasks, own_span=True, **(edges if costs else {}))
        samples = [
            simulated_bubble(
                simulate_actions(orders, durations, stages, extra=slowed_actions(durations, step), **costs),
                own_span=True,
                **edges,
            )
            for step in slowdowns
        ]
        return statistics.fmean(samples)

    out = {"predicted": bubble(times, **runtime), "predicted_compute_only": bubble(times)}
    if schedule in CLOSED_FORM_SCHEDULES:
        out["predicted_closed_form"] = closed_form_bubble(schedule, split.pp, split.vpp, microbatches)
    if measured_times is not None:
        measured = {kind: list(values) for kind, values in measured_times.items() if kind != "L"}
        measured["F"] = [f + loss for f, loss in zip(measured["F"], measured_times.get("L", [0.0] * stages))]
        # measured task times already carry the cores' time-sharing: no processor sharing on top
        out["simulated_with_measured_tasks"] = bubble(measured, **{**runtime, "cores": None} if runtime else {})
    return out
