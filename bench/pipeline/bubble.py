"""Measured vs predicted pipeline bubble, per schedule and (pp, micro-batches), on CPU ranks (gloo).

    python bench/pipeline/bubble.py --pp 2 --microbatches 2 4 8 --steps 12

For each pp, ONE start of pp ranks runs every (schedule, micro-batch count) job one after the other
(`trex.runtime.launcher.run_jobs`) on a small Qwen3-MoE (8 layers, written as a config next to the
results; random init, seed 0). Each job trains `--steps` steps; the first is left out (shape inference,
warm-up). Per job it prints the bubble measured from the ranks' action timestamps (1 - busy/step, mean
over ranks and steps, with the standard error of that mean over the steps: one step's bubble moves by tens
of percent with the host, so the old default of 4 steps (3 measured) left the mean itself ~20% uncertain),
the cost model's prediction (event simulation of the schedule's own action
lists with the cost model's task times and the runtime's costs measured by a calibration run on the
same ranks: per-action work, a message's delivery to a waiting rank, gloo's late receive, the host's slowdowns; the papers' closed form
beside it where one exists), their ratio, and the same simulation fed with the measured mean task
times (what the model explains when its compute times are right). The prediction's task times are each
chunk's F/B/I/W measured alone on the chunk by the calibration (`runtime.pipeline.task_calibration`);
`pred. cost-model tasks` is the same simulation with the cost model's FLOP-priced task times instead.
`late recv, sender waiting ms` is the late receive measured with the sender blocked in its wait (the 1F1B
loop's case), which the prediction uses where the simulated sender is not working. `slice ms` is the host
scheduler's time slice measured on the ranks (`calibration.measure_time_slice`); where the ranks outnumber
the cores (pp=4 on 2 cores) the prediction hands the cores out in such slices. `ready send ms` is what
posting a send to a rank already waiting for it costs the sender (`calibration.measure_ready_send`: gloo's
transport thread holds the sender's core; `ready send, waited ms` the same with the sender first waiting for
its send, the price under 1F1B, whose loop waits on each batch it posts), which the prediction charges where the
simulated receiver has posted its receive. `old model` is the same prediction with the task calibration of
RESULTS 14.14, where each rank's first chunk was timed by the sample that opens the rank's turn, right after
its wait in the barrier (`task_calibration.measure_stage_tasks_first_in_turn`; now that sample is kept apart
where each rank has its own core). Where the ranks share cores (pp=4 on 2 cores) the prediction keeps that
calibration, and the rows table gives the warm passes' prediction beside it.
Both models are computed on the same run. After the table, per job, a step's time split into compute, the
engine's message posts and waits, and the rest, for the training run and its calibration's null chunks.
At the end: min/median/max of the ratio measured/predicted per schedule. Losses are checked equal to the
1-rank run on the way.

Each row runs in `--rounds` rounds (`runtime.pipeline.rounds`): every round is a job of its own, a training run
and the calibration that prices it taken back to back (after the steps in even rounds, before them in odd ones),
the rounds of all rows one after the other in time. The table above prints every round; the rows table after it
gives, per row, the measured bubble over every round's steps with its bootstrap interval (steps resampled within
their round), the prediction's median and min-max over the rounds (how much it moves when the calibration is
re-taken), and the row's ratio: the median over the rounds of each round's measured / predicted, with its
min-max. A row counts as within 20% on that median; `verdict` says whether every round agreed.

`--concurrent-calibration` (a diagnostic, RESULTS 14.16): the task calibration also times every chunk with all
pipeline ranks sampling at once, as the training runs them (`TrainJob.calibrate_concurrent`). A table at the end
gives, per row, the prediction with those times beside the one in force, and how much longer the training's own
passes ran than the in-turn samples and than the at-once samples (median over chunks and kinds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbv", 2), ("dualpipev", 2)]


def model_config(directory: Path, hidden: int, layers: int) -> str:
    from trex.models import tiny_config

    config = tiny_config("qwen3-moe", hidden_size=hidden, num_layers=layers, vocab_size=512)
    path = directory / f"qwen3-moe-h{hidden}-l{layers}.json"
    path.write_text(json.dumps(config.to_dict()))
    return str(path)


def model_step(pipeline: dict, key: str = "predicted_task_seconds") -> float:
    """Compute per rank and step (all its micro-batches through its chunks), slowest rank, with the cost model's
    task times (`predicted_task_seconds`) or the calibrated ones (`calibrated_task_seconds`): a check of the
    absolute task times against the measured `step s`."""
    times = pipeline.get(key) or {}
    if not times:
        return float("nan")
    chunks_of = {}
    for index, rank in enumerate(pipeline["chunk_ranks"]):
        chunks_of.setdefault(rank, []).append(index)
    m = pipeline["microbatches"]
    split = pipeline["schedule"] in ("zbv", "dualpipev")  # their backward runs as I + W (both measured)
    backward = [i + w for i, w in zip(times["I"], times["W"])] if split else times["B"]
    return max(m * sum(times["F"][c] + backward[c] for c in chunks) for chunks in chunks_of.values())


def slowdown_p90(costs: dict) -> float:
    """The 90th percentile of the calibration's task slowdowns (measured / nominal time), every action and step."""
    value = (costs.get("slowdowns") or {}).get("p90")
    return float("nan") if value is None else value


