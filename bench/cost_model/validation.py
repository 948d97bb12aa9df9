"""Predicted vs published for every row of published_runs.csv (issue 3, item 8).

    python bench/cost_model/validation.py [--csv PATH] [--json]

Each row is estimated as it was run: the CSV's model, devices, degrees, batch, sequence, precision and
recompute, plus the software facts of `trex/cost_model/data/published_setups.toml` (attention kernel,
recompute modules, dispatcher, pipeline layout, gradient dtype), each cited there. One profile per
device serves all its rows; nothing is tuned per row. Prints a markdown table with the signed
error per row, the mean absolute error, the worst row, and whether the Qwen3-235B rows keep the
published order (Q3-A > Q3-B > Q3-C).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from trex.cost_model.validation import compare_all

UNITS = {"step_time_s": "s", "model_tflops_per_device": "TFLOP/s", "mfu": ""}


def _fmt(metric: str, value: float) -> str:
    return f"{value:.1%}" if metric == "mfu" else f"{value:.2f} {UNITS[metric]}" if metric == "step_time_s" else f"{value:.0f} {UNITS[metric]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="published runs CSV (default: the copy shipped in trex.cost_model.data)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = compare_all(args.csv)
    seconds = time.perf_counter() - started
    errors = [abs(r.error) for r in rows]
    by_id = {r.id: r for r in rows}
    qwen = [by_id[i].predicted for i in ("Q3-A", "Q3-B", "Q3-C") if i in by_id]
    ordered = len(qwen) == 3 and qwen[0] > qwen[1] > qwen[2]
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows], "mean_abs_error": statistics.mean(errors), "worst_abs_error": max(errors),
                          "qwen3_order_kept": ordered, "seconds": seconds}, indent=2))
        return 0
    print("| id | model | devices | plan (as estimated) | metric | published | predicted | error | predicted step | MFU | memory/device |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        e = r.estimate
        print(f"| {r.id} | {r.model} | {r.devices} x {r.device} | {r.plan} | {r.metric} | {_fmt(r.metric, r.published)} | "
              f"{_fmt(r.metric, r.predicted)} | {r.error:+.1%} | {e.step_time_s:.2f} s | {e.mfu:.1%} | {e.memory.total / 2**30:.1f} GiB |")
    worst = max(rows, key=lambda r: abs(r.error))
    print()
    print(f"mean absolute error {statistics.mean(errors):.1%} over {len(rows)} rows; worst {worst.id} {worst.error:+.1%}; "
          f"Qwen3 order Q3-A > Q3-B > Q3-C {'kept' if ordered else 'NOT kept'} "
          f"(predicted {', '.join(f'{q:.0f}' for q in qwen)} TFLOP/s); {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
