"""`trex estimate`: price one training step of a parallel plan on a cluster, analytically.

    trex estimate --model deepseek-v3 --cluster h100 --devices 1024 \\
        --plan "tp=2,pp=8,vpp=4,ep=64" --seq 4096 --gbs 8192 --precision fp8 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from trex.cli.training_options import add_training_arguments, check_sizes


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="estimate step time, MFU and memory of a parallel plan (no hardware needed)",
        description="Price one training step of PLAN for MODEL on CLUSTER with the analytical cost model. "
        "MFU uses Megatron's per-GEMM model-FLOP count over the dense BF16 peak; mfu_6n uses 6*N_active + attention.",
    )
    add_training_arguments(parser, required=True)
    parser.add_argument(
        "--plan",
        default="",
        help='parallel degrees, e.g. "tp=8,pp=8,vpp=3,ep=1,etp=1,cp=1,dp=1,zero=1" (dp derived when omitted)',
    )
    parser.add_argument("--mbs", type=int, default=1, help="micro-batch size in sequences (default 1)")
    parser.add_argument(
        "--recompute",
        default="selective",
        help="(default selective) none | selective | full | selective:<module>+<module> (core_attn, mla_up_proj, layernorm, moe_act, mlp, moe, shared_experts)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other plan field, e.g. --set dispatcher=deepep --set moe_imbalance=1.2 --set attention_kernel=unfused "
        "--set fp8_recipe=tensorwise (delayed, tensorwise, blockwise)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (infeasible plans are reported as data)"
    )
    parser.add_argument(
        "--trace", metavar="OUT.json", help="write a Chrome-trace timeline of one step (open in ui.perfetto.dev)"
    )
    parser.add_argument(
        "--layers",
        action="store_true",
        help="also show where the time goes: each pipeline device's chunks, time and memory, and each layer kind op by op "
        "(GEMMs, attention, pointwise, exposed communication) for one micro-batch",
    )
    parser.set_defaults(run=run)


def _coerce(field: str, raw: str, current: object) -> object:
    from trex.errors import TrexError

    if isinstance(current, bool):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise TrexError(f"--set {field}={raw}: expected true or false")
    if isinstance(current, int) and not isinstance(current, bool):
        try:
            return int(raw)
        except ValueError:
            raise TrexError(f"--set {field}={raw}: expected an integer") from None
    if isinstance(current, float):
        try:
            return float(raw)
        except ValueError:
            raise TrexError(f"--set {field}={raw}: expected a number") from None
    if field == "layers_per_chunk":
        return tuple(int(x) for x in raw.split(","))
    return raw


def build_plan(args: argparse.Namespace):
    import dataclasses

    from trex.cost_model.parallel import PLAN_STRING_KEYS, parse_plan

    plan = parse_plan(
        args.plan, seq=args.seq, gbs=args.gbs, mbs=args.mbs, precision=args.precision, recompute=args.recompute
    )
    own_option = {
        **{key: "--plan" for key in PLAN_STRING_KEYS},
        "seq": "--seq",
        "gbs": "--gbs",
        "mbs": "--mbs",
        "precision": "--precision",
        "recompute": "--recompute",
    }
    return dataclasses.replace(plan, **parse_sets(args.set, plan, own_option))


def parse_sets(items: list[str], base, own_option: dict[str, str]) -> dict:
    """`--set FIELD=VALUE` items as ParallelConfig updates, typed like `base`'s fields. A field that
    has its own option (`own_option`: field -> option) or is given twice with different values is an
    error: nothing the user wrote is silently overridden."""
    import dataclasses

    from trex.cost_model.parallel import ParallelConfig
    from trex.errors import TrexError

    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    updates: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise TrexError(f"--set {item!r}: write FIELD=VALUE")
        key, raw = (s.strip() for s in item.split("=", 1))
        if key not in fields:
            raise TrexError(f"--set: unknown plan field {key!r}; fields: {', '.join(sorted(fields))}")
        if key in own_option:
            raise TrexError(
                f"--set {key}=...: {key} is set with {own_option[key]}"
                + (f' (e.g. --plan "{key}={raw}")' if own_option[key] == "--plan" else "")
            )
        current = getattr(base, key)
        value = _coerce(key, raw, current if current is not None else 0)
        if key in updates and updates[key] != value:
            raise TrexError(f"--set {key} is given twice ({updates[key]!r} and {value!r}); keep one")
        updates[key] = value
    return updates


def run(args: argparse.Namespace) -> int:
    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.model_spec import get_model_spec
    from trex.cost_model.parallel import InfeasiblePlan, settings_without_effect
    from trex.cost_model.step import estimate_step

    check_sizes(args)
    if args.trace:
        from trex.outputs import output_file

        output_file(args.trace, "--trace")
    spec = get_model_spec(args.model)
    cluster = get_cluster(args.cluster, args.devices, device=args.device)
    plan = build_plan(args)
    given = [item.split("=", 1)[0].strip() for item in args.set]
    notes = settings_without_effect(plan, given)
    for note in notes:
        print(f"trex estimate: note: {note}", file=sys.stderr)
    try:
        estimate = estimate_step(spec, cluster, plan)
    except InfeasiblePlan as error:
        if args.json:
            print(
                json.dumps(
                    {
                        "model": spec.name,
                        "cluster": cluster.name,
                        "devices": cluster.devices,
                        "plan": plan.to_dict(),
                        "feasible": False,
                        "violations": error.violations,
                        "settings_without_effect": notes,
                    },
                    indent=2,
                )
            )
            return 1
        raise
    if args.trace:
        from trex.cost_model.trace import write_trace

        write_trace(estimate, args.trace)
    layers = None
    if args.layers:
        from trex.cost_model.layer_cost import layer_breakdown

        layers = layer_breakdown(spec, estimate.plan, cluster)
    if args.json:
        data = estimate.to_dict()
        data["settings_without_effect"] = notes
        if layers is not None:
            counts = _kind_counts(spec)
            data["layers"] = {kind: {"count": counts.get(kind, 0), **cost.to_dict()} for kind, cost in layers.items()}
        print(json.dumps(data, indent=2))
        return 0 if estimate.feasible else 1
    print_estimate(estimate, spec, args.trace)
    if layers is not None:
        print_stages(estimate)
        print_layers(layers, spec)
    return 0 if estimate.feasible else 1


def _kind_counts(spec) -> dict[str, int]:
    counts: dict[str, int] = {}
    for layer in (*spec.layers, *spec.mtp_layers):
        counts[layer.kind] = counts.get(layer.kind, 0) + 1
    return counts


def print_stages(estimate) -> None:
    """One row per pipeline device: the layers of its chunks, its time per micro-batch, its memory."""
    from rich.console import Console
    from rich.table import Table

    stages = estimate.stages()
    slowest = max(stage["time_per_microbatch_s"] for stage in stages)
    table = Table(
        title=f"pipeline: {estimate.plan.pp} devices x {estimate.plan.vpp} chunks, {estimate.plan.microbatches} micro-batches",
        show_header=True,
    )
    table.add_column("device", justify="right")
    table.add_column("layers per chunk", overflow="fold")
    table.add_column("ms / micro-batch", justify="right")
    table.add_column("host wait ms", justify="right")
    table.add_column("memory GiB", justify="right")
    for stage in stages:
        extras = ("E " if stage["holds_embedding"] else "") + ("H" if stage["holds_head"] else "")
        time_ms = stage["time_per_microbatch_s"] * 1e3
        table.add_row(
            str(stage["device"]),
            " ".join(map(str, stage["layers_per_chunk"])) + (f"  +{extras.strip()}" if extras else ""),
            f"{time_ms:.2f}" + (" *" if stage["time_per_microbatch_s"] == slowest else ""),
            f"{stage['host_wait_per_microbatch_s'] * 1e3:.2f}",
            "-" if stage["memory_gib"] is None else f"{stage['memory_gib']:.1f}",
        )
    Console(file=sys.stdout).print(table)
    print("  * the slowest device sets the pipeline's pace; E / H: holds the embedding / the output head")


def print_layers(layers, spec) -> None:
    """One table per layer kind: each priced op of one micro-batch on one device."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout)
    counts = _kind_counts(spec)

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.3f}" if seconds else "-"

    for kind, cost in layers.items():
        table = Table(
            title=f"layer {kind} (x{counts.get(kind, 0)} in the model): one micro-batch on one device", show_header=True
        )
        table.add_column("op", no_wrap=True, min_width=26)
        table.add_column("kind", no_wrap=True)
        for column in ("fwd ms", "bwd ms", "redo ms", "TFLOP/s"):
            table.add_column(column, justify="right", no_wrap=True)
        for op in cost.ops:
            rate = op.to_dict()["tflops"]
            table.add_row(
                op.name,
                op.category,
                ms(op.forward_s),
                ms(op.backward_s),
                ms(op.recompute_s),
                f"{rate:.0f}" if rate else "",
            )
        rate = cost.flops / cost.compute_s / 1e12 if cost.compute_s else 0.0
        table.add_row(
            "total",
            "",
            ms(cost.device_forward_s),
            ms(cost.backward_s + cost.comm_backward_s),
            ms(cost.recompute_s),
            f"{rate:.0f}" if rate else "",
            style="bold",
        )
        console.print(table)
        console.print(
            f"  exposed communication {ms(cost.comm_s)} ms of {ms(cost.comm_total_s)} ms; host issues it in "
            f"{ms(cost.host_forward_s)} + {ms(cost.host_backward_s)} ms"
            + ("; its forward waits for the device once" if cost.syncs_host else "")
        )


