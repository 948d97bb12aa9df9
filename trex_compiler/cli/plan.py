"""`trex plan`: find the fastest parallel plan for a model on a cluster (no hardware needed).

trex plan --model deepseek-v4-pro --cluster cloudmatrix384 --devices 1024 --seq 4096 --gbs 1024
trex plan ... --top 5 --json --out plan.json
trex plan --diff a.json b.json
"""

from __future__ import annotations

import argparse
import json
import sys

from trex.cli.training_options import add_training_arguments, check_sizes


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="search the best parallel plan (degrees, ZeRO, batch split, recompute, stage split) for a model on a cluster",
        description="Search data, tensor, pipeline (virtual stages), expert, expert-tensor and context parallelism, the ZeRO stage, "
        "micro-batch, recompute policy and the pipeline stage split, priced by the analytical cost model; print the best plan, "
        "runners-up with why they lose, and a public baseline recipe priced the same way.",
    )
    add_training_arguments(parser, required=False)  # optional: --diff and --list-baselines need none of them
    parser.add_argument(
        "--top",
        type=int,
        default=3,
        metavar="K",
        help="runners-up to show, each the best of a different layout (default 3)",
    )
    parser.add_argument(
        "--fix",
        default="",
        metavar="DIMS",
        help='narrow (or widen) the search, e.g. "tp=1,ep=32/64,recompute=full"; dimensions: tp pp vpp ep etp cp zero mbs recompute; '
        '"min_expert_rows=2048" keeps only layouts whose experts get at least that many rows per micro-batch',
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a software setting the plans are priced with, e.g. --set dispatcher=deepep --set tp_comm_overlap=true "
        "--set fp8_recipe=tensorwise",
    )
    parser.add_argument(
        "--baseline",
        default="auto",
        help="public recipe to compare with (default: the model's own, else a documented stand-in); 'none' to skip",
    )
    parser.add_argument(
        "--list-baselines", action="store_true", help="list the baseline recipes with their sources and exit"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="search processes (default 1; the result does not depend on it)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="stop searching after this long (the result then says it is not exhaustive)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--out",
        metavar="PLAN.json",
        help="write the best plan (trex-plan/1 JSON, accepted by trex.compile(model, plan=...))",
    )
    parser.add_argument(
        "--diff", nargs=2, metavar=("A.json", "B.json"), help="show what differs between two plan files and exit"
    )
    parser.set_defaults(run=run)


def _software(items: list[str]) -> dict:
    from trex.cli.estimate import parse_sets
    from trex.cost_model.parallel import ParallelConfig

    return parse_sets(items, ParallelConfig(), {"seq": "--seq", "gbs": "--gbs", "precision": "--precision"})


def run(args: argparse.Namespace) -> int:
    from trex.errors import TrexError

    if args.diff:
        return _diff(args)
    if args.list_baselines:
        return _list_baselines(args)
    missing = [f"--{name}" for name in ("model", "cluster", "devices") if getattr(args, name) is None]
    if missing:
        raise TrexError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (or use --diff A.json B.json / --list-baselines)"
        )
    if args.top < 0:
        raise TrexError(f"--top {args.top}: give 0 or more runners-up")
    check_sizes(args)
    if args.out:
        from trex.outputs import output_file

        output_file(args.out, "--out")

    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.parallel import ParallelConfig, settings_without_effect
    from trex.planner import SearchSpace, plan_parallel

    cluster = get_cluster(args.cluster, args.devices, device=args.device)
    space = SearchSpace.parse(args.fix)
    software = _software(args.set)
    # The search chooses the degrees, so only settings the precision makes moot are known to be moot here.
    for note in settings_without_effect(
        ParallelConfig(precision=args.precision, **software), {"fp8_recipe"} & set(software)
    ):
        print(f"trex plan: note: {note}", file=sys.stderr)
    with _progress_bar() as progress:
        result = plan_parallel(
            args.model,
            cluster,
            seq=args.seq,
            gbs=args.gbs,
            precision=args.precision,
            software=software,
            space=space,
            top=args.top,
            baseline=None if args.baseline == "none" else args.baseline,
            progress=progress,
            workers=args.workers,
            time_limit_s=args.time_limit,
        )
    if args.out and result.best is not None:
        result.best.save(args.out)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print(result, args)
    return 0 if result.feasible else 1


