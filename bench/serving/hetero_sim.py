"""Simulated throughput at equal SLO attainment: trex's deployment + scheduler against the baseline
schedulers over the same deployment, on two heterogeneous clusters (bench/serving/clusters/).

For each cluster the deployment is `trex serve plan`'s choice. For each scheduler the highest
Poisson arrival rate at which at least `--attainment` of the requests meet both SLOs is found by
bisection (each probe is one seeded simulation of ShareGPT-like requests). At that rate every
request completes and the required share meets the SLOs, so the output tokens served per second
are the rate times the mean output length: the scheduler's throughput at equal SLO attainment.
(The simulator's token count while requests arrive is also recorded; it includes the ramp-up.)
Each seed is a separate workload; ratios against round robin are reported
as min/median/max over seeds.

    python bench/serving/hetero_sim.py                    # both clusters, 3 seeds, writes results + plot
    python bench/serving/hetero_sim.py --quick            # one seed, fewer requests (a smoke run)
    python bench/serving/hetero_sim.py --clusters gpu_mix & python bench/serving/hetero_sim.py --clusters gpu_npu_mix
    python bench/serving/hetero_sim.py --combine results/hetero_sim_gpu_mix.json results/hetero_sim_gpu_npu_mix.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from trex.cost_model.model_spec import get_model_spec
from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.cluster_spec import load_serving_cluster
from trex.workloads.serving.deployment import plan_deployment
from trex.workloads.serving.schedulers import make_scheduler
from trex.workloads.serving.simulator import simulate
from trex.workloads.serving.workload import sharegpt_like, workload_stats

HERE = Path(__file__).parent
CLUSTERS = ("gpu_mix", "gpu_npu_mix")
SCHEDULERS = ("round_robin", "random", "jsq", "token_jsq", "po2", "weighted_rr", "trex")
MAX_OUTPUT = (
    1024  # ShareGPT-like outputs clipped at 1024 tokens: a run of a few thousand requests is not one request's tail
)


def max_rate(
    instances,
    scheduler_name: str,
    stats,
    slo: SLO,
    seed: int,
    requests: int,
    predicted: float,
    attainment: float,
    iterations: int,
    trace: list,
) -> tuple[float, dict]:
    """Bisection over [0.1, 1.6] x the planner's predicted rate for the highest rate meeting `attainment`."""

    def probe(rate: float) -> dict:
        workload = sharegpt_like(requests, rate, seed=seed, max_output=MAX_OUTPUT)
        report = simulate(instances, make_scheduler(scheduler_name, seed, stats, slo), workload, slo).report.to_dict()
        trace.append(
            {
                "scheduler": scheduler_name,
                "seed": seed,
                "rate": rate,
                "attainment": report["slo_attainment"],
                "steady_tok_s": report["steady_throughput_tok_s"],
            }
        )
        return report

    lo, hi = 0.1 * predicted, 1.6 * predicted
    best = probe(lo)
    if best["slo_attainment"] < attainment:
        return 0.0, best
    top = probe(hi)
    if top["slo_attainment"] >= attainment:
        return hi, top
    for _ in range(iterations):
        mid = (lo + hi) / 2
        report = probe(mid)
        if report["slo_attainment"] >= attainment:
            lo, best = mid, report
        else:
            hi = mid
    return lo, best


def run_cluster(
    name: str, model: str, slo: SLO, seeds: list[int], requests: int, attainment: float, iterations: int
) -> dict:
    cluster = load_serving_cluster(HERE / "clusters" / f"{name}.toml")
    spec = get_model_spec(model)
    stats = workload_stats(
        sharegpt_like(5000, 1.0, seed=12345, max_output=MAX_OUTPUT)
    )  # the length distribution the planner sees
    plan = plan_deployment(spec, cluster, stats, slo)
    instances = plan.best.instances()
    per_instance = [o.estimate.output_tok_s for o in plan.best.choices for _ in range(o.instances)]
    results: dict = {
        "cluster": name,
        "contains": cluster.describe(),
        "deployment": plan.best.describe(),
        "predicted_tok_s": plan.best.output_tok_s,
        "predicted_req_s": plan.best.requests_s,
        "instance_tok_s": {o.label(): o.estimate.output_tok_s for o in plan.best.choices},
        # round robin gives every instance 1/N of the load, so the slowest saturates first: at best it
        # serves N x the slowest instance's rate, a capacity-aware scheduler the sum of all of them
        "rr_ceiling_gain": sum(per_instance) / (len(per_instance) * min(per_instance)) - 1,
        "schedulers": {},
        "probes": [],
    }
    for scheduler in SCHEDULERS:
        per_seed = []
        for seed in seeds:
            rate, report = max_rate(
                instances,
                scheduler,
                stats,
                slo,
                seed,
                requests,
                plan.best.requests_s,
                attainment,
                iterations,
                results["probes"],
            )
            per_seed.append(
                {
                    "seed": seed,
                    "rate": rate,
                    "tok_s_at_slo": rate * stats.mean_output,
                    "steady_tok_s": report.get("steady_throughput_tok_s", 0.0),
                    "completed": report.get("completed"),
                    "throughput_tok_s": report.get("throughput_tok_s", 0.0),
                    "attainment": report.get("slo_attainment", 0.0),
                    "ttft_p99_s": report.get("ttft_p99_s"),
                    "tpot_p99_s": report.get("tpot_p99_s"),
                    "imbalance": report.get("imbalance"),
                }
            )
            print(
                f"  {name} {scheduler:12s} seed {seed}: max rate {rate:6.2f} req/s, "
                f"{per_seed[-1]['tok_s_at_slo']:8.0f} tok/s (attainment {per_seed[-1]['attainment']:.1%}, "
                f"counted while arriving {per_seed[-1]['steady_tok_s']:8.0f} tok/s)",
                flush=True,
            )
        results["schedulers"][scheduler] = per_seed
    return results


