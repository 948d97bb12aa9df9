"""Planning speed: DeepSeek-V4-Pro on 1024 CloudMatrix384 dies (the issue's goal: <= 10 s on 2 cores).

    python bench/planner/speed.py [--repeat 3] [--workers 1]

Times the search (trex.planner.plan_parallel, model and cluster already loaded) and the
whole `trex plan` command in a fresh process (Python start, `import trex`, building the model
spec, search, baseline, printing), and reports the search space and what the bounds cut.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = [
    ("deepseek-v4-pro", "cloudmatrix384", 1024, 4096, 1024),
    ("deepseek-v4-flash", "cloudmatrix384", 256, 4096, 512),
    ("deepseek-v3", "h100", 1024, 4096, 8192),
    ("qwen3-235b-a22b", "h100", 256, 4096, 2048),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--all", action="store_true", help="also time V4-Flash, V3 and Qwen3")
    args = parser.parse_args()

    from trex.cost_model import get_cluster, get_model_spec
    from trex.planner import plan_parallel

    rows = []
    for model, cluster_name, devices, seq, gbs in CASES if args.all else CASES[:1]:
        spec, cluster = get_model_spec(model), get_cluster(cluster_name, devices)
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = plan_parallel(spec, cluster, seq=seq, gbs=gbs, workers=args.workers)
            times.append(time.perf_counter() - started)
        stats = result.search.stats
        best = result.best
        rows.append(
            {
                "model": model,
                "cluster": cluster_name,
                "devices": devices,
                "seq": seq,
                "gbs": gbs,
                "search_s": stats.seconds,
                "plan_parallel_s": times,
                "space": stats.space_size,
                "layer_choices": stats.layer_choices,
                "layer_pricings": stats.layer_pricings,
                "splits": stats.splits,
                "priced": stats.candidates_priced,
                "pruned": stats.pruned,
                "rejected_memory": stats.rejected_memory,
                "optimality_gap": stats.optimality_gap,
                "best": best.parallel.label() + f",mbs={best.parallel.mbs},{best.parallel.recompute}",
                "step_s": best.prediction.step_time_s,
                "mfu": best.prediction.mfu,
                "baseline": result.baseline.recipe.name if result.baseline else None,
                "baseline_step_s": result.baseline.plan.prediction.step_time_s
                if result.baseline and result.baseline.feasible
                else None,
            }
        )
    command = [
        sys.executable,
        "-m",
        "trex",
        "plan",
        "--model",
        CASES[0][0],
        "--cluster",
        CASES[0][1],
        "--devices",
        str(CASES[0][2]),
        "--seq",
        str(CASES[0][3]),
        "--gbs",
        str(CASES[0][4]),
        "--json",
        "--workers",
        str(args.workers),
    ]
    walls = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
    load = os.getloadavg()
    print(json.dumps({"cases": rows, "cli_wall_s": walls, "load_average": load, "cores": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