class _progress_bar:
    """A progress bar on stderr (nothing when stderr is not a terminal), fed by the search's callback."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=sys.stderr)
        self.bar = Progress(
            TextColumn("planning"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("layer choices"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            auto_refresh=False,
            disable=not console.is_terminal,
        )
        self.bar.start()
        self.task = self.bar.add_task("plan", total=None)
        return self._update

    def _update(self, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done, total=total)
        self.bar.refresh()

    def __exit__(self, *exc) -> None:
        self.bar.stop()


def _diff(args: argparse.Namespace) -> int:
    from trex.plan import Plan

    a, b = (Plan.load(path) for path in args.diff)
    changes = a.diff(b)
    if args.json:
        print(json.dumps([{"field": c.field, "a": c.before, "b": c.after} for c in changes], indent=2, default=str))
    elif not changes:
        print(f"{args.diff[0]} and {args.diff[1]} are the same plan")
    else:
        print(f"--- {args.diff[0]}\n+++ {args.diff[1]}")
        for change in changes:
            print(f"  {change}")
    return 0


def _list_baselines(args: argparse.Namespace) -> int:
    from trex.planner.baselines import recipes

    table = {
        name: {"description": r.description, "source": r.source, "models": list(r.models)}
        for name, r in recipes().items()
    }
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        for name, entry in table.items():
            print(
                f"{name}: {entry['description']}\n    models: {', '.join(entry['models']) or '(any: stand-in)'}\n    source: {entry['source']}"
            )
    return 0


def _print(result, args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=max(120, Console().width))
    spec, cluster, stats = result.spec, result.cluster, result.search.stats
    console.print(f"[bold]{spec.describe()}[/bold]")
    console.print(
        f"{cluster.name}: {cluster.devices} x {cluster.device.name}; seq {args.seq}, global batch {args.gbs}, {args.precision}"
    )
    console.print(
        f"searched {stats.space_size:,} candidate plans ({stats.layer_choices} layer choices, {stats.layer_pricings} layer pricings, "
        f"{stats.splits} stage splits) in {stats.seconds:.2f} s; {stats.candidates_priced} priced in full by the cost model, "
        f"the rest ruled out by bounds or memory{'' if stats.exhaustive else ' (stopped at the time limit)'}"
    )
    if result.best is None:
        console.print("[red bold]no plan fits[/red bold] in the memory of these devices.")
        if result.nearest is not None:
            _print_nearest(console, result.nearest)
    else:
        console.print()
        console.print(str(result.best))
        _memory_table(console, result.best)
    rows = [("best", result.best, None, None)] if result.best else []
    rows += [(f"runner-up {i}", r.plan, r.reason, None) for i, r in enumerate(result.runners_up, 1)]
    rows += [("too big", r.plan, r.reason, r.at_least_s) for r in result.too_big[:1]]
    base = result.baseline
    if base is not None and base.plan is not None:
        rows.append(
            ("baseline", base.plan, None if base.feasible else "does not fit: " + "; ".join(base.violations), None)
        )
    if rows:
        table = Table(title="plans")
        for column in (
            "",
            "tp",
            "pp",
            "vpp",
            "ep",
            "etp",
            "cp",
            "dp",
            "zero",
            "mbs",
            "recompute",
            "step s",
            "MFU",
            "GiB/device",
        ):
            table.add_column(column, justify="left" if column in ("", "recompute") else "right")
        for label, plan, _, at_least in rows:
            p, r = plan.parallel, plan.prediction
            step = f"{r.step_time_s:.3f}" if r else f">={at_least:.2f}"
            table.add_row(
                label,
                *(str(getattr(p, n)) for n in ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero", "mbs")),
                p.recompute,
                step,
                f"{r.mfu:.1%}" if r else "-",
                f"{r.memory_per_device_gib:.1f}" if r else "-",
            )
        console.print(table)
        for label, _, reason, _ in rows:
            if reason:
                console.print(f"  {label}: {reason}")
    if base is not None:
        console.print(f"baseline [bold]{base.recipe.name}[/bold]: {base.recipe.description}")
        console.print(f"  source: {base.recipe.source}")
        for line in base.adjusted:
            console.print(f"  adjusted for this model: {line}")
        for line in base.skipped:
            console.print(f"  passed over: {line}")
        for line in base.recipe.not_modelled:
            console.print(f"  not modelled: {line}")
        for line in base.software_differences:
            console.print(f"  software: {line}")
        if base.plan is None:
            console.print(f"  [red]not a valid plan for this run:[/red] {'; '.join(base.violations)}")
        if result.speedup is not None:
            console.print(
                f"  best plan: {result.speedup:.2f}x the baseline's throughput "
                f"({base.plan.prediction.step_time_s:.3f} -> {result.best.prediction.step_time_s:.3f} s/step, "
                f"MFU {base.plan.prediction.mfu:.1%} -> {result.best.prediction.mfu:.1%})"
            )
            from trex.cost_model.caveats import SMALL_EXPERT_ROWS, in_small_expert_regime

            if in_small_expert_regime(spec, result.best.parallel) and not in_small_expert_regime(
                spec, base.plan.parallel
            ):
                console.print(
                    "  [yellow]caution:[/yellow] the best plan's experts get few rows per micro-batch, a regime priced ~2x "
                    "optimistically against published runs (its note); the baseline is outside it, so this gain is overstated; "
                    f"--fix min_expert_rows={SMALL_EXPERT_ROWS} plans outside that regime"
                )
    if args.out and result.best is not None:
        console.print(
            f"plan written to {args.out} (use it with trex.compile(model, plan=...); compare plans with trex plan --diff)"
        )


def _memory_table(console, plan) -> None:
    from rich.table import Table

    r = plan.prediction
    table = Table(title="memory per device (fullest device) and step time", show_header=True)
    table.add_column("memory")
    table.add_column("GiB", justify="right")
    table.add_column("step time")
    table.add_column("s", justify="right")
    memory = [(k.replace("_", " "), v) for k, v in r.memory_gib.items()]
    times = [(k.replace("_", " "), v) for k, v in r.breakdown.items()]
    for i in range(max(len(memory), len(times))):
        m = memory[i] if i < len(memory) else ("", None)
        t = times[i] if i < len(times) else ("", None)
        table.add_row(m[0], f"{m[1]:.1f}" if m[1] is not None else "", t[0], f"{t[1]:.3f}" if t[1] is not None else "")
    console.print(table)


def _print_nearest(console, plan) -> None:
    from rich.table import Table

    r = plan.prediction
    memory = r.memory_gib
    missing = max(0.0, memory["total"] - memory["capacity"])
    console.print(f"closest plan ({missing:.1f} GiB per device short):")
    console.print(str(plan))
    table = Table(title="memory of the fullest device vs what it has")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    for key in ("weights", "gradients", "optimizer_states", "activations", "transient"):
        table.add_row(key.replace("_", " "), f"{memory[key]:.1f}")
    table.add_row("total needed", f"{memory['total']:.1f}")
    table.add_row("usable on the device", f"{memory['capacity']:.1f}")
    table.add_row("[red]missing[/red]", f"{missing:.1f}")
    console.print(table)
    console.print(
        "more devices, a longer pipeline or more expert parallelism shrink weights and optimizer state; full recompute and a "
        "smaller micro-batch shrink activations (the plan above already uses the smallest the search found)."
    )