def milliseconds(seconds: float | None) -> str:
    """A measured time in ms for the table; `nan` where it was not measured (a zero is a measurement)."""
    return "nan" if seconds is None else f"{seconds * 1e3:.2f}"


def print_step_split(jobs: list[dict]) -> None:
    """Per job: where a step's time goes on the training run and on its calibration's null chunks (mean over the
    pipeline ranks, ms per step; `runtime.pipeline.timing.comm_split`): compute, the engine's message posts,
    its waits (and how many waits over 0.1 ms), and the rest (runtime work between actions)."""
    keys = ("step_ms", "compute_ms", "post_ms", "wait_ms", "long_waits", "other_ms")

    def mean(parts: list[dict]) -> list[float]:
        parts = [p for p in parts if p]
        return [statistics.fmean(p[k] for p in parts) if parts else float("nan") for k in keys]

    print(
        "\nstep split, ms per step (mean over ranks): training run | calibration (null chunks)\n"
        "| schedule | pp | m | round | step | compute | post | wait | waits > 0.1 ms | other "
        "| cal. step | cal. compute | cal. post | cal. wait | cal. waits > 0.1 ms | cal. other |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for job in jobs:
        schedule, pp, _, m, round_ = job["job"]
        run = mean(job["measured"].get("step_split") or [])
        cal = mean(list(job["runtime_overheads"].get("step_split") or []))
        cells = " | ".join(f"{v:.2f}" for v in run + cal)
        print(f"| {schedule} | {pp} | {m} | {round_} | {cells} |")


def task_ratio(measured: dict, calibrated: dict) -> float:
    """Median over the chunks and kinds both sides ran (over 1 ms: the first chunk's I is none) of the training's
    mean task time over the calibrated one."""
    pairs = [
        (run, calibrated[kind][c])
        for kind in ("F", "B", "I", "W")
        for c, run in enumerate(measured.get(kind, []))
        if run > 1e-3 and calibrated[kind][c] > 1e-3
    ]
    return statistics.median(run / cal for run, cal in pairs) if pairs else float("nan")


def print_concurrent(jobs: list[dict]) -> None:
    """Per row, over its rounds (medians): the prediction in force and the one with the at-once task samples,
    each as measured/predicted, and the training's passes over each calibration's (`task_ratio`)."""
    rows: dict[tuple, list[tuple[float, ...]]] = {}
    for job in jobs:
        bubble, together = job["bubble_fraction"], job.get("calibrated_task_seconds_concurrent")
        if not together or not job.get("calibrated_task_seconds"):
            continue
        measured, tasks = bubble["measured"], job["measured"]["task_seconds"]
        rows.setdefault(tuple(job["job"][:4]), []).append(
            (
                measured / bubble["predicted"],
                measured / bubble["predicted_concurrent_tasks"],
                task_ratio(tasks, job["calibrated_task_seconds"]),
                task_ratio(tasks, together),
            )
        )
    if not rows:
        return
    print("\nthe task calibration in turns against all ranks at once (medians over the rounds [min-max])")
    print(
        "| schedule | pp | vpp | m | measured/predicted | at once: measured/predicted | training/in-turn passes | training/at-once passes |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (schedule, pp, vpp, m), values in rows.items():
        cells = [f"{statistics.median(column):.2f} [{min(column):.2f}-{max(column):.2f}]" for column in zip(*values)]
        print(f"| {schedule} | {pp} | {vpp} | {m} | " + " | ".join(cells) + " |")


def print_rows(rounds_of: dict, ratios: dict) -> tuple[int, int, int]:
    """The rows table (`runtime.pipeline.rounds.summarize_rounds`, 90% intervals); fills `ratios` (per schedule,
    each row's ratio) and returns the rows within 20% (median over rounds), those with every round within, and
    those within with the old model."""
    from trex.runtime.pipeline.rounds import BAND, summarize_rounds

    within = every_round = old_within = 0
    print(
        "\nper row, over its rounds: measured = mean over every round's steps [bootstrap 90% interval]; predicted = "
        "median [min-max over the rounds' calibrations]; measured/predicted = median over rounds of each round's "
        "pair [min-max]\n"
        "| schedule | pp | vpp | m | rounds | measured | measured 90% interval | predicted | predicted min-max "
        "| measured/predicted | min-max | every round | verdict | old model: measured/predicted "
        "| warm passes, ranks sharing cores: measured/predicted |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for (schedule, pp, vpp, m), rounds in rounds_of.items():
        row = summarize_rounds([(measured, predicted, steps) for measured, predicted, steps, *_ in rounds])
        old = statistics.median(measured / o for measured, _, _, o, _ in rounds if o > 0)
        warm = [measured / w for measured, _, _, _, w in rounds if w]
        warm_cell = f"{statistics.median(warm):.2f}" if warm else "-"
        ratios.setdefault(schedule, []).append(row.ratio)
        within += row.within
        every_round += row.every_round_within
        old_within += BAND[0] <= old <= BAND[1]
        low, high = row.measured_interval
        print(
            f"| {schedule} | {pp} | {vpp} | {m} | {len(rounds)} | {row.measured:.3f} | {low:.3f}-{high:.3f} | "
            f"{row.predicted:.3f} | {row.predicted_range[0]:.3f}-{row.predicted_range[1]:.3f} | {row.ratio:.2f} | "
            f"{row.ratio_range[0]:.2f}-{row.ratio_range[1]:.2f} | {' '.join(f'{r:.2f}' for r in row.ratios)} | "
            f"{row.verdict()} | {old:.2f} | {warm_cell} |",
            flush=True,
        )
    return within, every_round, old_within


def print_hold_model(dumped: list) -> None:
    """Where the ranks take the cores in time slices: per row, measured/predicted (median over rounds [each round])
    with the model in force and with the previous one (RESULTS 14.17: a send's hold let the sender's core go and
    queued the sender again after it), on the same runs."""
    rows: dict = {}
    for job in dumped:
        bubble = job["bubble_fraction"]
        previous = bubble.get("predicted_hold_releases_core")
        if previous:
            key = (job["schedule"], job["pp"], job["microbatches"])
            rows.setdefault(key, []).append((bubble["measured"] / bubble["predicted"], bubble["measured"] / previous))
    if not rows:
        return
    print("\ntime slices: measured/predicted, a send's hold on the sender's core (in force) | releasing it (14.17)")
    for (schedule, pp, m), pairs in rows.items():
        cells = [f"{statistics.median(column):.2f} [{' '.join(f'{r:.2f}' for r in column)}]" for column in zip(*pairs)]
        print(f"  {schedule:12s} pp={pp} m={m}: " + " | ".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pp", type=int, nargs="+", default=[2])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--schedules", nargs="+", default=[name for name, _ in SCHEDULES])
    parser.add_argument("--steps", type=int, default=12, help="training steps per round (the first left out)")
    rounds_help = "paired rounds per row (training run + its calibration; the order alternates between rounds)"
    parser.add_argument("--rounds", type=int, default=3, help=rounds_help)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--json", help="also write every job's `pipeline` report (with the per-action times) here")
    concurrent_help = "also time the task calibration with every rank at once (a diagnostic; see the docstring)"
    parser.add_argument("--concurrent-calibration", action="store_true", help=concurrent_help)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 2:
        parser.error(f"--rounds must be at least 1 and --steps at least 2 (got {args.rounds}, {args.steps})")

    from trex.errors import TrexError
    from trex.runtime.launcher import launch_function, run_jobs
    from trex.runtime.trainer import TrainJob

    directory = Path(tempfile.mkdtemp(prefix="trex-bubble-"))
    model = model_config(directory, args.hidden, args.layers)
    vpp_of = dict(SCHEDULES)
    ratios, dumped, rounds_of = {}, [], {}
    print(
        f"model {model} (seq {args.seq}, mbs 1, fp32), {args.rounds} rounds per row of {args.steps} steps "
        "(first left out); every round:\n"
        "| schedule | pp | vpp | m | round | calibrated | measured | +- s.e. | predicted | measured/predicted | compute only | closed form "
        "| sim. with measured tasks | pred. cost-model tasks | action ms | p2p ms | delivery ms | late recv ms "
        "| host slowdown p90 "
        "| remote delay ms "
        "| step s | calibrated step s | model step s | late recv, sender waiting ms | slice ms | ready send ms | ready send, waited ms "
        "| old model: predicted | old model: measured/predicted |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for pp in args.pp:
        jobs, labels = [], []
        for round_ in range(args.rounds):  # the rounds of every row one after the other in time
            for schedule in args.schedules:
                vpp = vpp_of[schedule]
                for m in args.microbatches:
                    plan = f"pp={pp}" + (f",vpp={vpp}" if vpp > 1 else "")
                    try:
                        job = TrainJob.create(
                            model,
                            plan,
                            pp,
                            seq=args.seq,
                            gbs=m,
                            mbs=1,
                            steps=args.steps,
                            schedule=schedule,
                            verbose=False,
                            calibrate_first=round_ % 2 == 1,
                            calibrate_concurrent=args.concurrent_calibration,
                        )
                    except TrexError as error:
                        if round_ == 0:
                            print(f"| {schedule} | {pp} | {vpp} | {m} | refused: {str(error)[:90]} |" + "|" * 23)
                        continue
                    jobs.append(job)
                    labels.append((schedule, pp, vpp, m, round_))
        results = launch_function(run_jobs, (jobs,), pp)[0]
        dumped.extend({"job": list(label), **result["pipeline"]} for label, result in zip(labels, results))
        for (schedule, pp_, vpp, m, round_), result in zip(labels, results):
            bubble = result["pipeline"]["bubble_fraction"]
            measured, predicted = bubble["measured"], bubble["predicted"]
            ratio = measured / predicted if predicted > 0 else float("nan")
            closed = bubble.get("predicted_closed_form")
            step = statistics.median(result["step_times_s"][1:] or result["step_times_s"])
            costs = result["pipeline"]["runtime_overheads"]
            # the previous model on the same run (14.14): each rank's first chunk timed as it opens its turn
            old = bubble.get("predicted_first_in_turn", predicted)
            old_ratio = measured / old if old > 0 else float("nan")
            per_step = result["pipeline"]["measured"]["per_step"]
            warm = bubble.get("predicted_warm_tasks")  # ranks sharing cores: the warm passes' prediction
            rounds_of.setdefault((schedule, pp_, vpp, m), []).append((measured, predicted, per_step, old, warm))
            error = statistics.stdev(per_step) / len(per_step) ** 0.5 if len(per_step) > 1 else float("nan")
            first = "before" if result["pipeline"].get("calibrated_first") else "after"
            print(
                f"| {schedule} | {pp_} | {vpp} | {m} | {round_} | {first} | {measured:.3f} | {error:.3f} | {predicted:.3f} | {ratio:.2f} | "
                f"{bubble['predicted_compute_only']:.3f} | {'-' if closed is None else f'{closed:.3f}'} | "
                f"{bubble['simulated_with_measured_tasks']:.3f} | "
                f"{bubble.get('predicted_with_cost_model_tasks', float('nan')):.3f} | {costs['action_s'] * 1e3:.2f} | "
                f"{costs['p2p_s'] * 1e3:.2f} | {costs['delivery_s'] * 1e3:.2f} | {costs['late_recv_s'] * 1e3:.2f} | {slowdown_p90(costs):.2f} | "
                f"{costs['remote_delay_s'] * 1e3:.2f} | {step:.3f} | "
                f"{model_step(result['pipeline'], 'calibrated_task_seconds'):.3f} | "
                f"{model_step(result['pipeline']):.3f} | {(costs.get('late_recv_idle_s') or float('nan')) * 1e3:.2f} | "
                f"{(costs.get('slice_s') or float('nan')) * 1e3:.2f} | "
                f"{milliseconds(costs.get('ready_send_s'))} | {milliseconds(costs.get('ready_send_waited_s'))} | "
                f"{old:.3f} | {old_ratio:.2f} |",
                flush=True,
            )
    print_step_split(dumped)
    print_concurrent(dumped)
    if args.json:
        Path(args.json).write_text(json.dumps(dumped, indent=1, default=str))
    within, every_round, old_within = print_rows(rounds_of, ratios)
    print(f"\nrows with measured/predicted within 20% (0.80-1.20): {within} of {len(rounds_of)}")
    print(f"rows with every round's measured/predicted within 20%: {every_round} of {len(rounds_of)}")
    print(
        f"the same rows with the old model (RESULTS 14.14: each rank's first chunk calibrated by the sample that "
        f"opens its turn), median over rounds: {old_within}"
    )
    print_hold_model(dumped)
    print("measured/predicted bubble per schedule: min / median / max")
    for schedule, values in ratios.items():
        finite = [v for v in values if v == v]
        if finite:
            print(f"  {schedule:12s} {min(finite):.2f} / {statistics.median(finite):.2f} / {max(finite):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
