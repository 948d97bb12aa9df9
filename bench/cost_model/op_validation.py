"""Predicted vs measured per-op times on this machine (issue 3, item 9).

    python bench/cost_model/op_validation.py [--seq 256] [--threads 1]

Calibrates the cpu profile (`trex calibrate`'s full mode, without collectives), captures the joint
forward+backward graphs of the tiny DeepSeek-V4, DeepSeek-V3 and Qwen3-MoE models with
`trex.compile`, times every priced node on its own (fastest of several calls) and compares with the
time `annotate` predicts. Reports the Spearman rank correlation and the median relative error, per
model and per op kind. Views and waits are excluded (priced at zero by definition).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence of the tiny models' inputs (batch 2)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for calibration and measurement")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import trex
    from trex.cost_model.calibrate import calibrate
    from trex.cost_model.op_timing import median_relative_error, spearman, time_graph
    from trex.models import TINY_FAMILIES, build_model, tiny_config

    started = time.perf_counter()
    calibration = calibrate(fast=False, collectives=False, threads=args.threads)
    cluster = calibration.cluster()
    print(f"calibrated in {calibration.seconds:.1f} s: {calibration.profile.description}")
    everything = []
    print("| model | priced nodes timed | Spearman | median relative error |")
    print("| --- | --- | --- | --- |")
    for family in TINY_FAMILIES:
        config = tiny_config(family)
        compiled = trex.compile(build_model(config))
        ids = torch.randint(0, config.vocab_size, (2, args.seq), generator=torch.Generator().manual_seed(0))
        compiled(input_ids=ids, labels=ids)
        for graph in compiled.trex.graphs:
            if graph.joint is None:
                continue
            timings = time_graph(graph.joint, cluster)
            everything.extend(timings)
            rho = spearman([t.predicted_s for t in timings], [t.measured_s for t in timings])
            print(f"| tiny {family} | {len(timings)} | {rho:.3f} | {median_relative_error(timings):.1%} |")
    rho = spearman([t.predicted_s for t in everything], [t.measured_s for t in everything])
    print(f"| all | {len(everything)} | {rho:.3f} | {median_relative_error(everything):.1%} |")
    print()
    print("| op kind | nodes | Spearman | median predicted (us) | median measured (us) | measured time share |")
    print("| --- | --- | --- | --- | --- | --- |")
    by_kind = defaultdict(list)
    for t in everything:
        by_kind[t.kind].append(t)
    total = sum(t.measured_s for t in everything)
    for kind, items in sorted(by_kind.items(), key=lambda kv: -sum(t.measured_s for t in kv[1])):
        rho_k = (
            spearman([t.predicted_s for t in items], [t.measured_s for t in items]) if len(items) > 2 else float("nan")
        )
        print(
            f"| {kind} | {len(items)} | {rho_k:.2f} | {statistics.median(t.predicted_s for t in items) * 1e6:.1f} | "
            f"{statistics.median(t.measured_s for t in items) * 1e6:.1f} | {sum(t.measured_s for t in items) / total:.1%} |"
        )
    predicted_total = sum(t.predicted_s for t in everything)
    print()
    print(
        f"summed over all timed nodes: predicted {predicted_total * 1e3:.1f} ms, measured {total * 1e3:.1f} ms; {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