def print_estimate(estimate, spec, trace_path: str | None = None) -> None:
    """The step estimate as a table, with its infeasibilities and notes."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout)
    data = estimate.to_dict()
    console.print(f"[bold]{spec.describe()}[/bold]")
    console.print(
        f"{estimate.cluster}: {estimate.devices} x {estimate.device}   plan {estimate.plan.label()}   "
        f"seq {estimate.plan.seq}, gbs {estimate.plan.gbs}, mbs {estimate.plan.mbs}, {estimate.plan.precision}, "
        f"recompute {estimate.plan.recompute}, {estimate.plan.microbatches} micro-batches"
    )
    table = Table(title="step estimate", show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("step time", f"{estimate.step_time_s:.3f} s"),
        ("tokens/s per device", f"{estimate.tokens_per_s_per_device:,.0f}"),
        ("model TFLOP/s per device", f"{estimate.model_tflops_per_device:.1f}"),
        ("MFU (Megatron per-GEMM)", f"{estimate.mfu:.1%}"),
        ("MFU (6N + attention)", f"{estimate.mfu_6n:.1%}"),
        ("HFU (executed FLOPs)", f"{estimate.hfu:.1%}"),
        (
            "FLOPs per token",
            f"{estimate.flops_per_token / 1e9:.1f} GFLOP (6N: {estimate.flops_per_token_6n / 1e9:.1f})",
        ),
    ]
    for key, value in data["breakdown"].items():
        rows.append((f"  {key.replace('_', ' ')}", f"{value:.3f} s"))
    for key, value in data["memory_gib"].items():
        rows.append((f"  memory {key.replace('_', ' ')}", f"{value:.1f} GiB"))
    for quantity, value in rows:
        table.add_row(quantity, value)
    console.print(table)
    for problem in estimate.memory_violations():
        console.print(f"[red]infeasible:[/red] {problem}")
    for note in estimate.notes:
        console.print(f"note: {note}")
    if trace_path:
        console.print(f"trace written to {trace_path} (open it in https://ui.perfetto.dev)")
