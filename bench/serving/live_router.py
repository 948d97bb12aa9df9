"""Live: three CPU workers of unequal capacity behind `trex serve route`, trex's scheduler against the
baselines, and the simulator's prediction of the same setup.

Workers are `trex serve worker` processes (tiny random-init Llama models of different sizes, one
thread each, continuous batching of up to `--max-num-seqs` sequences). Before they start, each
worker's model is profiled exactly as `trex serve profile` does (the worker's own prefill and
decode steps, wall clock, median of interleaved runs) and fitted by least squares; the router's
schedulers and the simulator both get those latency models and the workers' engine limits (batch
limit, one prompt per prefill step). Each scheduler then serves the same seeded requests (Poisson
arrivals at `--load` of the workers' summed capacity, streamed), measured end to end by an asyncio
client: throughput (output tokens / duration), P99 latency and TTFT. The simulator replays the same
requests on those instances with the same scheduler, the three workers sharing this machine's
cores (`Simulation(shared_cores=)`); its throughput and P99 latency are compared with the
measurement.

    python bench/serving/live_router.py                    # 200 requests per scheduler
    python bench/serving/live_router.py --requests 40      # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.http import Endpoint, open_request, request_json
from trex.workloads.serving.profiling import ProfileGrid, profile_instance
from trex.workloads.serving.router import Router, worker_spec
from trex.workloads.serving.schedulers import capacity_requests_s, make_scheduler
from trex.workloads.serving.simulator import simulate
from trex.workloads.serving.worker import WorkerModelConfig
from trex.workloads.serving.workload import Request, workload_stats

WORKERS = ((6, 384, 8), (8, 512, 8), (8, 768, 8))  # (layers, hidden, heads): unequal capacity
SCHEDULERS = ("round_robin", "trex", "jsq", "po2")
# the requests' range: prompts 8-63 words, 8-39 output tokens, so contexts up to ~100 per sequence
BENCH_GRID = ProfileGrid(
    prompt_lengths=(8, 24, 48, 64),
    held_out_prompts=(),
    decode_contexts=(16, 64),
    decode_batches=(1, 2, 4, 8, 16),
    fit_batches=(1, 2, 4, 8, 16),
    repeats=5,
    warmup=1,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(max_num_seqs: int) -> tuple[list[subprocess.Popen], list[Endpoint]]:
    processes, endpoints = [], []
    for layers, hidden, heads in WORKERS:
        port = free_port()
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trex.cli",
                    "serve",
                    "worker",
                    "--port",
                    str(port),
                    "--layers",
                    str(layers),
                    "--hidden",
                    str(hidden),
                    "--heads",
                    str(heads),
                    "--threads",
                    "1",
                    "--max-num-seqs",
                    str(max_num_seqs),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        endpoints.append(Endpoint("127.0.0.1", port))
    return processes, endpoints


async def wait_ready(endpoints: list[Endpoint], deadline_s: float = 600.0) -> None:
    start = time.time()
    for endpoint in endpoints:
        while True:
            try:
                status, _ = await request_json(endpoint, "GET", "/health", timeout=2.0)
                if status == 200:
                    break
            except (TimeoutError, OSError, Exception):
                pass
            if time.time() - start > deadline_s:
                raise RuntimeError(f"worker {endpoint.url} did not come up within {deadline_s:.0f} s")
            await asyncio.sleep(0.5)


def make_requests(n: int, rate: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    prompts = rng.integers(8, 64, n)
    outputs = rng.integers(8, 40, n)
    return [Request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(n)]


async def drive(router: Router, requests: list[Request], timeout: float) -> dict:
    """Send the requests at their arrival times (streamed); measure latency, TTFT and throughput."""
    endpoint = Endpoint("127.0.0.1", router.port)
    start = time.perf_counter()
    latencies, ttfts, tokens, failures = [], [], 0, 0

    async def one(request: Request) -> None:
        nonlocal tokens, failures
        await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
        sent = time.perf_counter()
        payload = {
            "prompt": " ".join(f"w{i}" for i in range(request.prompt_tokens)),
            "max_tokens": request.output_tokens,
            "stream": True,
        }
        try:
            response = await open_request(endpoint, "POST", "/v1/completions", payload, timeout)
            first, count = None, 0
            async for line in response.lines(timeout):
                text = line.decode().strip()
                if (
                    text.startswith("data:")
                    and text != "data: [DONE]"
                    and json.loads(text[5:])["choices"][0].get("text")
                ):
                    count += 1
                    first = first or time.perf_counter()
            response.close()
        except (TimeoutError, OSError):
            failures += 1
            return
        if count != request.output_tokens:
            failures += 1
            return
        tokens += count
        ttfts.append(first - sent)
        latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(one(r) for r in requests))
    duration = time.perf_counter() - start
    return {
        "duration_s": duration,
        "throughput_tok_s": tokens / duration,
        "completed": len(latencies),
        "failed": failures,
        "latency_p50_s": float(np.percentile(latencies, 50)),
        "latency_p99_s": float(np.percentile(latencies, 99)),
        "ttft_p99_s": float(np.percentile(ttfts, 99)),
    }


def profile_workers(max_num_seqs: int) -> list:
    """`trex serve profile` of each worker's model and engine (wall clock: what the live run sees)."""
    profiles = []
    for layers, hidden, heads in WORKERS:
        start = time.perf_counter()
        result = profile_instance(
            WorkerModelConfig(layers, hidden, heads), 1, BENCH_GRID, clock="wall", max_num_seqs=max_num_seqs
        )
        print(
            f"profiled {layers}x{hidden} in {time.perf_counter() - start:.0f} s: prefill {result.model.prefill}, "
            f"decode {result.model.decode}",
            flush=True,
        )
        profiles.append(result)
    return profiles


