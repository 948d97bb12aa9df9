"""How far a forecast error of the workers' speed carries into the predicted P99, by operating point, on recorded runs.

Each recorded live run (`bench/serving/live_router.py`, its `<name>.json` and `<name>_timelines.json.gz`) holds the
steps the workers ran before each scheduler's run (the rehearsal; for trex also the round-robin run before it) and
during it. Priced by the live bench's model (`step_timeline.estimate_step_cpu`), the steps before give the *forecast*
the live prediction is made from, the run's own steps the *self-replay* (which reproduced the measured P99 within
-18% to +12% at the recorded rate, bench/RESULTS.md 8, sixth session). Both are simulated here for the same requests
at other arrival rates - round robin driving the slowest worker at U of its capacity
(`schedulers.rate_at_round_robin_utilisation`), or every request at once (`burst`) - and the forecast's P99 is compared
with the self-replay's: the error a run's forecast would have carried at that operating point, with the host as it
was. Also printed: trex's throughput and P99 over round robin's at each point (from the self-replays).

    python bench/serving/operating_points.py bench/serving/results/live_router_s6_run{1,2,3,4,5} \\
        bench/serving/results/live_router_idle_s6_{1,2} --points 0.4 0.5 0.6 0.7 0.85 burst
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from live_router import make_requests  # noqa: E402
from replay_timelines import load  # noqa: E402

from trex.workloads.serving.capacity import SLO  # noqa: E402
from trex.workloads.serving.schedulers import (  # noqa: E402
    capacity_requests_s,
    make_scheduler,
    rate_at_round_robin_utilisation,
)
from trex.workloads.serving.simulator import simulate  # noqa: E402
from trex.workloads.serving.step_timeline import TimedStep, estimate_step_cpu  # noqa: E402
from trex.workloads.serving.workload import workload_stats  # noqa: E402

SCHEDULERS = ("round_robin", "trex")


def steps(timelines: dict, key: str, low: float = float("-inf"), high: float = float("inf")) -> list[list[TimedStep]]:
    return [[TimedStep.from_row(r) for r in w["steps"] if low <= r[1] < high] for w in timelines[key]["workers"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="result stems (<out>/<name>, without .json)")
    parser.add_argument("--points", nargs="+", default=["0.4", "0.6", "0.85", "burst"],
                        help="operating points: U (round robin's slowest worker at U of its capacity) or burst")  # fmt: skip
    args = parser.parse_args(argv)
    errors = {p: {k: [] for k in SCHEDULERS} for p in args.points}
    gains = {p: [] for p in args.points}
    for stem in args.runs:
        results, timelines, specs, bases = load(stem)
        names = [s.name for s in specs]
        stats = workload_stats(make_requests(results["requests"], 1.0, 0))
        share = results["cpu_shares_before_rate"]["shares"][len(specs) - 1]
        capacities = [
            capacity_requests_s(s, stats.mean_prompt, stats.mean_output, stats.context_in_flight) * share for s in specs
        ]
        starts = {k: results["runs"][k]["measured"]["start_s"] for k in SCHEDULERS}
        forecast_steps = {
            "round_robin": steps(timelines, "round_robin", high=starts["round_robin"]),
            "trex": [
                a + b for a, b in zip(steps(timelines, "round_robin"), steps(timelines, "trex", high=starts["trex"]))
            ],
        }
        forecast = {k: estimate_step_cpu(names, v, bases).simulation_options() for k, v in forecast_steps.items()}
        own = {k: estimate_step_cpu(names, steps(timelines, k, low=starts[k]), bases).simulation_options()
               for k in SCHEDULERS}  # fmt: skip
        line = [Path(stem).name]
        for point in args.points:
            rate = float("inf") if point == "burst" else rate_at_round_robin_utilisation(capacities, float(point))
            requests = make_requests(results["requests"], rate, 0)
            replayed = {}
            for key in SCHEDULERS:
                predicted = simulate(specs, make_scheduler(key, 0, stats), requests, SLO(10.0, 1.0), **forecast[key])
                replayed[key] = simulate(specs, make_scheduler(key, 0, stats), requests, SLO(10.0, 1.0), **own[key])
                error = predicted.report.latency_p99_s / replayed[key].report.latency_p99_s - 1
                errors[point][key].append(error)
                line.append(f"{point} {key} {error:+.0%}")
            rr, tx = replayed["round_robin"].report, replayed["trex"].report
            gains[point].append((tx.throughput_tok_s / rr.throughput_tok_s, tx.latency_p99_s / rr.latency_p99_s))
        print(" | ".join(line), flush=True)
    print("P99 forecast against self-replay, by operating point (runs within 20%; largest |error|), and trex / round "
          "robin in the self-replays (throughput min-max; P99 min-max):")  # fmt: skip
    for point in args.points:
        parts = []
        for key in SCHEDULERS:
            values = errors[point][key]
            within = sum(abs(e) <= 0.2 for e in values)
            parts.append(f"{key} {within}/{len(values)} within 20% (max |error| {max(abs(e) for e in values):.0%})")
        throughput = [g[0] for g in gains[point]]
        p99 = [g[1] for g in gains[point]]
        print(
            f"  {point:>5}: "
            + "; ".join(parts)
            + f"; trex/rr throughput {min(throughput):.3f}-{max(throughput):.3f}x, "
            f"P99 {min(p99):.2f}-{max(p99):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
