"""How fast one step estimate is (the planner prices thousands of plans).

    python bench/cost_model/estimate_speed.py [--repeats 200]

Times `estimate_step` for representative (model, cluster, plan) triples and a sweep of distinct
plans for DeepSeek-V4-Pro on 1024 dies of cloudmatrix384 (each plan new, nothing cached between
them beyond the model spec).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from trex.cost_model.catalog import get_cluster
from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import InfeasiblePlan, ParallelConfig
from trex.cost_model.step import estimate_step

CASES = [
    ("gpt-175b", "a100", 64, ParallelConfig(tp=8, pp=8, vpp=3, seq=2048, gbs=64, attention_kernel="unfused")),
    (
        "deepseek-v3",
        "h100",
        1024,
        ParallelConfig(tp=2, pp=8, vpp=4, ep=64, seq=4096, gbs=8192, precision="fp8", dispatcher="deepep"),
    ),
    ("qwen3-235b-a22b", "h100", 256, ParallelConfig(tp=2, pp=8, vpp=4, ep=32, seq=4096, gbs=2048)),
    ("deepseek-v4-pro", "cloudmatrix384", 1024, ParallelConfig(tp=4, pp=8, vpp=2, ep=64, seq=4096, gbs=1024)),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    print("| model | cluster | plan | ms per estimate |")
    print("| --- | --- | --- | --- |")
    for model, cluster_name, devices, plan in CASES:
        spec, cluster = get_model_spec(model), get_cluster(cluster_name, devices)
        estimate_step(spec, cluster, plan)
        start = time.perf_counter()
        for _ in range(args.repeats):
            estimate_step(spec, cluster, plan)
        print(
            f"| {model} | {devices} x {cluster_name} | {plan.label()} | {(time.perf_counter() - start) / args.repeats * 1e3:.3f} |"
        )
    spec, cluster = get_model_spec("deepseek-v4-pro"), get_cluster("cloudmatrix384", 1024)
    priced = infeasible = 0
    start = time.perf_counter()
    for tp, pp, vpp, ep, mbs in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2), (8, 16, 32, 64, 128), (1, 2)):
        plan = ParallelConfig(tp=tp, pp=pp, vpp=vpp, ep=ep, mbs=mbs, seq=4096, gbs=1024)
        try:
            estimate_step(spec, cluster, plan)
            priced += 1
        except InfeasiblePlan:
            infeasible += 1
    elapsed = time.perf_counter() - start
    print()
    print(
        f"sweep: {priced} plans priced and {infeasible} rejected by validation in {elapsed:.2f} s "
        f"({elapsed / max(priced, 1) * 1e3:.2f} ms per priced plan)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
