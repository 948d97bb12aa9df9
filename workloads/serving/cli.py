"""`trex serve`: plan, simulate and route inference on heterogeneous clusters.

trex serve plan --cluster mix.toml --model llama3-70b --workload trace.jsonl --out plan.json
trex serve simulate --cluster mix.toml --model llama3-70b --scheduler trex --rate 40 --requests 2000 --seed 0 --json
trex serve profile --layers 4 --hidden 256 --threads 1 --out worker.json
trex serve worker --port 8101 --layers 2 --hidden 128
trex serve route --workers http://127.0.0.1:8101,http://127.0.0.1:8102 --scheduler trex --port 8100
"""

from __future__ import annotations

import argparse
import json
import sys

from trex.errors import TrexError


def _add_slo(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("latency SLOs (P99)")
    group.add_argument(
        "--ttft-slo", type=float, default=3.0, metavar="S", help="time to first token, seconds (default 3)"
    )
    group.add_argument(
        "--tpot-slo", type=float, default=0.15, metavar="S", help="time per output token, seconds (default 0.15)"
    )


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster", required=True, metavar="TOML", help="cluster file: one [[machines]] table (device, count) per type"
    )
    parser.add_argument(
        "--model", required=True, metavar="NAME_OR_CONFIG", help="a built-in model name or a transformers config.json"
    )
    parser.add_argument(
        "--weight-dtype", default="bf16", choices=("bf16", "fp16", "fp8"), help="weight precision (default bf16)"
    )
    parser.add_argument(
        "--kv-dtype", default="bf16", choices=("bf16", "fp16", "fp8"), help="KV-cache precision (default bf16)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        help="sequences per batch (default: vLLM's for the device: 1024 on >= 70 GiB devices but the A100, else 256)",
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        help="prompt tokens per prefill step (default: vLLM's for the device: 8192 on >= 70 GiB devices but the A100, "
        "else 2048)",
    )


def _add_workload(parser: argparse.ArgumentParser, *, rate_required: bool) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument(
        "--workload",
        metavar="TRACE",
        help="a JSONL trace or an Azure/Splitwise CSV trace (default: ShareGPT-like, seeded)",
    )
    group.add_argument(
        "--rate",
        type=float,
        required=rate_required,
        help="Poisson arrivals, requests/s (re-times a trace when given with one)",
    )
    group.add_argument("--requests", type=int, default=1000, help="synthetic requests to generate (default 1000)")
    group.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload and the random schedulers")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="plan, simulate and route LLM inference on heterogeneous clusters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="serve_command", required=True, metavar="SUBCOMMAND")

    plan = commands.add_parser("plan", help="choose TP degree and instance count per machine type under SLOs")
    _add_model(plan)
    _add_workload(plan, rate_required=False)
    _add_slo(plan)
    plan.add_argument("--out", metavar="JSON", help="write the deployment (for `simulate --deployment`)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=run_plan)

    sim = commands.add_parser("simulate", help="discrete-event simulation of a deployment under a scheduler")
    _add_model(sim)
    _add_workload(sim, rate_required=False)
    _add_slo(sim)
    sim.add_argument(
        "--scheduler", default="trex", help="round_robin, random, jsq, token_jsq, po2, weighted_rr, trex (default trex)"
    )
    sim.add_argument(
        "--deployment", metavar="JSON", help="a plan written by `trex serve plan --out` (default: plan it now)"
    )
    sim.add_argument(
        "--max-waiting", type=int, help="per-instance queue limit; requests beyond it are dropped (default: none)"
    )
    sim.add_argument(
        "--drain-s", type=float, default=3600.0, help="simulated seconds to drain after the last arrival (default 3600)"
    )
    sim.add_argument("--json", action="store_true", help="print the report as JSON")
    sim.set_defaults(run=run_simulate)

    from trex.workloads.serving.live_cli import add_live_commands

    add_live_commands(commands)


def _limits(args: argparse.Namespace):
    from trex.workloads.serving.errors import ServingError
    from trex.workloads.serving.instance_model import EngineLimits

    if args.max_num_seqs is None and args.max_batched_tokens is None:
        return None  # each machine type gets its engine's defaults
    if (args.max_num_seqs is not None and args.max_num_seqs < 1) or (
        args.max_batched_tokens is not None and args.max_batched_tokens < 1
    ):
        raise ServingError("--max-num-seqs and --max-batched-tokens must be at least 1")
    return EngineLimits(
        max_batched_tokens=args.max_batched_tokens or EngineLimits.max_batched_tokens,
        max_num_seqs=args.max_num_seqs or EngineLimits.max_num_seqs,
    )


def _slo(args: argparse.Namespace):
    from trex.workloads.serving.capacity import SLO
    from trex.workloads.serving.errors import ServingError

    if args.ttft_slo <= 0 or args.tpot_slo <= 0:
        raise ServingError(
            f"SLOs must be positive seconds (got --ttft-slo {args.ttft_slo}, --tpot-slo {args.tpot_slo})"
        )
    return SLO(args.ttft_slo, args.tpot_slo)


def _requests(args: argparse.Namespace):
    from trex.workloads.serving.workload import load_trace, sharegpt_like, with_poisson_arrivals

    if args.workload:
        requests = load_trace(args.workload)
        return with_poisson_arrivals(requests, args.rate, args.seed) if args.rate else requests
    return sharegpt_like(args.requests, args.rate or 1.0, args.seed)


def _plan(args: argparse.Namespace, requests):
    from trex.cost_model.model_spec import get_model_spec
    from trex.workloads.serving.cluster_spec import load_serving_cluster
    from trex.workloads.serving.deployment import plan_deployment
    from trex.workloads.serving.workload import workload_stats

    cluster = load_serving_cluster(args.cluster)
    spec = get_model_spec(args.model)
    return plan_deployment(
        spec,
        cluster,
        workload_stats(requests),
        _slo(args),
        limits=_limits(args),
        weight_dtype=args.weight_dtype,
        kv_dtype=args.kv_dtype,
    )


def run_plan(args: argparse.Namespace) -> int:
    from trex.workloads.serving.deployment import save_plan

    plan = _plan(args, _requests(args))
    if args.out:
        save_plan(plan, args.out)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    out = sys.stdout
    print(f"model {plan.model} on {plan.cluster}; {plan.workload.describe()}; {plan.slo.describe()}", file=out)
    print(f"chosen deployment: {plan.best.describe()}", file=out)
    print(
        f"  predicted {plan.best.output_tok_s:,.0f} output tok/s ({plan.best.requests_s:.2f} req/s) at the SLOs",
        file=out,
    )
    for option in plan.best.choices:
        est = option.estimate
        assert est is not None
        print(
            f"  {option.label()}: batch {est.batch} ({est.limit}), TPOT {est.tpot_s * 1e3:.0f} ms, "
            f"TTFT {est.ttft_s:.2f} s, "
            f"{option.output_tok_s:,.0f} tok/s; {option.memory.explain()}",
            file=out,
        )
    if plan.runners_up:
        print("runners-up:", file=out)
        for deployment, why in plan.runners_up:
            print(f"  {deployment.describe()} ({deployment.output_tok_s:,.0f} tok/s): {why}", file=out)
    rejected = [o for o in plan.options if not o.feasible]
    if rejected:
        print("rejected:", file=out)
        for option in rejected:
            print(f"  {option.label()}: {option.reason}", file=out)
    if args.out:
        print(f"wrote {args.out}", file=out)
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    from trex.workloads.serving.deployment import load_instances
    from trex.workloads.serving.schedulers import make_scheduler
    from trex.workloads.serving.simulator import simulate
    from trex.workloads.serving.workload import workload_stats

    if args.rate is None and not args.workload:
        raise TrexError("give --rate (Poisson requests/s) or --workload (a trace with arrival times)")
    requests = _requests(args)
    stats = workload_stats(requests)
    if args.deployment:
        instances, description = load_instances(args.deployment), f"deployment file {args.deployment}"
    else:
        plan = _plan(args, requests)
        instances, description = plan.best.instances(), f"planned: {plan.best.describe()}"
    scheduler = make_scheduler(args.scheduler, args.seed, stats, _slo(args))
    result = simulate(instances, scheduler, requests, _slo(args), max_waiting=args.max_waiting, drain_s=args.drain_s)
    report = result.report
    if args.json:
        print(
            json.dumps(
                {"deployment": description, "rate_req_s": args.rate, "seed": args.seed, **result.to_dict()}, indent=2
            )
        )
        return 0
    print(f"{description}; scheduler {args.scheduler}; {stats.describe()}")
    print(f"completed {report.completed}/{report.requests}, dropped {report.dropped}, unfinished {report.unfinished}")
    print(
        f"throughput {report.throughput_tok_s:,.0f} output tok/s "
        f"({report.steady_throughput_tok_s:,.0f} while arrivals last), "
        f"goodput {report.goodput_req_s:.2f} req/s, "
        f"SLO attainment {report.slo_attainment:.1%}"
    )
    print(
        f"TTFT P50/P99 {report.ttft_p50_s:.3f}/{report.ttft_p99_s:.3f} s, TPOT P50/P99 {report.tpot_p50_s * 1e3:.1f}/"
        f"{report.tpot_p99_s * 1e3:.1f} ms, imbalance {report.imbalance:.2f}"
    )
    for name, util in report.utilisation.items():
        print(f"  {name}: {report.requests_per_instance.get(name, 0)} requests, busy {util:.0%}")
    return 0
