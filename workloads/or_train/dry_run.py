"""`trex train sft|cpt --dry-run`: what the run would cost at scale, priced by the cost model, with no weights.

For DeepSeek-V4-Flash on an Ascend SuperPOD (`--cluster cloudmatrix384 --devices N`): the parallel
plan (the planner's best, or `--plan`), the predicted step time and MFU, the memory per device, and
the time for the data: `--samples` (default 10,000, the size of T-Rex's SFT set) x `--epochs`.

Steps for the data: with packing, a step holds gbs*seq tokens, so steps = samples*epochs*tokens per
sample / (gbs*seq) when `--tokens-per-sample` is known; without it trex assumes one sample per row
(steps = samples*epochs/gbs), an upper bound it states in the output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from trex.errors import TrexError


def dry_run(args: argparse.Namespace, kind: str) -> int:
    from trex.cost_model.catalog import get_cluster

    if not args.model:
        raise TrexError("--model is required")
    if args.cluster is None or args.devices is None:
        raise TrexError(
            "--dry-run prices the run on a cluster: pass --cluster NAME --devices N (e.g. cloudmatrix384 256)"
        )
    if args.devices < 1 or args.samples < 1:
        raise TrexError("--devices and --samples must be positive")
    epochs = args.epochs if args.epochs is not None else 1.0
    cluster = get_cluster(args.cluster, args.devices)
    precision = "bf16" if args.precision == "fp32" and args.cluster != "cpu" else args.precision
    if args.plan and args.plan != "auto":
        best = _priced_plan(args, cluster, precision)
    else:
        from trex.planner import plan_parallel

        result = plan_parallel(
            args.model, cluster, seq=args.seq, gbs=args.gbs, precision=precision, top=0, baseline=None
        )
        if result.best is None:
            raise TrexError(
                f"no plan fits {args.model} on {args.devices} devices of {args.cluster} at seq {args.seq}, gbs {args.gbs}"
            )
        best = result.to_dict()["best"]
    tokens_per_sample = getattr(args, "tokens_per_sample", None)
    if tokens_per_sample:
        steps = math.ceil(args.samples * epochs * tokens_per_sample / (args.gbs * args.seq))
        basis = f"{tokens_per_sample} tokens per sample, packed into rows of {args.seq}"
    else:
        steps = math.ceil(args.samples * epochs / args.gbs)
        basis = f"one sample per row of {args.seq} tokens (an upper bound; give --tokens-per-sample for packing)"
    report = {
        "mode": kind,
        "model": args.model,
        "cluster": args.cluster,
        "devices": args.devices,
        "precision": precision,
        "seq": args.seq,
        "gbs": args.gbs,
        "plan": {
            k: best[k] for k in ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero", "mbs", "recompute") if k in best
        },
        "step_time_s": best["step_time_s"],
        "mfu": best["mfu"],
        "memory_per_device_gib": best["memory_per_device_gib"],
        "samples": args.samples,
        "epochs": epochs,
        "steps": steps,
        "steps_basis": basis,
        "time_for_data_s": steps * best["step_time_s"],
        "weights_allocated": False,
    }
    if precision != args.precision:
        report["note"] = f"priced in {precision}: --precision {args.precision} is the CPU default, not a cluster recipe"
    if args.json:
        print(json.dumps(report))
        return 0
    plan = ", ".join(f"{k}={v}" for k, v in report["plan"].items())
    hours = report["time_for_data_s"] / 3600
    print(
        f"trex train {kind} --dry-run: {args.model} on {args.devices} x {args.cluster} ({precision}, seq {args.seq}, gbs {args.gbs})\n"
        f"  plan            {plan}\n"
        f"  step time       {report['step_time_s']:.3f} s (predicted), MFU {100 * report['mfu']:.1f}%\n"
        f"  memory/device   {report['memory_per_device_gib']:.1f} GiB\n"
        f"  data            {args.samples} samples x {epochs:g} epochs = {steps} steps ({basis})\n"
        f"  time for data   {report['time_for_data_s']:.0f} s ({hours:.2f} h)\n"
        "  nothing was allocated: the numbers come from the cost model",
        file=sys.stdout,
    )
    return 0


def _priced_plan(args: argparse.Namespace, cluster: Any, precision: str) -> dict[str, Any]:
    from trex.cost_model.model_spec import get_model_spec
    from trex.cost_model.parallel import parse_plan
    from trex.cost_model.step import estimate_step

    plan = parse_plan(args.plan, seq=args.seq, gbs=args.gbs, mbs=args.mbs, precision=precision)
    if plan.dp is None:
        per_replica = plan.tp * plan.pp * plan.cp
        if args.devices % per_replica:
            raise TrexError(f"--plan {args.plan}: tp*pp*cp = {per_replica} does not divide --devices {args.devices}")
        import dataclasses

        plan = dataclasses.replace(plan, dp=args.devices // per_replica)
    estimate = estimate_step(get_model_spec(args.model), cluster, plan)
    out = estimate.to_dict()
    if not estimate.feasible:
        raise TrexError(f"--plan {args.plan} does not fit: {'; '.join(estimate.memory_violations())}")
    return {
        **{k: getattr(plan, k) for k in ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero", "mbs", "recompute")},
        "step_time_s": out["step_time_s"],
        "mfu": out["mfu"],
        "memory_per_device_gib": estimate.memory.total / 2**30,
    }
