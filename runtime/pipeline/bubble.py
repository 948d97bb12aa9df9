"""The pipeline bubble: measured from one step's action timestamps, predicted by the cost model.

Measured (per rank, per step): 1 - busy / step, where busy sums the rank's compute intervals
(forward, backward or its input/weight halves, the loss) and step is the wall time of the schedule's
`step()` on that rank. The first step is left out when there are more (it infers shapes and warms up).

Predicted: the cost model's event simulation (`cost_model.pipeline.simulate_actions`) of the
schedule's own per-rank action lists (the engine's `pipeline_order`), with the cost model's task
times in seconds (`estimate_step(...).chunks`; without them, a chunk's forward in proportion to its
layers and the backward twice the forward, split evenly into input and weight gradients), and what
the calibration run measured on the same process group (`calibration.measure_overheads`): the
runtime's work per action, a message's delivery to a rank waiting for it (`delivery_s`, measured in that
run; at least the link's p2p time), the late receive of gloo's rendezvous sends (where the engine posts each
receive: `schedules.receive_posts`), where it posts each send (`schedules.send_posts`: DualPipeV's overlapped
forward and backward send after both), what a send posted to a rank already waiting for it holds its sender
(`ready_send_s`), the step's head and tail, and the host's
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
    time_slice_slots,
)


def measured_bubble(records_by_rank: list, stages: int) -> dict:
    """`records_by_rank`: per rank (pipeline rank, [(step seconds, intervals, step start), ...]). Returns the
    mean bubble over ranks and steps, the mean per pipeline rank, and the mean task times (kind -> per chunk
    seconds)."""
    per_rank, by_stage, by_step = [], defaultdict(list), defaultdict(list)
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    actions: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    starts: dict[tuple[str, int, int], list[tuple[float, float]]] = defaultdict(list)
    origin: dict[int, float] = {}  # per step: the earliest rank's step start (one host clock)
    for _, records in records_by_rank:
        for step, (_, _, *started) in enumerate(records):
            if started:
                origin[step] = min(origin.get(step, started[0]), started[0])
    for stage_rank, records in records_by_rank:
        fractions = []
        for step, (seconds, intervals, *_) in enumerate(records):
            busy = sum(i.end - i.start for i in intervals)
            fractions.append(max(0.0, 1.0 - busy / seconds) if seconds > 0 else 0.0)
            by_step[step].append(fractions[-1])
            for i in intervals:
                durations[(i.kind, i.stage)].append(i.end - i.start)
                actions[(i.kind, i.stage, i.microbatch)].append(i.end - i.start)
                if step in origin:
                    starts[(i.kind, i.stage, i.microbatch)].append((i.start - origin[step], i.end - origin[step]))
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
        # the spread behind the mean: each step's bubble (mean over ranks), each action's mean seconds
        "per_step": [statistics.fmean(by_step[step]) for step in sorted(by_step)],
        "action_seconds": [[*key, statistics.fmean(values)] for key, values in sorted(actions.items())],
        # each action's mean start and end from the step's first start (for an action-by-action comparison
        # with the simulation's `timeline`)
        "timeline": [
            [*key, statistics.fmean(a for a, _ in values), statistics.fmean(b for _, b in values)]
            for key, values in sorted(starts.items(), key=lambda item: statistics.fmean(a for a, _ in item[1]))
        ],
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


def ready_send_price(schedule: str, overheads) -> float | None:
    """What a send posted to a rank already waiting for it costs its sender under `schedule`: the engine's 1F1B
    loop waits on each batch of sends and receives it posts before it computes on (`Schedule1F1B`), so its price
    is the one measured with the sender waiting for its send; GPipe and the lowered runtime (interleaved, ZB-V,
    DualPipeV) compute on and wait for their sends at the end of the step. None where it was not measured."""
    field = "ready_send_waited_s" if schedule == "1f1b" else "ready_send_s"
    return getattr(overheads, field, None)


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
    `calibration.PipelineOverheads`), the per-action runtime work, the measured delivery per cross-rank
    dependency (at the engine's send posts), the late receive where the engine posts a receive after its
    message was sent, the host's
    slowdowns (mean over `slowdown_windows`) and the step's head and tail; `cores`: the cores the pipeline's
    ranks share (None: one
    each), handed out in the calibration's measured time slices (`slice_s`) where the ranks outnumber them. Beside it the papers' closed form (GPipe, 1F1B, interleaved), the simulation without the
    runtime's costs (`predicted_compute_only`), and with `measured_times` the same simulation fed with
    the measured task times (what the model explains when its compute times are right)."""
    from trex.runtime.pipeline.schedules import compute_actions, receive_posts, send_posts

    orders = compute_actions(pipe)
    stages = len(split.chunks)
    times = task_times or model_task_times(split.layers_per_chunk)
    runtime = {}
    if overheads is not None and task_times is not None:
        runtime = {
            "p2p": overheads.delivery_s,
            "overhead": overheads.action_s,
            "cores": cores,
            "late_recv": overheads.late_recv_s,
            "late_recv_idle": overheads.late_recv_idle_s,
            "posts": receive_posts(pipe, orders),
            "sends": send_posts(pipe, orders),
            "slice_s": getattr(overheads, "slice_s", None),
            "ready_send": ready_send_price(schedule, overheads),
        }
    edges = {"head": overheads.head_s, "tail": overheads.tail_s} if runtime else {}

    slowdowns = getattr(overheads, "slowdowns", ()) if runtime else ()
    sliced = bool(runtime) and time_slice_slots(cores, runtime["slice_s"], len(orders)) is not None
    # With time slices the calibration's task slowdowns are mostly its ranks' own turns for the cores (pp=4 on 2
    # cores: p10-p90 0.54-2.2 of the median, against 0.92-1.11 with a core per rank, RESULTS 14.10's run), which
    # the slices simulate: replayed on top, they would be counted twice.
    replayed = () if sliced else slowdowns

    def bubble(durations: dict, replay: tuple = (), **costs) -> float:
        if not (costs and replay):
            tasks = simulate_actions(orders, durations, stages, **costs)
            return simulated_bubble(tasks, own_span=True, **(edges if costs else {}))
        samples = [
            simulated_bubble(
                simulate_actions(orders, durations, stages, extra=slowed_actions(durations, step), **costs),
                own_span=True,
                **edges,
            )
            for step in replay
        ]
        return statistics.fmean(samples)

    out = {"predicted": bubble(times, replayed, **runtime), "predicted_compute_only": bubble(times)}
    if runtime.get("ready_send") is not None:
        # the model before RESULTS 14.13 on the same run: posting a send to a rank already waiting costs nothing
        out["predicted_sends_free"] = bubble(times, replayed, **{**runtime, "ready_send": None})
    if sliced and runtime.get("ready_send") is not None:
        # the previous model on the same run (RESULTS 14.17): a send's hold lets the sender's core go, then it queues
        out["predicted_hold_releases_core"] = bubble(times, replayed, **{**runtime, "hold_on_core": False})
    if sliced:  # the previous model on the same run (RESULTS 14.10): every working rank shares the cores at once
        out["predicted_processor_sharing"] = bubble(times, slowdowns, **{**runtime, "slice_s": None})
    if runtime.get("late_recv_idle") is not None:
        # the previous model on the same run: every late receive priced as if its sender were computing
        out["predicted_sender_always_computing"] = bubble(times, replayed, **{**runtime, "late_recv_idle": None})
    if schedule in CLOSED_FORM_SCHEDULES:
        out["predicted_closed_form"] = closed_form_bubble(schedule, split.pp, split.vpp, microbatches)
    if measured_times is not None:
        measured = {kind: list(values) for kind, values in measured_times.items() if kind != "L"}
        measured["F"] = [f + loss for f, loss in zip(measured["F"], measured_times.get("L", [0.0] * stages))]
        # measured task times already carry the cores' time-sharing: no processor sharing on top
        costs = {**runtime, "cores": None} if runtime else {}
        out["simulated_with_measured_tasks"] = bubble(measured, slowdowns, **costs)
        # one simulated step with the measured mean task times and the runtime's costs, no slowdowns replayed:
        # the action-by-action counterpart of the measured `timeline` (head: the step's start before time 0)
        head = edges.get("head", 0.0)
        out["timeline_with_measured_tasks"] = [
            [t.kind, t.stage, t.microbatch, head + t.start, head + t.end]
            for t in sorted(simulate_actions(orders, measured, stages, **costs), key=lambda t: t.start)
        ]
    return out
