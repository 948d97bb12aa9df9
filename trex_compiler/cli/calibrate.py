"""`trex calibrate`: measure this CPU (matmul, memory bandwidth, element-wise, per-op overhead,
attention, gloo collectives between 2 processes) and save the `cpu` device profile + cluster tier."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine and save the cpu device profile that `cpu` targets use",
        description="Run microbenchmarks on this machine and write the cpu profile (TOML, or JSON by suffix). "
        "Afterwards --cluster cpu, target='cpu' and trex.explain(..., target='cpu') use the measurements.",
    )
    parser.add_argument(
        "--out", help="where to write the profile (default: $TREX_CACHE_DIR/cpu.toml or ~/.cache/trex/cpu.toml)"
    )
    parser.add_argument(
        "--fast", action="store_true", help="small sizes and few repetitions (a few seconds; for tests)"
    )
    parser.add_argument(
        "--no-collectives", action="store_true", help="skip the gloo collective benchmarks (no subprocesses)"
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=2,
        help="local processes to time the gloo collectives with (groups of 2 and of this many): as many as the "
        "`trex train --nproc` runs to be predicted start (default 2)",
    )
    parser.add_argument(
        "--threads", type=int, help="intra-op threads to measure with (default: torch's current setting)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from trex.cost_model.calibrate import calibrate, save_calibration
    from trex.errors import TrexError

    if args.threads is not None and args.threads < 1:
        raise TrexError(f"--threads must be at least 1 (got {args.threads})")
    if args.ranks < 2:
        raise TrexError(f"--ranks must be at least 2 (got {args.ranks}): a collective needs two processes")
    from trex.cost_model.devices import calibrated_cpu_path
    from trex.outputs import output_file

    output_file(args.out or calibrated_cpu_path(), "--out" if args.out else "the calibration cache ($TREX_CACHE_DIR)")
    console = Console(file=sys.stdout)
    console.print("measuring this machine" + (" (fast mode)" if args.fast else "") + " ...")
    result = calibrate(fast=args.fast, collectives=not args.no_collectives, threads=args.threads, ranks=args.ranks)
    path = save_calibration(result, args.out)
    profile, tier = result.profile, result.tier
    table = Table(title=f"calibrated cpu profile ({result.seconds:.1f} s)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for dtype, tflops in sorted(profile.peak_tflops.items()):
        table.add_row(f"matmul peak {dtype}", f"{tflops * 1e3:.1f} GFLOP/s")
    table.add_row("GEMM pipeline fill (k_fill)", f"{profile.gemm.k_fill:g}")
    table.add_row("memory bandwidth (copy)", f"{profile.hbm_bandwidth_gbs:.1f} GB/s")
    table.add_row("element-wise fraction of it", f"{profile.memory_efficiency:.2f}")
    table.add_row(f"cache ({profile.cache_mib:g} MiB) bandwidth", f"{profile.cache_bandwidth_gbs:.1f} GB/s")
    table.add_row("element-wise arithmetic", f"{profile.vector_flops() / 1e9:.1f} GFLOP/s")
    for kind, micros in sorted(profile.op_overhead_us.items()):
        table.add_row(f"per-call overhead {kind}", f"{micros:.2f} us")
    table.add_row(
        "attention efficiency fwd / bwd",
        f"{profile.attention.forward_efficiency:.3f} / {profile.attention.backward_efficiency:.3f}",
    )
    if result.collectives:
        table.add_row("gloo latency", f"{tier.latency_us:.1f} us")
        table.add_row("gloo bandwidth", f"{tier.bandwidth_gbs:.2f} GB/s")
        for m in tier.collectives:
            table.add_row(
                f"gloo {m.kind} over {m.group}", f"{m.latency_us:.1f} us + bytes / {m.bandwidth_gbs:.2f} GB/s"
            )
    if "error" in result.eager:
        table.add_row("eager issue costs", f"not measured: {result.eager['error']}")
    elif result.eager:
        table.add_row("eager op issue (beyond its kernel)", f"{profile.eager_op_us:.2f} us")
        table.add_row("DTensor op, extra", f"{profile.dtensor_op_us:.1f} us")
        table.add_row("FSDP2 unit, forward+backward hooks", f"{profile.fsdp_unit_us:.1f} us")
    console.print(table)
    console.print(f"saved to {path}")
    return 0
