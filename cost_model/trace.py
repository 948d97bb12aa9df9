"""Chrome-trace (Perfetto) timeline of one estimated training step.

One process per pipeline stage (every data- and tensor-parallel replica of a stage runs the same
timeline), two threads each: `compute` holds one slice per (chunk, micro-batch) forward or
backward from the schedule simulation, `exposed communication` the part of each slice spent in
communication the layer could not hide. After the pipeline come the exposed data-parallel gradient
sync and the optimizer step. The JSON follows the Trace Event Format (`traceEvents` of complete
"X" events with microsecond `ts`/`dur`, "M" metadata naming processes and threads), which
ui.perfetto.dev and chrome://tracing open directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trex.cost_model.pipeline import makespan, simulate
from trex.cost_model.step import StepEstimate

COMPUTE, COMM, STEP = 1, 2, 3
MAX_TASKS = 400_000  # beyond this the trace shows the first micro-batches only


def trace_events(estimate: StepEstimate) -> dict[str, Any]:
    plan = estimate.plan
    pp, vpp = plan.pp, plan.vpp
    microbatches = plan.microbatches
    while microbatches > pp and 2 * microbatches * pp * vpp > MAX_TASKS:
        microbatches //= 2
    forward = [c.forward_s for c in estimate.chunks]
    backward = [c.backward_s for c in estimate.chunks]
    tasks = simulate(forward, backward, pp, vpp, microbatches, p2p=estimate.p2p_s)
    events: list[dict[str, Any]] = []
    for d in range(pp):
        events.append(
            {"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"pipeline stage {d} ({estimate.device})"}}
        )
        events.append({"ph": "M", "name": "process_sort_index", "pid": d, "args": {"sort_index": d}})
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": COMPUTE, "args": {"name": "compute"}})
        events.append(
            {"ph": "M", "name": "thread_name", "pid": d, "tid": COMM, "args": {"name": "exposed communication"}}
        )
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": STEP, "args": {"name": "step"}})
    for task in tasks:
        chunk = estimate.chunks[task.chunk]
        comm = chunk.comm_forward_s if task.kind == "F" else chunk.comm_backward_s
        layers = f"layers {chunk.layers[0]}-{chunk.layers[-1]}" if chunk.layers else "embedding/head"
        name = f"{'fwd' if task.kind == 'F' else 'bwd'} mb{task.microbatch} chunk{task.chunk}"
        duration = task.end - task.start
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": "forward" if task.kind == "F" else "backward",
                "pid": task.device,
                "tid": COMPUTE,
                "ts": task.start * 1e6,
                "dur": duration * 1e6,
                "args": {
                    "layers": layers,
                    "microbatch": task.microbatch,
                    "chunk": task.chunk,
                    "recompute_ms": chunk.recompute_s * 1e3 if task.kind == "B" else 0.0,
                    "exposed_comm_ms": comm * 1e3,
                },
            }
        )
        if comm > 0:
            events.append(
                {
                    "ph": "X",
                    "name": f"comm {name}",
                    "cat": "communication",
                    "pid": task.device,
                    "tid": COMM,
                    "ts": (task.end - comm) * 1e6,
                    "dur": comm * 1e6,
                    "args": {"exposed_ms": comm * 1e3},
                }
            )
    end = makespan(tasks)
    breakdown = estimate.breakdown
    for d in range(pp):
        t = end
        if breakdown.dp_sync_s > 0:
            events.append(
                {
                    "ph": "X",
                    "name": "data-parallel gradient sync (exposed)",
                    "cat": "communication",
                    "pid": d,
                    "tid": STEP,
                    "ts": t * 1e6,
                    "dur": breakdown.dp_sync_s * 1e6,
                    "args": {},
                }
            )
            t += breakdown.dp_sync_s
        events.append(
            {
                "ph": "X",
                "name": "optimizer step",
                "cat": "optimizer",
                "pid": d,
                "tid": STEP,
                "ts": t * 1e6,
                "dur": max(breakdown.optimizer_s, 1e-9) * 1e6,
                "args": {},
            }
        )
    summary = estimate.to_dict()
    summary["trace_microbatches"] = microbatches
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"trex_estimate": json.dumps(summary, default=str)},
    }


def write_trace(estimate: StepEstimate, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace_events(estimate)))
    return path


def validate_trace(data: dict[str, Any]) -> list[str]:
    """Problems that would stop Perfetto/chrome://tracing from loading the trace (empty when fine)."""
    problems = []
    if not isinstance(data.get("traceEvents"), list):
        return ["top-level 'traceEvents' list is missing"]
    for index, event in enumerate(data["traceEvents"]):
        phase = event.get("ph")
        if phase not in ("X", "M", "B", "E", "i", "C"):
            problems.append(f"event {index}: unknown phase {phase!r}")
        if not isinstance(event.get("name"), str):
            problems.append(f"event {index}: name must be a string")
        if not isinstance(event.get("pid"), int):
            problems.append(f"event {index}: pid must be an integer")
        if phase == "X":
            for key in ("ts", "dur"):
                value = event.get(key)
                if not isinstance(value, (int, float)) or value < 0:
                    problems.append(f"event {index}: {key} must be a non-negative number (got {value!r})")
            if not isinstance(event.get("tid"), int):
                problems.append(f"event {index}: tid must be an integer")
        if len(problems) > 20:
            break
    return problems