async def run(args) -> dict:
    profiles = profile_workers(args.max_num_seqs)
    processes, endpoints = start_workers(args.max_num_seqs)
    try:
        await wait_ready(endpoints)
        specs = [worker_spec(e.url, p.model, p.limits) for e, p in zip(endpoints, profiles)]
        probe_requests = make_requests(args.requests, 1.0, args.seed)
        stats = workload_stats(probe_requests)
        capacity = sum(
            capacity_requests_s(s, stats.mean_prompt, stats.mean_output, stats.context_in_flight) for s in specs
        )
        rate = args.load * capacity
        requests = make_requests(args.requests, rate, args.seed)
        results = {
            "workers": [
                {
                    "url": s.name,
                    "layers": w[0],
                    "hidden": w[1],
                    "heads": w[2],
                    "limits": vars(s.limits),
                    "latency_model": s.latency.to_dict(),
                    "capacity_req_s": capacity_requests_s(
                        s, stats.mean_prompt, stats.mean_output, stats.context_in_flight
                    ),
                }
                for s, w in zip(specs, WORKERS)
            ],
            "rate_req_s": rate,
            "requests": args.requests,
            "runs": {},
        }
        print(
            f"workers' profiled capacity {capacity:.2f} req/s in all; offered {rate:.2f} req/s ({args.load:.0%})",
            flush=True,
        )
        for scheduler in args.schedulers:
            router = Router(
                [(e, s) for e, s in zip(endpoints, specs)],
                make_scheduler(scheduler, args.seed, stats),
                health_interval=0,
                request_timeout=args.timeout,
                max_in_flight=10_000,
            )
            await router.start()
            try:
                measured = await drive(router, requests, args.timeout)
            finally:
                await router.close()
            predicted = simulate(
                specs,
                make_scheduler(scheduler, args.seed, stats),
                requests,
                SLO(10.0, 1.0),
                shared_cores=args.cores,
            ).report
            run_result = {
                "measured": measured,
                "router": router.snapshot(),
                "predicted": {
                    "throughput_tok_s": predicted.throughput_tok_s,
                    "latency_p99_s": predicted.latency_p99_s,
                    "ttft_p99_s": predicted.ttft_p99_s,
                    "duration_s": predicted.duration_s,
                },
            }
            results["runs"][scheduler] = run_result
            error = predicted.throughput_tok_s / measured["throughput_tok_s"] - 1
            print(
                f"  {scheduler:12s} measured {measured['throughput_tok_s']:7.1f} tok/s, "
                f"P99 {measured['latency_p99_s']:6.2f} s, TTFT P99 {measured['ttft_p99_s']:5.2f} s "
                f"({measured['completed']} ok, {measured['failed']} failed) | simulator "
                f"{predicted.throughput_tok_s:7.1f} tok/s ({error:+.1%}), P99 {predicted.latency_p99_s:6.2f} s",
                flush=True,
            )
        return results
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--load", type=float, default=0.7, help="offered load as a fraction of the workers' summed capacity"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--max-num-seqs", type=int, default=16, help="each worker's batch limit")
    parser.add_argument(
        "--cores", type=int, default=os.cpu_count(), help="cores the workers share, for the simulator (default: all)"
    )
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated bench still stops its workers
    results = asyncio.run(run(args))
    runs = results["runs"]
    if "round_robin" in runs and "trex" in runs:
        rr, tx = runs["round_robin"]["measured"], runs["trex"]["measured"]
        print(
            f"trex / round robin: throughput {tx['throughput_tok_s'] / rr['throughput_tok_s']:.2f}x, "
            f"P99 latency {tx['latency_p99_s'] / rr['latency_p99_s']:.2f}x"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "live_router.json").write_text(json.dumps(results, indent=2) + "\n")
    errors = [abs(r["predicted"]["throughput_tok_s"] / r["measured"]["throughput_tok_s"] - 1) for r in runs.values()]
    print(f"simulator vs measurement, throughput error: median {statistics.median(errors):.1%}, max {max(errors):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
