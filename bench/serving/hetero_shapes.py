"""How trex's gain over round robin on a GPU + NPU cluster depends on the cluster's shape.

The seed paper (arXiv 2504.15303) reports +122.5% and +33.6% over round robin on two heterogeneous
clusters of GPUs and NPUs; what we could read of it (../shared/reference/hetero_serving.md and the
public abstract) does not say which devices, how many, or which model. The acceptance bench
(hetero_sim.py) fixes one GPU + NPU cluster; this one sweeps the choices that were assumed - GPU
type, NPU type (32 GB 910B4 or 64 GB 910B), two servers or three, the model - and reports for each
shape the deployment `trex serve plan` chooses, the ceiling of any capacity-aware scheduler over
round robin on that deployment (sum of instance rates / (N x the slowest) - 1: round robin saturates
at N x the slowest instance), and the simulated gain of trex over round robin at equal SLO
attainment (the bisection of hetero_sim.py, fewer requests and steps). Every shape is reported; none
is picked.

    python bench/serving/hetero_shapes.py                   # 8 shapes x llama3-70b, 1 seed
    python bench/serving/hetero_shapes.py --models llama3-70b qwen3-235b-a22b
    python bench/serving/hetero_shapes.py --plot-only       # the plot of results/hetero_shapes.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from hetero_sim import MAX_OUTPUT, max_rate

from trex.cost_model.model_spec import get_model_spec
from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.cluster_spec import load_serving_cluster
from trex.workloads.serving.deployment import plan_deployment
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.workload import sharegpt_like, workload_stats

HERE = Path(__file__).parent
GPUS = ("h100", "a100")
NPUS = ("ascend-910b4", "ascend-910b")
SERVERS = ((1, 1), (1, 2))  # (GPU servers, NPU servers) of 8 devices each


def shape_toml(gpu: str, npu: str, gpu_servers: int, npu_servers: int) -> str:
    return (
        f'name = "{gpu}+{npu} {gpu_servers}x8+{npu_servers}x8"\n\n'
        f'[[machines]]\ndevice = "{gpu}"\ncount = {8 * gpu_servers}\n\n'
        f'[[machines]]\ndevice = "{npu}"\ncount = {8 * npu_servers}\n'
    )


def run_shape(path: Path, model: str, slo: SLO, requests: int, iterations: int, schedulers: list[str]) -> dict:
    cluster = load_serving_cluster(path)
    stats = workload_stats(sharegpt_like(5000, 1.0, seed=12345, max_output=MAX_OUTPUT))
    plan = plan_deployment(get_model_spec(model), cluster, stats, slo)
    per_instance = [o.estimate.output_tok_s for o in plan.best.choices for _ in range(o.instances)]
    result = {
        "cluster": cluster.describe(),
        "model": model,
        "deployment": plan.best.describe(),
        "instance_tok_s": {o.label(): o.estimate.output_tok_s for o in plan.best.choices},
        "slowest_over_fastest": min(per_instance) / max(per_instance),
        "rr_ceiling_gain": sum(per_instance) / (len(per_instance) * min(per_instance)) - 1,
        "rates": {},
    }
    for scheduler in schedulers:
        rate, _ = max_rate(
            plan.best.instances(), scheduler, stats, slo, 0, requests, plan.best.requests_s, 0.9, iterations, []
        )
        result["rates"][scheduler] = rate
    base = result["rates"].get("round_robin", 0.0)
    result["gain_over_rr"] = {s: (r / base - 1 if base else float("nan")) for s, r in result["rates"].items()}
    return result


ANCHORS = (1.225, 0.336)  # the paper's gains over round robin (which cluster each belongs to is not given)


def plot_shapes(results: list[dict], path: Path) -> str:
    """Gain over round robin against the deployment's slowest / fastest instance rate, one point per shape and
    scheduler, with each shape's ceiling (round robin saturates at N x the slowest instance) and the anchors."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib==3.11.2)"
    shapes = [r for r in results if "gain_over_rr" in r]
    fig, ax = plt.subplots(figsize=(8.5, 5))
    x = [r["slowest_over_fastest"] for r in shapes]
    ax.scatter(x, [100 * r["rr_ceiling_gain"] for r in shapes], marker="_", s=400, color="black",
               label="ceiling: sum(c_i) / (N min c_i) - 1")  # fmt: skip
    for name, marker, color in (("jsq", "s", "#1f77b4"), ("po2", "^", "#2ca02c"), ("trex", "o", "#d62728")):
        ax.scatter(x, [100 * r["gain_over_rr"].get(name, float("nan")) for r in shapes], marker=marker,
                   color=color, label=name, alpha=0.8)  # fmt: skip
    for gain in ANCHORS:
        ax.axhline(100 * gain, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(f"paper +{100 * gain:.1f}%", (0.98, 100 * gain), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=8, color="grey")  # fmt: skip
    for r, xi in zip(shapes, x):
        label = r["cluster"].split(":")[0] if ":" in r["cluster"] else r["cluster"]
        ax.annotate(label, (xi, 100 * r["gain_over_rr"].get("trex", 0.0)), fontsize=6, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("slowest / fastest instance (the planner's per-instance output tok/s)")
    ax.set_ylabel("throughput at SLO over round robin (%)")
    ax.set_title("GPU + NPU shapes: gain over round robin (Llama-3-70B)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama3-70b"])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--schedulers", nargs="+", default=["round_robin", "jsq", "po2", "trex"])
    parser.add_argument("--limit", type=int, default=0, help="only the first N shapes (a smoke run)")
    parser.add_argument("--out", default=str(HERE / "results" / "hetero_shapes.json"))
    parser.add_argument("--plot-only", action="store_true", help="plot the results already in --out; run nothing")
    args = parser.parse_args(argv)
    if args.plot_only:
        print(plot_shapes(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png")))
        return 0
    slo = SLO(3.0, 0.15)
    shapes = list(itertools.product(args.models, GPUS, NPUS, SERVERS))
    if args.limit:
        shapes = shapes[: args.limit]
    results, start = [], time.time()
    with tempfile.TemporaryDirectory() as folder:
        for model, gpu, npu, (gpu_servers, npu_servers) in shapes:
            path = Path(folder) / f"{gpu}_{npu}_{gpu_servers}_{npu_servers}.toml"
            path.write_text(shape_toml(gpu, npu, gpu_servers, npu_servers))
            try:
                result = run_shape(path, model, slo, args.requests, args.iterations, args.schedulers)
            except ServingError as error:  # e.g. the model fits no instance of one machine type
                result = {"cluster": path.stem, "model": model, "error": str(error)}
                print(f"{model} on {path.stem}: {error}", flush=True)
                results.append(result)
                continue
            results.append(result)
            gains = ", ".join(f"{s} {g:+.0%}" for s, g in result["gain_over_rr"].items() if s != "round_robin")
            print(
                f"{model} on {result['cluster']}: {result['deployment']}; slowest/fastest instance "
                f"{result['slowest_over_fastest']:.2f}, ceiling +{result['rr_ceiling_gain']:.0%}; vs round robin: "
                f"{gains}",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(results)} shapes in {time.time() - start:.0f} s; {args.out}")
    print(plot_shapes(results, Path(args.out).with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
