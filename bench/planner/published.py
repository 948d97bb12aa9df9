"""Quality check: the planner against every published configuration, priced by the same cost model.

    python bench/planner/published.py [--json] [--ids K22B,DSV3-H100]

For each row of published_runs.csv the planner searches the same model, cluster, device count,
sequence length and global batch, with the software settings of the published run (attention
kernel, dispatcher, overlaps, gradient and optimizer-state dtypes from
cost_model/data/published_setups.toml); the published configuration is priced as it ran
(cost_model.validation.plan_of_row). Both step times come from trex.cost_model.estimate_step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from trex.cost_model import estimate_step, get_cluster, get_model_spec
from trex.cost_model.catalog import cluster_for_device
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.validation import plan_of_row, published_runs, published_setups
from trex.planner import SearchSpace, plan_parallel
from trex.planner.reasons import why_slower

SEARCHED = {
    "tp",
    "pp",
    "vpp",
    "ep",
    "etp",
    "cp",
    "dp",
    "zero",
    "mbs",
    "recompute",
    "layers_per_chunk",
    "seq",
    "gbs",
    "precision",
}


def compare(row: dict[str, str], setups: dict) -> dict:
    spec = get_model_spec(row["model"])
    devices = int(row["devices"])
    cluster = get_cluster(cluster_for_device(row["device"]), devices)
    published = plan_of_row(row, setups.get(row["id"], {}), spec.num_layers)
    as_run = estimate_step(spec, cluster, published)
    software = {
        f.name: getattr(published, f.name) for f in dataclasses.fields(ParallelConfig) if f.name not in SEARCHED
    }
    started = time.perf_counter()
    result = plan_parallel(
        spec,
        cluster,
        seq=published.seq,
        gbs=published.gbs,
        precision=published.precision,
        software=software,
        baseline=None,
        top=1,
    )
    seconds = time.perf_counter() - started
    best = result.best
    best_estimate = estimate_step(spec, cluster, best.parallel)
    # the same search without ZeRO-2/3, whose per-micro-batch gradient reduce-scatter the cost model does not price
    plain = plan_parallel(
        spec,
        cluster,
        seq=published.seq,
        gbs=published.gbs,
        precision=published.precision,
        software=software,
        baseline=None,
        top=0,
        space=SearchSpace.parse("zero=0/1"),
    ).best
    return {
        "id": row["id"],
        "model": row["model"],
        "devices": devices,
        "device": row["device"],
        "seq": published.seq,
        "gbs": published.gbs,
        "published": {
            "plan": as_run.plan.label(),
            "mbs": published.mbs,
            "recompute": published.recompute,
            "layout": published.layers_per_chunk,
            "step_time_s": as_run.step_time_s,
            "mfu": as_run.mfu,
            "memory_gib": as_run.memory.total / 2**30,
            "fits": as_run.feasible,
            "metric": row["metric"],
            "published_value": float(row["value"]),
        },
        "planner": {
            "plan": best.parallel.label(),
            "mbs": best.parallel.mbs,
            "recompute": best.parallel.recompute,
            "step_time_s": best.prediction.step_time_s,
            "mfu": best.prediction.mfu,
            "memory_gib": best.prediction.memory_per_device_gib,
            "split": best.notes[0] if best.notes else "",
        },
        "planner_zero01": {
            "plan": plain.parallel.label(),
            "mbs": plain.parallel.mbs,
            "recompute": plain.parallel.recompute,
            "step_time_s": plain.prediction.step_time_s,
            "mfu": plain.prediction.mfu,
            "memory_gib": plain.prediction.memory_per_device_gib,
        },
        "speedup": as_run.step_time_s / best.prediction.step_time_s,
        "speedup_zero01": as_run.step_time_s / plain.prediction.step_time_s,
        "at_least_as_fast": best.prediction.step_time_s <= as_run.step_time_s * (1 + 1e-9),
        "why_published_is_slower": why_slower(as_run, best_estimate),
        "search_time_s": seconds,
        "candidates": result.search.stats.candidates_priced,
        "search_space": result.search.stats.space_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ids", help="comma-separated row ids (default: every row)")
    args = parser.parse_args()
    setups = published_setups()
    rows = [r for r in published_runs() if not args.ids or r["id"] in args.ids.split(",")]
    results = [compare(row, setups) for row in rows]
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return
    print(
        "| id | devices | published config (priced as run) | step s | MFU | GiB | planner's best | step s | MFU | GiB | speedup | "
        "best with ZeRO <= 1 | step s | speedup | search s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        p, b, z = r["published"], r["planner"], r["planner_zero01"]
        print(
            f"| {r['id']} | {r['devices']} x {r['device']} | {p['plan']}, mbs {p['mbs']}, {p['recompute']} | {p['step_time_s']:.2f} | {p['mfu']:.1%} | "
            f"{p['memory_gib']:.1f} | {b['plan']}, mbs {b['mbs']}, {b['recompute']} | {b['step_time_s']:.2f} | {b['mfu']:.1%} | {b['memory_gib']:.1f} | "
            f"{r['speedup']:.2f}x | {z['plan']}, mbs {z['mbs']}, {z['recompute']} | {z['step_time_s']:.2f} | {r['speedup_zero01']:.2f}x | {r['search_time_s']:.1f} |"
        )
    print("\n| id | why the published configuration is slower than the planner's best (step-time terms, cost model) |")
    print("| --- | --- |")
    for r in results:
        print(f"| {r['id']} | {r['why_published_is_slower']} |")
    print(f"\nplanner at least as fast on {sum(r['at_least_as_fast'] for r in results)} of {len(results)} rows")


if __name__ == "__main__":
    main()