def ratios(result: dict, scheduler: str, baseline: str = "round_robin") -> tuple[float, float, float]:
    base = {r["seed"]: r["tok_s_at_slo"] for r in result["schedulers"][baseline]}
    values = [r["tok_s_at_slo"] / base[r["seed"]] for r in result["schedulers"][scheduler] if base[r["seed"]] > 0]
    return min(values), statistics.median(values), max(values)


def table(result: dict) -> str:
    lines = [
        f"### {result['cluster']}: {result['contains']}; deployment {result['deployment']} "
        f"(planner predicts {result['predicted_tok_s']:,.0f} tok/s)",
        "",
        "per instance (planner): "
        + ", ".join(f"{k} {v:,.0f} tok/s" for k, v in result.get("instance_tok_s", {}).items())
        + f"; a capacity-aware scheduler's ceiling over round robin: +{result.get('rr_ceiling_gain', 0):.0%}",
        "",
        "| scheduler | max rate at SLO (req/s, median) | throughput at SLO (tok/s, median) "
        "| vs round robin (min / median / max) | TTFT P99 (s) | TPOT P99 (ms) | imbalance |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scheduler, runs in result["schedulers"].items():
        lo, med, hi = ratios(result, scheduler)
        mid = sorted(runs, key=lambda r: r["tok_s_at_slo"])[len(runs) // 2]
        lines.append(
            f"| {scheduler} | {statistics.median(r['rate'] for r in runs):.2f} "
            f"| {statistics.median(r['tok_s_at_slo'] for r in runs):,.0f} | {lo:.2f}x / {med:.2f}x / {hi:.2f}x "
            f"| {mid['ttft_p99_s']:.2f} | {mid['tpot_p99_s'] * 1e3:.0f} | {mid['imbalance']:.2f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib==3.11.2)"
    fig, axes = plt.subplots(1, 2 * len(results), figsize=(8 * len(results), 4.2))
    for k, result in enumerate(results):
        bars = axes[2 * k]
        names = list(result["schedulers"])
        medians = [statistics.median(r["tok_s_at_slo"] for r in result["schedulers"][n]) for n in names]
        bars.bar(names, medians, color=["#d62728" if n == "trex" else "#7f7f7f" for n in names])
        bars.set_title(f"{result['cluster']}: throughput at SLO")
        bars.set_ylabel("output tok/s")
        bars.tick_params(axis="x", rotation=45)
        curve = axes[2 * k + 1]
        seed0 = min(p["seed"] for p in result["probes"])
        for name in ("round_robin", "jsq", "po2", "trex"):
            points = sorted(
                (p["rate"], p["attainment"]) for p in result["probes"] if p["scheduler"] == name and p["seed"] == seed0
            )
            curve.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        curve.set_title(f"{result['cluster']}: SLO attainment vs rate (seed {seed0})")
        curve.set_xlabel("arrival rate (req/s)")
        curve.set_ylabel("SLO attainment")
        curve.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--requests", type=int, default=4000, help="requests per simulation (arrivals must outlast ramp-up)"
    )
    parser.add_argument("--iterations", type=int, default=5, help="bisection steps per scheduler and seed")
    parser.add_argument("--attainment", type=float, default=0.9, help="SLO attainment that counts as meeting the SLO")
    parser.add_argument("--ttft-slo", type=float, default=3.0)
    parser.add_argument("--tpot-slo", type=float, default=0.15)
    parser.add_argument("--quick", action="store_true", help="1 seed, 1500 requests, 3 bisection steps")
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for results.json and the plot")
    parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS), choices=CLUSTERS, help="clusters to run")
    parser.add_argument(
        "--combine",
        nargs="+",
        metavar="JSON",
        help="only print the tables and draw the plot of results files written by earlier runs",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.combine:
        results = [r for path in args.combine for r in json.loads(Path(path).read_text())]
        for result in results:
            print(table(result) + "\n")
        (out / "hetero_sim.json").write_text(json.dumps(results, indent=2) + "\n")
        print(plot(results, out / "hetero_sim.png"))
        return 0
    if args.quick:
        args.seeds, args.requests, args.iterations = 1, 1500, 3
    slo = SLO(args.ttft_slo, args.tpot_slo)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    results = [
        run_cluster(name, args.model, slo, list(range(args.seeds)), args.requests, args.attainment, args.iterations)
        for name in args.clusters
    ]
    print(
        f"\n{args.model}, ShareGPT-like requests ({args.requests} per run), {slo.describe()}, "
        f"SLO attainment >= {args.attainment:.0%}, "
        f"{args.seeds} seed(s); {time.time() - start:.0f} s\n"
    )
    for result in results:
        print(table(result) + "\n")
    if list(args.clusters) != list(CLUSTERS):  # a part: combine the parts with --combine
        (out / f"hetero_sim_{'_'.join(args.clusters)}.json").write_text(json.dumps(results, indent=2) + "\n")
        return 0
    (out / "hetero_sim.json").write_text(json.dumps(results, indent=2) + "\n")
    print(plot(results, out / "hetero_sim.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
