"""`trex serve profile | worker | route`: the subcommands that run real processes (heavy imports inside)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from trex.errors import TrexError


def _add_worker_model(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tiny model (random init, built locally)")
    group.add_argument("--layers", type=int, default=2)
    group.add_argument("--hidden", type=int, default=128)
    group.add_argument("--heads", type=int, default=4)
    group.add_argument("--vocab", type=int, default=512)
    group.add_argument("--threads", type=int, help="intra-op CPU threads (default: torch's)")
    group.add_argument("--model-seed", type=int, default=0)


def add_live_commands(commands: argparse._SubParsersAction) -> None:
    profile = commands.add_parser(
        "profile", help="measure a local CPU instance's step latencies and fit them (held-out check)"
    )
    _add_worker_model(profile)
    profile.add_argument("--fast", action="store_true", help="a small grid (seconds; for tests)")
    profile.add_argument(
        "--max-num-seqs", type=int, default=16, help="the worker's batch limit (as `trex serve worker`; default 16)"
    )
    profile.add_argument(
        "--clock",
        default="auto",
        choices=("auto", "wall", "cpu"),
        help="wall clock, or the thread's CPU time (immune to a shared machine's load; needs --threads 1); "
        "auto: cpu with --threads 1",
    )
    profile.add_argument(
        "--out", metavar="JSON", help="write samples + fitted model (usable as a router worker profile)"
    )
    profile.add_argument("--json", action="store_true", help="print the result as JSON")
    profile.set_defaults(run=run_profile)

    worker = commands.add_parser(
        "worker", help="an OpenAI-compatible CPU worker serving a tiny random-init model (loopback)"
    )
    _add_worker_model(worker)
    worker.add_argument(
        "--max-num-seqs",
        type=int,
        default=16,
        help="sequences decoding together (continuous batching; 1: one at a time)",
    )
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument(
        "--warm-up-context",
        type=int,
        default=128,
        metavar="N",
        help="before serving, run a full batch of sequences up to N tokens once, so the engine's memory is grown "
        "and later steps reuse it (0: none; default 128)",
    )
    worker.add_argument(
        "--serve-for", type=float, metavar="S", help="exit after S seconds (default: until interrupted)"
    )
    worker.set_defaults(run=run_worker)

    route = commands.add_parser("route", help="the OpenAI-compatible router in front of workers, with a scheduler")
    route.add_argument(
        "--workers", required=True, metavar="URLS", help="comma-separated http://HOST:PORT[@profile.json]"
    )
    route.add_argument(
        "--scheduler", default="trex", help="round_robin, random, jsq, token_jsq, po2, weighted_rr, trex"
    )
    route.add_argument("--host", default="127.0.0.1")
    route.add_argument("--port", type=int, default=8100)
    route.add_argument(
        "--request-timeout", type=float, default=60.0, help="seconds a worker may stay silent before it counts as hung"
    )
    route.add_argument("--retries", type=int, default=2, help="other workers to try after a failure (default 2)")
    route.add_argument("--max-in-flight", type=int, default=256, help="requests in flight before 429 (default 256)")
    route.add_argument("--health-interval", type=float, default=2.0, help="seconds between health checks (0: none)")
    route.add_argument("--seed", type=int, default=0)
    route.add_argument("--serve-for", type=float, metavar="S", help="exit after S seconds (default: until interrupted)")
    route.set_defaults(run=run_route)


def _config(args: argparse.Namespace):
    from trex.workloads.serving.worker import WorkerModelConfig

    for name in ("layers", "hidden", "heads", "vocab"):
        if getattr(args, name) < 1:
            raise TrexError(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if args.threads is not None and args.threads < 1:
        raise TrexError(f"--threads must be at least 1 (got {args.threads})")
    return WorkerModelConfig(args.layers, args.hidden, args.heads, args.vocab, args.model_seed)


def run_profile(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from trex.workloads.serving.latency_fit import save_samples
    from trex.workloads.serving.profiling import FAST_GRID, ProfileGrid, profile_instance

    result = profile_instance(
        _config(args),
        args.threads,
        FAST_GRID if args.fast else ProfileGrid(),
        clock=args.clock,
        max_num_seqs=args.max_num_seqs,
    )
    check = result.check
    summary = {
        "model": result.config.describe(),
        "threads": result.threads,
        "clock": result.clock,
        "latency_model": result.model.to_dict(),
        "limits": vars(result.limits),
        "fit_samples": len(result.fit_samples),
        "held_out_samples": check.samples,
        "held_out_mean_error": check.mean_error,
        "held_out_max_error": check.max_error,
        "held_out": [
            {**asdict(s), "predicted": result.model.predict(s), "error": result.model.predict(s) / s.seconds - 1}
            for s in result.held_out
        ],
    }
    if args.out:
        save_samples(
            result.samples, result.model, args.out, extra={k: v for k, v in summary.items() if k != "latency_model"}
        )
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    a0, a1, a2 = result.model.prefill
    b0, b1, b2 = result.model.decode
    print(f"{result.config.describe()}, threads {result.threads or 'default'}, {result.clock} clock")
    print(f"prefill = {a0 * 1e3:.3f} ms + {a1 * 1e6:.3f} us/token + {a2 * 1e9:.4f} ns/token^2")
    print(
        f"decode  = {b0 * 1e3:.3f} ms + {b1 * 1e6:.3f} us/sequence + {b2 * 1e9:.4f} ns/context token "
        f"+ {result.model.decode_multi * 1e3:.3f} ms with 2+ sequences"
    )
    r0, r1 = result.model.repack
    print(f"repack  = {r0 * 1e3:.3f} ms + {r1 * 1e6:.3f} us/context token (when sequences join or leave)")
    print(check.describe())
    for s in result.held_out:
        predicted = result.model.predict(s)
        print(
            f"  {s.kind:7s} batch {s.seqs:2d} tokens {s.tokens:5d} context {s.context:5d}: "
            f"measured {s.seconds * 1e3:.2f} ms, "
            f"fit {predicted * 1e3:.2f} ms ({(predicted - s.seconds) / s.seconds:+.1%})"
        )
    if args.out:
        print(f"wrote {args.out}")
    return 0


def run_worker(args: argparse.Namespace) -> int:
    from trex.workloads.serving.worker import TinyEngine, Worker

    config = _config(args)
    if args.max_num_seqs < 1:
        raise TrexError(f"--max-num-seqs must be at least 1 (got {args.max_num_seqs})")
    if args.warm_up_context < 0:
        raise TrexError(f"--warm-up-context must be >= 0 tokens (got {args.warm_up_context})")
    worker = Worker(
        TinyEngine(config, args.threads),
        name=f"tiny-l{config.layers}-h{config.hidden}",
        max_num_seqs=args.max_num_seqs,
        warm_up_context=args.warm_up_context,
    )

    async def main() -> None:
        server = await worker.start(args.host, args.port)
        print(f"worker {worker.name} ({config.describe()}) on http://{args.host}:{args.port}", flush=True)
        async with server:
            if args.serve_for:
                await asyncio.sleep(args.serve_for)
            else:
                await server.serve_forever()

    try:
        asyncio.run(main())
    finally:
        worker.close()
    return 0


def parse_workers(text: str):
    """`URL[@profile.json],...` -> [(Endpoint, profile path or None)]."""
    from trex.workloads.serving.http import Endpoint

    workers = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        url, _, profile = item.partition("@")
        workers.append((Endpoint.parse(url), Path(profile) if profile else None))
    if not workers:
        raise TrexError("--workers needs at least one http://HOST:PORT")
    return workers


async def build_router(workers, scheduler_name: str, seed: int = 0, **options):
    """A Router whose workers' latency models come from their profile files or from probing them."""
    from trex.workloads.serving.latency_fit import load_engine_limits, load_latency_model
    from trex.workloads.serving.router import Router, probe_worker, worker_spec
    from trex.workloads.serving.schedulers import make_scheduler

    scheduler = make_scheduler(scheduler_name, seed)
    resolved = []
    for endpoint, profile in workers:
        latency = (
            load_latency_model(profile)
            if profile
            else await probe_worker(endpoint, timeout=options.get("request_timeout", 60.0))
        )
        limits = load_engine_limits(profile) if profile else None
        resolved.append((endpoint, worker_spec(endpoint.url, latency, limits)))
    return Router(resolved, scheduler, **options)


def run_route(args: argparse.Namespace) -> int:
    workers = parse_workers(args.workers)

    async def main() -> None:
        router = await build_router(
            workers,
            args.scheduler,
            args.seed,
            request_timeout=args.request_timeout,
            retries=args.retries,
            max_in_flight=args.max_in_flight,
            health_interval=args.health_interval,
        )
        await router.start(args.host, args.port)
        print(
            f"router ({args.scheduler}) on http://{args.host}:{router.port} -> {', '.join(e.url for e, _ in workers)}",
            flush=True,
        )
        try:
            if args.serve_for:
                await asyncio.sleep(args.serve_for)
            else:
                await asyncio.Event().wait()
        finally:
            await router.close()
            print(json.dumps(router.snapshot()), flush=True)

    asyncio.run(main())
    return 0
