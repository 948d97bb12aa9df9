"""Predicted vs published for every row of published_runs.csv (issue 3, item 8).

    python bench/cost_model_validation.py [--csv PATH] [--json] [--host-sensitivity 13.5,27,36] [--extended]

Each row is estimated as it was run: the CSV's model, devices, degrees, batch, sequence, precision and
recompute, plus the software facts of `trex/cost_model/data/published_setups.toml` (attention kernel,
recompute modules, dispatcher, pipeline layout and overlap, gradient dtype), each cited there. One
profile per device serves all its rows; nothing is tuned per row. Prints a markdown table with the
signed error per row, the mean absolute error, the worst row, and whether the Qwen3-235B rows keep
the published order (Q3-A > Q3-B > Q3-C).

`--host-sensitivity` re-runs every row with each given host cost per op (microseconds, one value for
every device at a time) and prints the Qwen3 predictions and the error summary for each: a study of
the host model (`trex.cost_model.host`), not a setting the table above uses.

`--explain ID` prints one row (of either table) as it was priced: its setup, the step estimate, the
pipeline's devices and each layer kind op by op (`trex estimate --layers`).

`--extended` adds the further runs of the same sources in `published_runs_extra.csv` (Qwen3-235B with
the 1F1B all-to-all overlap, with FSDP, and at 16K-128K tokens) as a second table, outside the summary.
Both tables give, for models with one kind of decoder layer, the step as layer executions (one layer's
forward + backward for one micro-batch on the busiest device): how many per step, the predicted time of
one, the time the published figure implies with the rest of the step as predicted, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from trex.cost_model.validation import Comparison, compare_all, layer_executions

UNITS = {"step_time_s": "s", "model_tflops_per_device": "TFLOP/s", "mfu": ""}
QWEN3 = ("Q3-A", "Q3-B", "Q3-C")


def _fmt(metric: str, value: float) -> str:
    return (
        f"{value:.1%}"
        if metric == "mfu"
        else f"{value:.2f} {UNITS[metric]}"
        if metric == "step_time_s"
        else f"{value:.0f} {UNITS[metric]}"
    )


def summary(rows: list[Comparison]) -> dict:
    errors = [abs(r.error) for r in rows]
    by_id = {r.id: r for r in rows}
    qwen = [by_id[i].predicted for i in QWEN3 if i in by_id]
    worst = max(rows, key=lambda r: abs(r.error))
    return {
        "mean_abs_error": statistics.mean(errors),
        "worst_abs_error": abs(worst.error),
        "worst": worst.id,
        "worst_error": worst.error,
        "qwen3_predicted": qwen,
        "qwen3_order_kept": len(qwen) == 3 and qwen[0] > qwen[1] > qwen[2],
    }


def _row_dict(r: Comparison) -> dict:
    executions = layer_executions(r)
    layers = (
        None
        if executions is None
        else {
            "count": executions.count,
            "predicted_s": executions.predicted_s,
            "published_s": executions.published_s,
            "ratio": executions.ratio,
        }
    )
    return {**r.to_dict(), "layer_executions": layers}


def _layers(r: Comparison) -> str:
    executions = layer_executions(r)
    if executions is None:
        return "- | - | - | -"
    return f"{executions.count} | {executions.predicted_s * 1e3:.2f} ms | {executions.published_s * 1e3:.2f} ms | {executions.ratio:.2f}"


def print_table(rows: list[Comparison]) -> None:
    print(
        "| id | model | devices | plan (as estimated) | metric | published | predicted | error | predicted step | MFU | host wait | memory/device "
        "| layer executions | predicted each | published each | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        e = r.estimate
        print(
            f"| {r.id} | {r.model} | {r.devices} x {r.device} | {r.plan} | {r.metric} | {_fmt(r.metric, r.published)} | "
            f"{_fmt(r.metric, r.predicted)} | {r.error:+.1%} | {e.step_time_s:.2f} s | {e.mfu:.1%} | {e.breakdown.host_wait_s:.2f} s | "
            f"{e.memory.total / 2**30:.1f} GiB | {_layers(r)} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="published runs CSV (default: the copy shipped in trex.cost_model.data)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--host-sensitivity", metavar="US,US,...", help="host costs per op (microseconds) to re-run every row with"
    )
    parser.add_argument(
        "--extended", action="store_true", help="also estimate published_runs_extra.csv (outside the summary)"
    )
    parser.add_argument(
        "--explain", metavar="ID", help="print one row as priced: setup, estimate, pipeline devices, layers op by op"
    )
    args = parser.parse_args(argv)
    if args.explain:
        return explain_row(args.explain, args.csv)
    started = time.perf_counter()
    rows = compare_all(args.csv)
    seconds = time.perf_counter() - started
    result = summary(rows)
    studies = []
    if args.host_sensitivity:
        for value in (float(v) for v in args.host_sensitivity.split(",")):
            studied = compare_all(args.csv, host_op_us=value)
            studies.append({"host_op_us": value, **summary(studied), "errors": {r.id: r.error for r in studied}})
    extra = compare_all(extra=True) if args.extended else []
    if args.json:
        print(
            json.dumps(
                {
                    "rows": [_row_dict(r) for r in rows],
                    **result,
                    "seconds": seconds,
                    "host_sensitivity": studies,
                    "extra_rows": [_row_dict(r) for r in extra],
                },
                indent=2,
            )
        )
        return 0
    print_table(rows)
    print()
    print(
        f"mean absolute error {result['mean_abs_error']:.1%} over {len(rows)} rows; worst {result['worst']} {result['worst_error']:+.1%}; "
        f"Qwen3 order Q3-A > Q3-B > Q3-C {'kept' if result['qwen3_order_kept'] else 'NOT kept'} "
        f"(predicted {', '.join(f'{q:.0f}' for q in result['qwen3_predicted'])} TFLOP/s); {seconds:.1f} s"
    )
    if studies:
        print()
        print("| host cost per op | Q3-A | Q3-B | Q3-C | order kept | other rows, worst | mean abs error | worst row |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for study in studies:
            errors = study["errors"]
            qwen = " | ".join(f"{p:.0f} ({errors[i]:+.0%})" for i, p in zip(QWEN3, study["qwen3_predicted"]))
            others = max(abs(e) for i, e in errors.items() if i not in QWEN3)
            print(
                f"| {study['host_op_us']:g} us | {qwen} | {'yes' if study['qwen3_order_kept'] else 'no'} | {others:.1%} | "
                f"{study['mean_abs_error']:.1%} | {study['worst']} {study['worst_error']:+.1%} |"
            )
    if extra:
        print()
        print("Further runs of the same sources (published_runs_extra.csv; not part of the summary above):")
        print()
        print_table(extra)
    return 0


def explain_row(row_id: str, csv_path: str | None = None) -> int:
    """One published row as the model priced it, down to the ops of each layer kind."""
    from trex.cli.estimate import print_estimate, print_layers, print_stages
    from trex.cost_model.catalog import cluster_for_device, get_cluster
    from trex.cost_model.layer_cost import layer_breakdown
    from trex.cost_model.model_spec import get_model_spec
    from trex.cost_model.validation import published_setups

    rows = {r.id: r for r in (*compare_all(csv_path), *compare_all(extra=True))}
    if row_id not in rows:
        print(f"no published row {row_id!r}; rows: {', '.join(rows)}", file=sys.stderr)
        return 2
    r = rows[row_id]
    setup = {k: v for k, v in published_setups().get(row_id, {}).items() if k != "source"}
    print(f"{r.id}: published {_fmt(r.metric, r.published)}, predicted {_fmt(r.metric, r.predicted)} ({r.error:+.1%})")
    print(f"  source: {r.source}")
    print(f"  setup beyond the CSV columns: {', '.join(f'{k}={v}' for k, v in setup.items()) or 'none'}")
    executions = layer_executions(r)
    if executions is not None:
        print(
            f"  per layer execution: predicted {executions.predicted_s * 1e3:.2f} ms, published {executions.published_s * 1e3:.2f} ms "
            f"(x{executions.ratio:.2f}), {executions.count} per step on the busiest device"
        )
    spec = get_model_spec(r.model)
    cluster = get_cluster(cluster_for_device(r.device), r.devices)
    print_estimate(r.estimate, spec)
    print_stages(r.estimate)
    print_layers(layer_breakdown(spec, r.estimate.plan, cluster), spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
