"""Replay recorded live runs through the simulator, priced from the workers' own step timelines.

`bench/serving/live_router.py` writes each run's results (`<name>.json`) and the workers' step timelines
(`<name>_timelines.json.gz`). This script asks two questions of them, with the same model the live bench predicts with
(`step_timeline.estimate_step_cpu`: step CPU by shape x by busy workers, the share of a core fitted on the steps,
`Simulation(processor_sharing=True)`):

1. *self-replay*: each scheduler's run priced from its own steps. A diagnostic, not a prediction - it uses the
   measurement it is compared with - which says whether the model's structure can reproduce the run's latencies
   once it knows the step CPU and the shares the run got;
2. *forecast*: the trex run priced from the round-robin run that came right before it (steps the workers ran before
   the trex run: a prediction made only from the past, as the live bench does with more data);
3. *conditioning* (`--sensitivity`): the self-replay's P99 with every step a few percent faster or slower - how
   precisely the workers' speed must be forecast for the P99 to land within 20%;
4. *step variation* (`--noise N`): the self-replay with each simulated step drawing its CPU and its time on the core
   from the residuals measured on the run's steps (`Simulation(step_noise=)`), median P99 over N seeds - whether
   the steps' variation around their means is what a mean-only simulation misses in the tail.

    python bench/serving/replay_timelines.py bench/serving/results/live_router_s5_run{2,3,4,5}
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from live_router import make_requests  # noqa: E402

from trex.workloads.serving.capacity import SLO  # noqa: E402
from trex.workloads.serving.cpu_share import CpuShares  # noqa: E402
from trex.workloads.serving.instance_model import EngineLimits  # noqa: E402
from trex.workloads.serving.latency_fit import LatencyModel  # noqa: E402
from trex.workloads.serving.router import worker_spec  # noqa: E402
from trex.workloads.serving.schedulers import make_scheduler  # noqa: E402
from trex.workloads.serving.simulator import simulate  # noqa: E402
from trex.workloads.serving.step_timeline import TimedStep, estimate_step_cpu  # noqa: E402
from trex.workloads.serving.workload import workload_stats  # noqa: E402


def load(stem: str):
    results = json.loads(Path(f"{stem}.json").read_text())
    with gzip.open(f"{stem}_timelines.json.gz", "rt") as handle:
        timelines = json.load(handle)
    specs, bases = [], []
    for worker, overhead in zip(results["workers"], results["overhead"]["worker_s_per_token"]):
        model = LatencyModel.from_dict(worker["latency_model"])  # the profile plus the streaming overhead
        a0, a1, a2 = model.prefill
        b0, b1, b2 = model.decode
        bases.append(LatencyModel((a0 - overhead, a1, a2), (b0, b1 - overhead, b2), "profile", model.decode_multi,
                                  model.repack))  # fmt: skip
        specs.append(worker_spec(worker["url"], model, EngineLimits(**worker["limits"])))
    return results, timelines, specs, bases


def run_steps(timelines: dict, key: str, start: float) -> list[list[TimedStep]]:
    return [[TimedStep.from_row(r) for r in w["steps"] if r[1] >= start] for w in timelines[key]["workers"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="result stems (<out>/<name>, without .json)")
    parser.add_argument("--sensitivity", type=float, nargs="*", default=[], metavar="SPEED",
                        help="also replay with every step's share of a core times SPEED (e.g. 0.95 1.05)")  # fmt: skip
    parser.add_argument("--noise", type=int, default=0, metavar="N",
                        help="also replay with measured step variation, median over N seeds")  # fmt: skip
    args = parser.parse_args(argv)
    for stem in args.runs:
        results, timelines, specs, bases = load(stem)
        names = [s.name for s in specs]
        requests = make_requests(results["requests"], results["rate_req_s"], 0)
        stats = workload_stats(make_requests(results["requests"], 1.0, 0))
        label = Path(stem).name
        for key in ("round_robin", "trex"):
            measured = results["runs"][key]["measured"]
            own = run_steps(timelines, key, measured["start_s"])  # the run's steps only, not its rehearsal's
            estimate = estimate_step_cpu(names, own, bases)
            report = simulate(
                specs, make_scheduler(key, 0, stats), requests, SLO(10.0, 1.0), **estimate.simulation_options()
            ).report
            options = estimate.simulation_options()
            if args.noise:
                p99s = sorted(
                    simulate(
                        specs, make_scheduler(key, 0, stats), requests, SLO(10.0, 1.0), **options,
                        step_noise=estimate.residuals, noise_seed=seed,
                    ).report.latency_p99_s
                    for seed in range(args.noise)
                )  # fmt: skip
                median = p99s[len(p99s) // 2]
                print(
                    f"{label} {key:12s} self-replay with the measured step variation: P99 median "
                    f"{median / measured['latency_p99_s'] - 1:+.0%} (seeds: "
                    + ", ".join(f"{p / measured['latency_p99_s'] - 1:+.0%}" for p in p99s)
                    + ")"
                )
            for speed in args.sensitivity:
                shares = CpuShares(tuple(min(1.0, x * speed) for x in options["cpu_shares"].shares), f"x {speed}")
                varied = simulate(
                    specs, make_scheduler(key, 0, stats), requests, SLO(10.0, 1.0), **{**options, "cpu_shares": shares}
                ).report
                print(
                    f"{label} {key:12s} self-replay with steps {speed:.2f}x as fast: P99 "
                    f"{varied.latency_p99_s / report.latency_p99_s - 1:+.0%} against the self-replay's, throughput "
                    f"{varied.throughput_tok_s / report.throughput_tok_s - 1:+.0%}"
                )
            print(
                f"{label} {key:12s} self-replay: P50 {report.latency_p50_s / measured['latency_p50_s'] - 1:+.0%}, "
                f"P99 {report.latency_p99_s / measured['latency_p99_s'] - 1:+.0%}, throughput "
                f"{report.throughput_tok_s / measured['throughput_tok_s'] - 1:+.0%} ({estimate.describe()})"
            )
        before = results["runs"]["round_robin"]["measured"]["start_s"]
        estimate = estimate_step_cpu(names, run_steps(timelines, "round_robin", before), bases)
        report = simulate(
            specs, make_scheduler("trex", 0, stats), requests, SLO(10.0, 1.0), **estimate.simulation_options()
        ).report
        measured = results["runs"]["trex"]["measured"]
        print(
            f"{label} trex forecast from the round-robin run's steps: P50 {report.latency_p50_s:.2f} s "
            f"({report.latency_p50_s / measured['latency_p50_s'] - 1:+.0%}), P99 {report.latency_p99_s:.2f} s "
            f"({report.latency_p99_s / measured['latency_p99_s'] - 1:+.0%}); measured P99 "
            f"{measured['latency_p99_s']:.2f} s, predicted before the run {results['runs']['trex']['predicted']['latency_p99_s']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
