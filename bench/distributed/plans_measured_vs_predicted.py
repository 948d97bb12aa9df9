"""Measured vs predicted step time and memory per rank for many plans on N CPU ranks (gloo).

    trex calibrate --ranks 4 --threads 1        # the `cpu` profile: compute, and gloo per kind over 2 and 4 ranks
    python bench/distributed/plans_measured_vs_predicted.py --nproc 4 --steps 4

All plans run in ONE start of N ranks (`trex.runtime.launcher.run_jobs`), one after the other, on a
small Qwen3-MoE built from a config written next to the results (random init, seed 0). For every plan:
the median step time (steps after the first), the largest per-rank memory (parameters, gradients,
optimizer states from the tensors; activations from saved-tensor accounting), the cost model's
prediction on the calibrated `cpu` cluster (calibrate with `--ranks` = `--nproc`, under the same load as the
run: the gloo collectives' cost depends on how many processes share the cores), and whether its losses equal
the 1-rank run. At the end:
Spearman rank correlation of predicted vs measured step time and memory, and the exactness of the
static memory (parameters + gradients + optimizer states).

Then the overhead check: trex's 1-rank step with the trivial plan against a plain single-process
training step (the same model, data, loss and AdamW written directly), interleaved, ratios min/median/max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

PLANS_4 = [
    "zero=0",
    "zero=1",
    "zero=2",
    "zero=3",
    "ep=2",
    "ep=4",
    "ep=4,zero=2",
    "ep=2,zero=3",
    "tp=2",
    "tp=2,zero=2",
    "tp=4",
]
PLANS_2 = ["zero=0", "zero=1", "zero=2", "zero=3", "ep=2", "ep=2,zero=2", "tp=2", "tp=2,zero=2"]


def bench_config(path: Path) -> Path:
    from trex.models import tiny_config

    config = tiny_config("qwen3-moe", hidden_size=256, num_layers=4, vocab_size=2048, num_experts=16)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 8, 4, 32
    config.intermediate_size, config.moe_intermediate_size = 512, 128
    config.save_pretrained(path)
    return path / "config.json"


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):  # average ranks for ties
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def plain_step_seconds(model_path: str, seq: int, gbs: int, mbs: int, steps: int) -> list[float]:
    """The baseline: a hand-written single-process step (no trex runtime) on the same model and data."""
    import torch
    import torch.nn.functional as F

    from trex.models import build_model, load_config
    from trex.runtime.data import TokenSource, micro_batches

    config = load_config(model_path)
    model = build_model(config, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)
    source = TokenSource("synthetic", vocab_size=config.vocab_size, seq=seq, gbs=gbs, seed=0)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        for batch in micro_batches(source.global_batch(step), mbs):
            logits = model(input_ids=batch.inputs, use_cache=False).logits
            (
                F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), reduction="sum") / (gbs * seq)
            ).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def _issued(counts) -> str:
    """The rank's counted ops (`runtime.issued_ops`), or why they were not counted."""
    if isinstance(counts, dict):
        return f"{counts['plain_ops']}, {counts['dtensor_ops']}, {counts['fsdp_unit_passes']}"
    return str(counts or "not counted (profile without eager issue costs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--gbs", type=int, default=8)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--overhead-rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    parser.add_argument(
        "--model", default="bench", help="'bench' (the Qwen3-MoE written by this script) or a model name / config.json"
    )
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--overhead-only", action="store_true", help="skip the plans; only the 1-rank overhead check")
    args = parser.parse_args()

    import torch

    from trex.errors import TrexError
    from trex.models import load_config
    from trex.runtime.launcher import launch_function, run_jobs
    from trex.runtime.prediction import predict
    from trex.runtime.trainer import TrainJob, execute

    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="trex-bench-dist-"))
    model = str(bench_config(workdir / "model")) if args.model == "bench" else args.model
    config = load_config(model)
    shape = {"seq": args.seq, "gbs": args.gbs, "mbs": args.mbs, "precision": args.precision}
    plans, jobs = [], []
    for plan in [] if args.overhead_only else PLANS_4 if args.nproc == 4 else PLANS_2:
        try:
            jobs.append(TrainJob.create(model, plan, args.nproc, **shape, steps=args.steps, verbose=False))
            plans.append(plan)
        except TrexError as refused:  # a plan this model cannot take (tp not dividing V4's output groups, ...)
            print(f"{plan}: refused: {refused}", file=sys.stderr)
    reference = execute(TrainJob.create(model, "", 1, **shape, steps=args.steps, verbose=False))
    started = time.perf_counter()
    results = launch_function(run_jobs, (jobs,), args.nproc)[0] if jobs else []
    print(f"{len(plans)} plans on {args.nproc} ranks in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    rows = []
    for plan_text, job, result in zip(plans, jobs, results):
        predicted = predict(config, job.parallel, args.nproc)
        measured_step = statistics.median(result["step_times_s"][1:] or result["step_times_s"])
        peak = max(result["memory_by_rank"], key=lambda m: m["total"])
        per_rank_static = [m["parameters"] + m["gradients"] + m["optimizer_states"] for m in result["memory_by_rank"]]
        # torch.chunk splits odd-sized tensors unevenly over ZeRO/FSDP ranks: the prediction is the mean over ranks
        static = statistics.fmean(per_rank_static)
        pm = predicted.get("memory_bytes") or {}
        static_predicted = pm.get("parameters", 0) + pm.get("gradients", 0) + pm.get("optimizer_states", 0)
        same = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(result["losses"], reference["losses"]))
        rows.append(
            {
                "plan": plan_text,
                "measured_step_s": measured_step,
                "predicted_step_s": predicted.get("step_time_s"),
                "measured_memory": peak["total"],
                "predicted_memory": predicted.get("memory_per_rank_bytes"),
                "static_measured": static,
                "static_predicted": static_predicted,
                "static_largest_rank": max(per_rank_static),
                "activations_measured": peak["activations"],
                "activations_predicted": pm.get("activations"),
                "activations_mean_measured": statistics.fmean(m["activations"] for m in result["memory_by_rank"]),
                "activations_production_kernels": predicted.get("activations_production_kernels"),
                "activation_model": predicted.get("activation_model"),
                "losses_equal_1_rank": same,
                "predicted_breakdown_s": predicted.get("step_breakdown_s"),
                "grad_reduce_calls": predicted.get("grad_reduce_calls"),
                "issued_ops": predicted.get("issued_ops") or predicted.get("issue_note"),
            }
        )
    print(
        "| plan | measured step (ms) | predicted step (ms) | measured memory/rank (KiB) | predicted (KiB) | "
        "static measured (mean over ranks) = predicted | "
        "activations measured (largest rank / mean) / predicted (KiB) | measured / predicted | "
        "production-kernel formula (KiB) | losses = 1-rank |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        static = f"no: {r['static_measured']:.0f} vs {r['static_predicted']:.0f}"
        excess = r["static_largest_rank"] - r["static_predicted"]
        static = (
            (f"yes (largest rank {excess:+.0f} B)" if excess else "yes")
            if r["static_measured"] == r["static_predicted"]
            else static
        )
        print(
            f"| {r['plan']} | {r['measured_step_s'] * 1e3:.1f} | {r['predicted_step_s'] * 1e3:.2f} | "
            f"{r['measured_memory'] / 1024:.0f} | "
            f"{r['predicted_memory'] / 1024:.0f} | "
            f"{static} | "
            f"{r['activations_measured'] / 1024:.0f} / {r['activations_mean_measured'] / 1024:.0f} / "
            f"{r['activations_predicted'] / 1024:.0f} | "
            f"{r['activations_measured'] / r['activations_predicted']:.3f} / "
            f"{r['activations_mean_measured'] / r['activations_predicted']:.3f} | "
            f"{r['activations_production_kernels'] / 1024:.0f} | "
            f"{'yes' if r['losses_equal_1_rank'] else 'NO'} |"
        )
    print(f"\nactivations predicted by: {sorted({r['activation_model'] for r in rows})}")
    from trex.cost_model.catalog import get_cluster

    cluster = get_cluster("cpu", args.nproc)
    print(
        f"\npredicted on: {cluster.description}; {cluster.cores or '?'} cores shared by {args.nproc} ranks "
        f"(time share {cluster.time_share:g}); gloo kinds measured: "
        f"{', '.join(sorted({f'{m.kind}/{m.group}' for t in cluster.tiers for m in t.collectives})) or 'none'}"
    )
    print(
        "\n| plan | compute | exposed comm (tp/ep + dp) | dp sync | optimizer | host wait | eager issue | "
        "dp calls (dense, expert) | issued per step (plain ops, DTensor ops, FSDP2 unit passes) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        b = r["predicted_breakdown_s"] or {}
        print(
            f"| {r['plan']} | {b.get('compute', 0) * 1e3:.1f} | {b.get('exposed_communication', 0) * 1e3:.1f} | "
            f"{b.get('data_parallel_sync', 0) * 1e3:.1f} | {b.get('optimizer', 0) * 1e3:.1f} | "
            f"{b.get('host_wait', 0) * 1e3:.1f} | {b.get('eager_issue', 0) * 1e3:.1f} | {r['grad_reduce_calls']} | "
            f"{_issued(r['issued_ops'])} |"
        )
    step_rho = memory_rho = float("nan")
    if len(rows) > 1:
        step_rho = spearman([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows])
        memory_rho = spearman([r["predicted_memory"] for r in rows], [r["measured_memory"] for r in rows])
    print(
        f"\nSpearman(predicted, measured): step time {step_rho:.2f}, memory per rank {memory_rho:.2f} over "
        f"{len(rows)} plans"
    )

    # Overhead of the runtime on one rank with the trivial plan, interleaved with the plain loop (fp32: the plain
    # loop has no autocast).
    trex_times, plain_times = [], []
    shape["precision"] = "fp32"
    for _ in range(args.overhead_rounds):
        trex_times.append(
            statistics.median(
                execute(TrainJob.create(model, "", 1, **shape, steps=3, verbose=False))["step_times_s"][1:]
            )
        )
        plain_times.append(statistics.median(plain_step_seconds(model, args.seq, args.gbs, args.mbs, 3)[1:]))
    ratios = [t / p for t, p in zip(trex_times, plain_times)]
    if ratios:
        print(
            f"1-rank overhead trex/plain step: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max "
            f"{max(ratios):.3f} "
            f"(trex median {statistics.median(trex_times) * 1e3:.1f} ms, plain "
            f"{statistics.median(plain_times) * 1e3:.1f} ms)"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"rows": rows, "spearman_step": step_rho, "spearman_memory": memory_rho, "overhead_ratios": ratios},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
