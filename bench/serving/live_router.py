"""Live: three CPU workers of unequal capacity behind `trex serve route`, trex's scheduler against round
robin, and the simulator's prediction of the same setup made before each run.

Workers are `trex serve worker` processes (tiny random-init Llama models of different sizes, one
thread each, continuous batching of up to `--max-num-seqs` sequences), all on this machine's cores.
What the simulator is given, all measured in this invocation, before the run it predicts:

1. each worker's step costs: its model profiled through the worker's own engine exactly as `trex
   serve profile` does, timed by the thread's CPU time (what a step costs, however loaded the machine)
   and fitted by least squares;
2. the CPU each worker spends per streamed token outside its steps (HTTP, JSON, the hand-off from
   the engine thread), from the workers' own CPU accounting (`/health`) over a few calibration
   requests through the router; it is charged to the step that emits the token. The router's and the
   client's CPU per token is measured too and reported (it is ~1% of a core at these rates);
3. the host's CPU shares, immediately before each scheduler's run: `cpu_share.measure_cpu_shares`
   spins 1, 2 and 3 probe processes (at the workers' nice level) and times the CPU each gets per
   second - the share of a core each busy worker gets while k are busy, other processes included.
   The simulator stretches each step by 1 / share(k busy).

4. each worker's step CPU beside 0, 1, 2 other busy workers over what its profile predicts for the same steps
   (`step_timeline.cpu_factors`, from the workers' own step timelines during a few calibration bursts):
   co-running workers share the cache, the memory bandwidth and the cores' clock, so a step's CPU time
   depends on how many run at once; the simulator scales each step's CPU by its worker's factor.

5. a rehearsal right before each scheduler's run (`--rehearsal`, 100 requests of another seed at the run's rate
   through a router with the same scheduler): each worker's step CPU over its profile's by the step's shape
   (prefill; decode by batch-size band, plain or after a re-pack: `step_timeline.shape_factors`), and the CPU
   share the workers got over the share the simulation of the rehearsal implies from the probes (which scales
   the probed shares). On this host - a 2-vCPU virtual machine shared with other agents - a step's thread CPU
   time is not a constant of its shape: the same profile's prefill intercept measured 44, 59 and 86 ms within
   hours, and large batches drift more than small ones; the rehearsal measures it in the state the run meets,
   seconds before it. Item 4 (`--calibration-burst`, by the number of busy workers) is then off by default.

6. (`--step-cpu pooled`, the default) every step the workers ran before the prediction - the overhead calibration,
   the rehearsals and the runs before, the rehearsal just done included, all weighted alike - priced against the
   profiles (`step_timeline.estimate_step_cpu`): a factor per worker by the step's shape, times a factor by how many
   workers were busy shared by all (time slices on shared cores cost cache refills), and the share of a core a step
   gets with k workers busy, fitted on the workers' own steps (which, unlike the probes, sees the HTTP threads, the
   router and the client). The simulator runs each step at the share of the busy count *during* the step
   (`Simulation(processor_sharing=True)`), and trex's scheduler - in the router and in the simulation alike - sees
   each worker's profile scaled by its steps' CPU in service so far (`LatencyModel.scaled`). The fifth session's
   prediction (the rehearsal's factors and the probed shares alone) is printed beside it as a diagnostic.

The offered rate is `--load` x the workers' summed capacity with all three busy at the measured
share; or (`--slowest-utilisation U`) the rate at which round robin drives the slowest worker at U of its
capacity; or (`--burst`) every request at once, the offline-throughput benchmark. Why the operating point matters
for the prediction: under Poisson arrivals a worker's latency is about L b0 / (1 - rho) (the batch grows until the
step keeps up), so an error e in the forecast of its speed becomes ~e / (1 - rho) in its latencies - and round robin's
throughput falls behind trex's only where its slowest worker nears rho = 1. In a burst there is no arrival process:
a request's latency is the time its worker takes to drain the work ahead of it, linear in the speed, for any
scheduler, while round robin's makespan is still set by its slowest worker. Each scheduler serves the same seeded requests (Poisson, streamed), measured end to end by an
asyncio client: throughput (output tokens / duration), P50 / P99 latency, TTFT. After each run the
workers' step CPU over step wall time gives the share the run actually got; the simulation replayed
at that share is printed as a diagnostic (not a prediction): it separates a wrong model of the
workers from a host whose load changed during the run.

    nice -n 10 python bench/serving/live_router.py --requests 200 --load 0.4 --schedulers round_robin trex
    python bench/serving/live_router.py --requests 200 --burst --schedulers round_robin trex
    python bench/serving/live_router.py --requests 40 --schedulers round_robin trex     # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import gzip
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
from trex.workloads.serving.cpu_share import CpuShares, measure_cpu_shares
from trex.workloads.serving.http import Endpoint, open_request, request_json
from trex.workloads.serving.profiling import ProfileGrid, profile_instance
from trex.workloads.serving.router import Router, worker_spec
from trex.workloads.serving.schedulers import capacity_requests_s, make_scheduler, rate_at_round_robin_utilisation
from trex.workloads.serving.simulator import simulate
from trex.workloads.serving.step_timeline import (
    StepCpuEstimate,
    TimedStep,
    busy_counts,
    cpu_factors,
    estimate_step_cpu,
    shape_factors,
)
from trex.workloads.serving.worker import WorkerModelConfig
from trex.workloads.serving.workload import Request, workload_stats

WORKERS = ((6, 384, 8), (8, 512, 8), (8, 768, 8))  # (layers, hidden, heads): unequal capacity
SCHEDULERS = ("round_robin", "trex", "jsq", "po2")
SAMPLE_EVERY_S = 5.0  # how often the workers' CPU accounting is read during a run (the share over time)
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
    client: dict[str, tuple[float, float, float]] = {}  # tag -> (sent, first token, done) on this host's clock

    async def one(request: Request) -> None:
        nonlocal tokens, failures
        await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
        sent = time.perf_counter()
        payload = {
            "prompt": " ".join(f"w{i}" for i in range(request.prompt_tokens)),
            "max_tokens": request.output_tokens,
            "stream": True,
            "user": f"r{request.id}",  # the worker's timeline names the request by it
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
        done = time.perf_counter()
        ttfts.append(first - sent)
        latencies.append(done - sent)
        client[f"r{request.id}"] = (sent, first, done)

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
        "start_s": start,
        "client_timeline": client,
    }


def share_over_time(timeline: list[tuple[float, float, float]], mean_share: float):
    """The share the workers got in each sampling interval (engine CPU / engine busy time) over the share the
    simulation assumed on average: a multiplier on the probed shares as a function of time into the run.
    Intervals with under 0.2 s of busy time keep the previous interval's value."""
    edges, factors, factor = [], [], 1.0
    for (_, cpu0, busy0), (t1, cpu1, busy1) in zip(timeline, timeline[1:]):
        if busy1 - busy0 > 0.2:
            factor = (cpu1 - cpu0) / (busy1 - busy0) / mean_share
        edges.append(t1)
        factors.append(factor)

    def at(now: float) -> float:
        index = bisect.bisect_left(edges, now)
        return factors[min(index, len(factors) - 1)] if factors else 1.0

    return at


def profile_workers(max_num_seqs: int) -> list:
    """`trex serve profile` of each worker's model and engine, timed by the thread's CPU time: what a step
    costs, whatever else runs on the machine (the contention is priced separately, by `CpuShares`)."""
    profiles = []
    for layers, hidden, heads in WORKERS:
        start = time.perf_counter()
        result = profile_instance(
            WorkerModelConfig(layers, hidden, heads), 1, BENCH_GRID, clock="cpu", max_num_seqs=max_num_seqs
        )
        print(
            f"profiled {layers}x{hidden} in {time.perf_counter() - start:.0f} s: prefill {result.model.prefill}, "
            f"decode {result.model.decode}, multi {result.model.decode_multi:.2e}",
            flush=True,
        )
        profiles.append(result)
    return profiles


async def worker_counters(endpoints: list[Endpoint]) -> list[dict]:
    """Each worker's CPU accounting (`/health`): engine CPU and busy time, process CPU, tokens sent."""
    counters = []
    for endpoint in endpoints:
        status, body = await request_json(endpoint, "GET", "/health", timeout=30.0)
        if status != 200:
            raise RuntimeError(f"worker {endpoint.url} answered /health with {status}")
        counters.append(body)
    return counters


def counter_delta(before: list[dict], after: list[dict], key: str) -> list[float]:
    return [b[key] - a[key] for a, b in zip(before, after)]


async def worker_timelines(endpoints: list[Endpoint]) -> list[dict]:
    """Each worker's engine timeline (`/trex/timeline`): its steps and finished requests."""
    timelines = []
    for endpoint in endpoints:
        status, body = await request_json(endpoint, "GET", "/trex/timeline", timeout=60.0)
        if status != 200:
            raise RuntimeError(f"worker {endpoint.url} answered /trex/timeline with {status}")
        timelines.append(body)
    return timelines


def _pct(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{np.mean(values):6.3f} / {np.percentile(values, 50):6.3f} / {np.percentile(values, 99):6.3f}"


def compare_timelines(measured: dict, timelines: list[dict], prediction, specs, models) -> dict:
    """Where the time goes, measured at the workers and the client against the simulator's timeline for the
    same arrivals: per worker the steps (count, batch, CPU against the profile's model for the same step, wall
    over CPU by how many workers were busy, stalls between steps), per request the legs of its latency."""
    start, client = measured["start_s"], measured["client_timeline"]
    steps = []  # (worker index, kind, start, end, cpu, seqs, context, padded, repacked) of this run, run clock
    for i, timeline in enumerate(timelines):
        for kind, s0, s1, cpu, seqs, context, padded, repacked in timeline["steps"]:
            if s0 >= start:
                steps.append((i, kind, s0 - start, s1 - start, cpu, seqs, context, padded, repacked))
    intervals = [[(s[2], s[3]) for s in steps if s[0] == i] for i in range(len(timelines))]

    def busy_at(i: int, t: float) -> int:  # workers other than i in a step at time t
        count = 0
        for j, spans in enumerate(intervals):
            if j != i:
                k = bisect.bisect_right(spans, (t, float("inf"))) - 1
                count += k >= 0 and spans[k][0] <= t < spans[k][1]
        return count

    out: dict = {"workers": [], "requests": {}}
    sim_steps = prediction.steps
    for i, (spec, model) in enumerate(zip(specs, models)):
        mine = [s for s in steps if s[0] == i]
        decode = [s for s in mine if s[1] == "decode" and s[5] > 0]
        prefill = [s for s in mine if s[1] == "prefill"]
        sim_mine = [s for s in sim_steps if s[0] == spec.name]
        sim_decode = [s for s in sim_mine if s[1] == "decode"]
        model_cpu = [model.decode_s(s[5], s[6]) + (model.repack_s(s[6]) if s[8] else 0.0) for s in decode]
        model_cpu_padded = [model.decode_s(s[5], s[7]) + (model.repack_s(s[7]) if s[8] else 0.0) for s in decode]
        stalls = []  # the engine had sequences running (a decode step came next) yet ran no step
        for a, b in zip(mine, mine[1:]):
            if b[1] == "decode":
                stalls.append(b[2] - a[3])
        by_busy: dict[int, list[tuple[float, float, float]]] = {}  # busy workers -> (CPU, wall, model CPU)
        for s in mine:
            if s[1] == "prefill":
                predicted = model.prefill_s(s[6], s[6] ** 2)
            else:
                predicted = model.decode_s(s[5], s[6]) + (model.repack_s(s[6]) if s[8] else 0.0)
            by_busy.setdefault(1 + busy_at(i, (s[2] + s[3]) / 2), []).append((s[4], s[3] - s[2], predicted))
        share = {k: sum(c for c, _, _ in v) / max(sum(w for _, w, _ in v), 1e-9) for k, v in sorted(by_busy.items())}
        inflation = {
            k: sum(c for c, _, _ in v) / max(sum(p for _, _, p in v), 1e-9) for k, v in sorted(by_busy.items())
        }
        row = {
            "worker": spec.name,
            "prefill_steps": [len(prefill), sum(1 for s in sim_mine if s[1] == "prefill")],
            "decode_steps": [len(decode), len(sim_decode)],
            "mean_decode_seqs": [
                float(np.mean([s[5] for s in decode])) if decode else 0.0,
                float(np.mean([s[5] for s in sim_decode])) if sim_decode else 0.0,
            ],
            "repacked_fraction": [
                float(np.mean([s[8] for s in decode])) if decode else 0.0,
                float(np.mean([s[7] for s in sim_decode])) if sim_decode else 0.0,
            ],
            "decode_cpu_s": [sum(s[4] for s in decode), sum(s[4] for s in sim_decode)],
            "decode_cpu_model_s": sum(model_cpu),
            "decode_cpu_model_padded_s": sum(model_cpu_padded),
            "prefill_cpu_s": [sum(s[4] for s in prefill), sum(s[4] for s in sim_mine if s[1] == "prefill")],
            "prefill_cpu_model_s": sum(model.prefill_s(s[6], s[6] ** 2) for s in prefill),
            "wall_s": [sum(s[3] - s[2] for s in mine), sum(s[3] - s[2] for s in sim_mine)],
            "stall_s": [sum(stalls), len(stalls)],
            "share_by_busy": share,
            "cpu_over_model_by_busy": inflation,
            "steps_by_busy": {k: len(v) for k, v in sorted(by_busy.items())},
        }
        out["workers"].append(row)
    # per request: the legs of its latency, measured (client and worker clocks are the same CLOCK_MONOTONIC)
    legs: dict[str, list[float]] = {
        k: [] for k in ("to_engine", "queue", "prefill", "first_delivery", "decode", "delivery", "total")
    }
    sim_legs: dict[str, list[float]] = {k: [] for k in ("ttft", "decode", "total")}
    records = {f"r{r.id}": r for r in prediction.records if r.status == "completed"}
    engine = {}
    for timeline in timelines:
        for tag, _, _, submitted, prefill_start, first, last in timeline["requests"]:
            if submitted >= start and tag in client:
                engine[tag] = (submitted, prefill_start, first, last)
    for tag, (sent, first_client, done) in client.items():
        if tag not in engine:
            continue
        submitted, prefill_start, first, last = engine[tag]
        legs["to_engine"].append(submitted - sent)
        legs["queue"].append(prefill_start - submitted)
        legs["prefill"].append(first - prefill_start)
        legs["first_delivery"].append(first_client - first)
        legs["decode"].append(last - first)
        legs["delivery"].append(done - last)
        legs["total"].append(done - sent)
        record = records.get(tag)
        if record is not None:
            sim_legs["ttft"].append(record.first_token_s - record.arrival_s)
            sim_legs["decode"].append(record.finish_s - record.first_token_s)
            sim_legs["total"].append(record.finish_s - record.arrival_s)
    out["requests"] = {"measured": legs, "simulated": sim_legs}
    for row in out["workers"]:
        print(
            f"    {row['worker']}: steps prefill {row['prefill_steps'][0]} / sim {row['prefill_steps'][1]}, decode "
            f"{row['decode_steps'][0]} / {row['decode_steps'][1]}, mean batch {row['mean_decode_seqs'][0]:.1f} / "
            f"{row['mean_decode_seqs'][1]:.1f}, re-packed {row['repacked_fraction'][0]:.0%} / "
            f"{row['repacked_fraction'][1]:.0%}; decode CPU {row['decode_cpu_s'][0]:.1f} s (model for these steps "
            f"{row['decode_cpu_model_s']:.1f}, padded {row['decode_cpu_model_padded_s']:.1f}) / sim "
            f"{row['decode_cpu_s'][1]:.1f}; prefill CPU {row['prefill_cpu_s'][0]:.2f} (model "
            f"{row['prefill_cpu_model_s']:.2f}) / sim {row['prefill_cpu_s'][1]:.2f}; step wall {row['wall_s'][0]:.1f} / "
            f"{row['wall_s'][1]:.1f} s; stalls {row['stall_s'][0]:.2f} s over {row['stall_s'][1]} gaps; CPU/wall by "
            "busy workers "
            + ", ".join(f"{k}: {v:.2f}" for k, v in row["share_by_busy"].items())
            + "; CPU/model by busy workers "
            + ", ".join(f"{k}: {v:.2f} ({row['steps_by_busy'][k]})" for k, v in row["cpu_over_model_by_busy"].items()),
            flush=True,
        )
    print("    request legs (s), mean / P50 / P99:", flush=True)
    for key, values in legs.items():
        print(f"      measured {key:10s} {_pct(values)}", flush=True)
    for key, values in sim_legs.items():
        print(f"      simulated {key:9s} {_pct(values)}", flush=True)
    return out


async def stream_one(endpoint: Endpoint, request: Request, timeout: float = 600.0) -> int:
    """One streamed completion straight to a worker; the tokens received."""
    payload = {
        "prompt": " ".join(f"w{i}" for i in range(request.prompt_tokens)),
        "max_tokens": request.output_tokens,
        "stream": True,
        "user": f"calibration{request.id}",
    }
    response = await open_request(endpoint, "POST", "/v1/completions", payload, timeout)
    count = 0
    try:
        async for line in response.lines(timeout):
            text = line.decode().strip()
            if text.startswith("data:") and text != "data: [DONE]" and json.loads(text[5:])["choices"][0].get("text"):
                count += 1
    finally:
        response.close()
    return count


async def measure_cpu_factors(endpoints: list[Endpoint], profiles: list, seed: int, burst: int) -> dict:
    """Each worker's step CPU beside 0, 1, 2 busy others over its profile's prediction (`step_timeline.cpu_factors`),
    from the workers' own timelines: `burst` requests of the run's length mix to each worker alone in turn, then
    to all of them at once (as they finish one by one, steps beside 1 other are logged too)."""
    requests = make_requests(burst * (len(endpoints) + 1), 1.0, seed + 1000)
    start = time.perf_counter()
    chunks = [requests[i * burst : (i + 1) * burst] for i in range(len(endpoints) + 1)]
    for endpoint, chunk in zip(endpoints, chunks):
        await asyncio.gather(*(stream_one(endpoint, r) for r in chunk))
    await asyncio.gather(*(stream_one(endpoint, r) for endpoint in endpoints for r in chunks[-1]))
    timelines = [
        [TimedStep.from_row(row) for row in timeline["steps"] if row[1] >= start]
        for timeline in await worker_timelines(endpoints)
    ]
    factors = cpu_factors(timelines, [p.model for p in profiles])
    counts = busy_counts(timelines)
    return {
        "factors": [list(f) for f in factors],
        "steps_by_busy": [[c.count(k) for k in range(1, len(endpoints) + 1)] for c in counts],
        "seconds": time.perf_counter() - start,
    }


async def measure_overhead(endpoints: list[Endpoint], profiles: list, seed: int) -> dict:
    """CPU per streamed token outside the engine's steps, measured: in each worker (HTTP, JSON, the
    event loop's hand-off) and in this process (the router forwarding it, the client reading it).
    Four requests per worker through a round-robin router, streamed as in the run."""
    specs = [worker_spec(e.url, p.model, p.limits) for e, p in zip(endpoints, profiles)]
    requests = [Request(i, 0.05 * i, 32, 24) for i in range(4 * len(endpoints))]
    router = Router(
        list(zip(endpoints, specs)), make_scheduler("round_robin", seed), health_interval=0, request_timeout=600
    )
    await router.start()
    before = await worker_counters(endpoints)
    own = time.process_time()
    try:
        result = await drive(router, requests, 600.0)
    finally:
        await router.close()
    own = time.process_time() - own
    after = await worker_counters(endpoints)
    tokens = counter_delta(before, after, "tokens")
    outside = [
        p - e
        for p, e in zip(counter_delta(before, after, "process_cpu_s"), counter_delta(before, after, "engine_cpu_s"))
    ]
    if result["failed"] or min(tokens) <= 0:
        raise RuntimeError(f"the overhead calibration lost requests: {result}")
    engine = counter_delta(before, after, "engine_cpu_s")
    predicted = simulate(specs, make_scheduler("round_robin", seed), requests, SLO(10.0, 1.0))
    return {
        "worker_s_per_token": [o / t for o, t in zip(outside, tokens)],
        "router_client_s_per_token": own / sum(tokens),
        "engine_cpu_s": engine,
        "engine_cpu_predicted_s": [predicted.cpu_s[s.name] for s in specs],
    }


async def rehearse(endpoints, specs, bases, scheduler: str, stats, rate: float, shares, args, seed: int) -> dict:
    """The run's twin, right before it: `args.rehearsal` requests of another seed at the same rate through a router
    with the same scheduler. From the workers' timelines: each worker's step CPU over its profile's by the step's
    shape (`step_timeline.shape_factors`) - the state the run will meet (the other workers at the same load, the
    host's other tenants now), not the profiling minute's - and the CPU share the workers got, against the share the
    simulation of the same rehearsal implies from the probes: the probes' ratio to it scales the run's shares."""
    requests = make_requests(args.rehearsal, rate, seed + 2000)
    router = Router(
        [(e, s) for e, s in zip(endpoints, specs)],
        make_scheduler(scheduler, seed, stats),
        health_interval=0,
        request_timeout=args.timeout,
        max_in_flight=10_000,
    )
    before = await worker_counters(endpoints)
    await router.start()
    try:
        measured = await drive(router, requests, args.timeout)
    finally:
        await router.close()
    after = await worker_counters(endpoints)
    if measured["failed"]:
        raise RuntimeError(f"the rehearsal lost {measured['failed']} requests")
    faults = counter_delta(before, after, "minor_faults")
    timelines = await worker_timelines(endpoints)
    steps = [
        [TimedStep.from_row(r) for r in t["steps"] if r[1] >= measured["start_s"] and (r[0] == "prefill" or r[4])]
        for t in timelines
    ]
    factors = {s.name: shape_factors(st, base) for s, st, base in zip(specs, steps, bases)}
    simulated = simulate(
        specs, make_scheduler(scheduler, seed, stats), requests, SLO(10.0, 1.0), cpu_shares=shares,
        shape_factors=factors,
    )  # fmt: skip
    got = CpuShares.from_counters(
        counter_delta(before, after, "engine_cpu_s"), counter_delta(before, after, "engine_busy_s")
    )
    implied = CpuShares.from_counters(
        [simulated.cpu_s[s.name] for s in specs], [simulated.busy_s[s.name] for s in specs]
    )
    return {
        "factors": factors,
        "start_s": measured["start_s"],
        "share_got": got,
        "minor_faults": faults,
        "share_implied": implied,
        "measured": {k: v for k, v in measured.items() if k != "client_timeline"},
        "predicted": {
            "throughput_tok_s": simulated.report.throughput_tok_s,
            "latency_p50_s": simulated.report.latency_p50_s,
            "latency_p99_s": simulated.report.latency_p99_s,
        },
    }


async def step_cpu_estimate(endpoints, specs, bases, since: float) -> StepCpuEstimate:
    """The step CPU in service over `bases` (each worker's latency model), from every step the workers ran since
    `since` (`step_timeline.estimate_step_cpu`): the overhead calibration, the rehearsals and the runs before."""
    steps = [[TimedStep.from_row(r) for r in t["steps"] if r[1] >= since] for t in await worker_timelines(endpoints)]
    return estimate_step_cpu([s.name for s in specs], steps, bases)


async def calibrated(endpoints, specs, profiles, overhead, since: float):
    """The workers as the schedulers and the simulator see them for the next run, from every step so far: each
    worker's profile scaled by its steps' CPU in service over the profile's (so trex's scheduler, live and
    simulated alike, ranks the workers by what their steps cost now), plus its streaming overhead; and the
    estimate's factors by shape and by busy workers relative to those scaled models, for the simulator."""
    first = await step_cpu_estimate(endpoints, specs, [p.model for p in profiles], since)
    bases = [p.model.scaled(first.overall[s.name], "step CPU in service") for s, p in zip(specs, profiles)]
    run_specs = [
        worker_spec(s.name, b.with_token_overhead(o, "HTTP streaming"), p.limits)
        for s, b, p, o in zip(specs, bases, profiles, overhead["worker_s_per_token"])
    ]
    return run_specs, bases, await step_cpu_estimate(endpoints, run_specs, bases, since), first


async def run(args) -> dict:
    profiles = profile_workers(args.max_num_seqs)
    processes, endpoints = start_workers(args.max_num_seqs)
    try:
        await wait_ready(endpoints)
        ready_s = time.perf_counter()  # every step from here on is service (the warm-up's are not logged)
        warm_up = [c.get("warm_up_faults", []) for c in await worker_counters(endpoints)]
        print(
            "workers' warm-up (heap grown before serving), minor page faults per round: "
            + "; ".join(", ".join(str(f) for f in rounds) for rounds in warm_up),
            flush=True,
        )
        overhead = await measure_overhead(endpoints, profiles, args.seed)
        print(
            "overhead per streamed token: workers "
            + ", ".join(f"{s * 1e3:.2f}" for s in overhead["worker_s_per_token"])
            + f" ms CPU; router + client {overhead['router_client_s_per_token'] * 1e3:.2f} ms CPU. Engine CPU "
            + ", ".join(f"{m:.2f}" for m in overhead["engine_cpu_s"])
            + " s measured vs "
            + ", ".join(f"{p:.2f}" for p in overhead["engine_cpu_predicted_s"])
            + " s from the profile",
            flush=True,
        )
        specs = [
            worker_spec(e.url, p.model.with_token_overhead(o, "HTTP streaming"), p.limits)
            for e, p, o in zip(endpoints, profiles, overhead["worker_s_per_token"])
        ]
        corun = (
            await measure_cpu_factors(endpoints, profiles, args.seed, args.calibration_burst)
            if args.calibration_burst
            else None
        )
        factors = {s.name: tuple(f) for s, f in zip(specs, corun["factors"])} if corun else None
        if corun:
            print(
                f"step CPU over the profile's with 1..{len(specs)} workers busy ({corun['seconds']:.0f} s of "
                "calibration): "
                + "; ".join(
                    ", ".join(f"{f:.2f}" for f in fs) + f" ({'/'.join(map(str, n))} steps)"
                    for fs, n in zip(corun["factors"], corun["steps_by_busy"])
                ),
                flush=True,
            )
        shares = measure_cpu_shares(len(specs))
        print(f"CPU shares with 1..{len(specs)} busy: {', '.join(f'{s:.2f}' for s in shares.shares)}", flush=True)
        probe_requests = make_requests(args.requests, 1.0, args.seed)
        stats = workload_stats(probe_requests)
        per_core = [
            capacity_requests_s(s, stats.mean_prompt, stats.mean_output, stats.context_in_flight) for s in specs
        ]
        capacity = sum(per_core) * shares.share(len(specs))  # all busy: each gets that share of a core
        if args.burst:  # every request at once: no arrival process, each latency is a drain time
            rate = float("inf")
        elif args.slowest_utilisation is not None:  # the operating point's rule, fixed before any run
            rate = rate_at_round_robin_utilisation(
                [c * shares.share(len(specs)) for c in per_core], args.slowest_utilisation
            )
        else:
            rate = args.load * capacity
        slowest_rr = rate / len(specs) / (min(per_core) * shares.share(len(specs)))
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
                    "capacity_req_s_one_core": c,
                }
                for s, w, c in zip(specs, WORKERS, per_core)
            ],
            "overhead": overhead,
            "warm_up_faults": warm_up,
            "cpu_factors": corun,
            "cpu_shares_before_rate": shares.to_dict(),
            "capacity_req_s": capacity,
            "rate_req_s": rate,
            "rate_rule": (
                {"burst": True}
                if args.burst
                else {"slowest_utilisation_under_round_robin": args.slowest_utilisation}
                if args.slowest_utilisation is not None
                else {"load": args.load}
            ),
            "slowest_utilisation_under_round_robin": slowest_rr,
            "requests": args.requests,
            "runs": {},
        }
        print(
            f"workers' capacity {capacity:.2f} req/s in all (one core each: "
            + ", ".join(f"{c:.2f}" for c in per_core)
            + f"); offered {rate:.2f} req/s ({rate / capacity:.0%}; round robin drives the slowest worker at "
            f"{slowest_rr:.2f} of its capacity)",
            flush=True,
        )
        for seed in args.seeds or [args.seed]:
            requests = make_requests(args.requests, rate, seed)
            if args.seeds:
                print(f"requests of seed {seed}:", flush=True)
            for scheduler in args.schedulers:
                key = f"{scheduler}@{seed}" if args.seeds else scheduler
                shares = measure_cpu_shares(len(specs))  # the host as it is now, just before this run
                probed = shares
                by_shape = None
                rehearsal = None
                estimate = first_estimate = None
                run_specs, bases = specs, [p.model for p in profiles]
                pooled = args.rehearsal and args.step_cpu == "pooled"
                if pooled:  # the rehearsal's router already sees the workers as every step so far priced them
                    run_specs, bases, _, _ = await calibrated(endpoints, specs, profiles, overhead, ready_s)
                if args.rehearsal:
                    rehearsal = await rehearse(endpoints, run_specs, bases, scheduler, stats, rate, shares, args, seed)
                    by_shape = rehearsal["factors"]
                    scale = rehearsal["share_got"] / rehearsal["share_implied"]
                    shares = CpuShares(
                        tuple(min(1.0, x * scale) for x in probed.shares),
                        f"probed x {scale:.3f} (the rehearsal's share)",
                    )
                    print(
                        f"  {scheduler:12s} rehearsal ({args.rehearsal} requests, the same rate and scheduler): measured "
                        f"{rehearsal['measured']['throughput_tok_s']:.1f} tok/s, P99 "
                        f"{rehearsal['measured']['latency_p99_s']:.2f} s; CPU share got {rehearsal['share_got']:.2f}, "
                        f"the probes imply {rehearsal['share_implied']:.2f}; minor faults "
                        + ", ".join(str(f) for f in rehearsal["minor_faults"])
                        + "; step CPU over the profile's by shape:",
                        flush=True,
                    )
                    for name, f in by_shape.items():
                        print(f"      {name}: {f.describe()}", flush=True)
                if pooled:
                    run_specs, bases, estimate, first_estimate = await calibrated(
                        endpoints, specs, profiles, overhead, ready_s
                    )
                    print(
                        f"  {'':12s} every step so far ({estimate.describe()}): step CPU over the profile's "
                        + ", ".join(f"{v:.3f}" for v in first_estimate.overall.values())
                        + "; relative to that, by shape:",
                        flush=True,
                    )
                    for name, f in estimate.shapes.items():
                        print(f"      {name}: {f.describe()}", flush=True)
                    model_options = estimate.simulation_options()
                    # the share of a core by busy workers as the workers' steps got it (the probes, scaled by the
                    # rehearsal, stay with the rehearsal-only diagnostic below)
                    rehearsal_shares, shares = shares, model_options.pop("cpu_shares")
                else:
                    model_options = {"cpu_factors": factors, "shape_factors": by_shape}
                prediction = simulate(
                    run_specs,
                    make_scheduler(scheduler, seed, stats),
                    requests,
                    SLO(10.0, 1.0),
                    cpu_shares=shares,
                    **model_options,
                )
                # the fifth session's prediction (the rehearsal's factors alone, the profile's latencies for the
                # schedulers), a diagnostic beside the pooled one
                rehearsal_only = (
                    simulate(
                        specs, make_scheduler(scheduler, seed, stats), requests, SLO(10.0, 1.0),
                        cpu_shares=rehearsal_shares, shape_factors=by_shape,
                    ).report
                    if pooled
                    else None
                )  # fmt: skip
                router = Router(
                    [(e, s) for e, s in zip(endpoints, run_specs)],
                    make_scheduler(scheduler, seed, stats),
                    health_interval=0,
                    request_timeout=args.timeout,
                    max_in_flight=10_000,
                )
                before = await worker_counters(endpoints)
                own = time.process_time()
                await router.start()
                timeline: list[tuple[float, float, float]] = []  # (seconds into the run, engine CPU, engine busy)
                stop = asyncio.Event()

                async def sample_counters(stop=stop, timeline=timeline) -> None:
                    start = time.perf_counter()
                    while not stop.is_set():
                        counters = await worker_counters(endpoints)
                        timeline.append(
                            (
                                time.perf_counter() - start,
                                sum(c["engine_cpu_s"] for c in counters),
                                sum(c["engine_busy_s"] for c in counters),
                            )
                        )
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)

                sampler = asyncio.create_task(sample_counters())
                try:
                    measured = await drive(router, requests, args.timeout)
                finally:
                    stop.set()
                    await sampler
                    await router.close()
                own = time.process_time() - own
                after = await worker_counters(endpoints)
                timelines = await worker_timelines(endpoints)
                compared = compare_timelines(measured, timelines, prediction, specs, [p.model for p in profiles])
                engine_cpu = counter_delta(before, after, "engine_cpu_s")
                engine_busy = counter_delta(before, after, "engine_busy_s")
                faults = counter_delta(before, after, "minor_faults")
                got = CpuShares.from_counters(engine_cpu, engine_busy)
                expected = CpuShares.from_counters(
                    [prediction.cpu_s[s.name] for s in specs], [prediction.busy_s[s.name] for s in specs]
                )
                # a diagnostic, not the prediction: the same simulation with the shares scaled to what the run got
                replay = simulate(
                    run_specs,
                    make_scheduler(scheduler, seed, stats),
                    requests,
                    SLO(10.0, 1.0),
                    cpu_shares=CpuShares(
                        tuple(min(1.0, x * got / expected) for x in shares.shares), "scaled to the run's measured share"
                    ),
                    **model_options,
                ).report
                # and replayed with the share the run got in each sampling interval: a host whose load moved
                over_time = share_over_time(timeline, expected)
                replay_t = simulate(
                    run_specs,
                    make_scheduler(scheduler, seed, stats),
                    requests,
                    SLO(10.0, 1.0),
                    cpu_shares=shares,
                    share_over_time=over_time,
                    **model_options,
                ).report
                # a diagnostic: replayed with the step CPU each worker's steps actually took over its profile's, this run
                run_steps = [
                    [
                        TimedStep.from_row(r)
                        for r in t["steps"]
                        if r[1] >= measured["start_s"] and (r[0] == "prefill" or r[4])
                    ]
                    for t in timelines
                ]
                run_factor = [
                    sum(st.cpu_s for st in steps) / max(sum(st.model_cpu_s(p.model) for st in steps), 1e-9)
                    for steps, p in zip(run_steps, profiles)
                ]
                replay_cpu = simulate(
                    specs,
                    make_scheduler(scheduler, seed, stats),
                    requests,
                    SLO(10.0, 1.0),
                    cpu_shares=shares,
                    cpu_factors={s.name: (f,) * len(specs) for s, f in zip(specs, run_factor)},
                ).report
                # the drift between the rehearsal and the run: the run's own factors by shape (a diagnostic)
                run_by_shape = {s.name: shape_factors(st, p.model) for s, st, p in zip(specs, run_steps, profiles)}
                report = prediction.report
                # what the prediction would have been without the step-CPU calibration (the previous sessions' model:
                # the profile and the probed shares)
                unscaled = simulate(
                    specs, make_scheduler(scheduler, seed, stats), requests, SLO(10.0, 1.0), cpu_shares=probed
                ).report
                # the engine threads' CPU the simulation implies: its step CPU less the streaming overhead it charged
                predicted_engine = [
                    prediction.cpu_s[s.name]
                    - o * sum(r.output_tokens for r in prediction.records if r.instance == s.name)
                    for s, o in zip(specs, overhead["worker_s_per_token"])
                ]
                run_result = {
                    "measured": measured,
                    "router": router.snapshot(),
                    "cpu_shares": shares.to_dict(),
                    "predicted": {
                        "throughput_tok_s": report.throughput_tok_s,
                        "latency_p50_s": report.latency_p50_s,
                        "latency_p99_s": report.latency_p99_s,
                        "ttft_p99_s": report.ttft_p99_s,
                        "duration_s": report.duration_s,
                        "requests_per_instance": report.requests_per_instance,
                        "engine_cpu_s": predicted_engine,
                        "mean_cpu_share": expected,
                    },
                    "rehearsal": (
                        {
                            **{k: v for k, v in rehearsal.items() if k != "factors"},
                            "shape_factors": {n: vars(f) for n, f in rehearsal["factors"].items()},
                        }
                        if rehearsal
                        else None
                    ),
                    "run_shape_factors": {n: vars(f) for n, f in run_by_shape.items()},
                    "cpu_shares_probed": probed.to_dict(),
                    "step_cpu_estimate": (
                        {
                            "steps": estimate.steps,
                            "busy": estimate.busy,
                            "busy_steps": estimate.busy_steps,
                            "overall_over_profile": first_estimate.overall,
                            "shape_factors": {n: vars(f) for n, f in estimate.shapes.items()},
                        }
                        if estimate
                        else None
                    ),
                    "predicted_from_the_rehearsal_alone": (
                        {
                            "throughput_tok_s": rehearsal_only.throughput_tok_s,
                            "latency_p50_s": rehearsal_only.latency_p50_s,
                            "latency_p99_s": rehearsal_only.latency_p99_s,
                        }
                        if rehearsal_only
                        else None
                    ),
                    "predicted_without_cpu_factors": {
                        "throughput_tok_s": unscaled.throughput_tok_s,
                        "latency_p50_s": unscaled.latency_p50_s,
                        "latency_p99_s": unscaled.latency_p99_s,
                    },
                    "run_step_cpu_over_profile": run_factor,
                    "replayed_with_run_step_cpu": {
                        "throughput_tok_s": replay_cpu.throughput_tok_s,
                        "latency_p50_s": replay_cpu.latency_p50_s,
                        "latency_p99_s": replay_cpu.latency_p99_s,
                    },
                    "replayed_at_measured_share": {
                        "throughput_tok_s": replay.throughput_tok_s,
                        "latency_p50_s": replay.latency_p50_s,
                        "latency_p99_s": replay.latency_p99_s,
                    },
                    "replayed_at_share_over_time": {
                        "throughput_tok_s": replay_t.throughput_tok_s,
                        "latency_p50_s": replay_t.latency_p50_s,
                        "latency_p99_s": replay_t.latency_p99_s,
                    },
                    "share_timeline": timeline,
                    "timeline_comparison": compared,
                    "engine_cpu_s": engine_cpu,
                    "engine_busy_s": engine_busy,
                    "minor_faults": faults,
                    "mean_cpu_share": got,
                    "router_client_cpu_s": own,
                    "load_average": os.getloadavg(),
                }
                results["runs"][key] = run_result
                # the raw timelines of this run (steps and requests since it started), written apart, compressed
                results.setdefault("timelines", {})[key] = {
                    "client": measured.pop("client_timeline"),
                    "workers": [
                        {
                            # the rehearsal's steps too: what the prediction was made from
                            "steps": [r for r in t["steps"] if r[1] >= (rehearsal or measured)["start_s"]],
                            "requests": [r for r in t["requests"] if r[3] >= measured["start_s"]],
                        }
                        for t in timelines
                    ],
                }

                def err(key: str, run_result=run_result, measured=measured) -> str:
                    return f"{run_result['predicted'][key] / measured[key] - 1:+.0%}"

                print(
                    f"  {scheduler:12s} measured {measured['throughput_tok_s']:6.1f} tok/s, "
                    f"P50 {measured['latency_p50_s']:6.2f} s, P99 {measured['latency_p99_s']:6.2f} s "
                    f"({measured['completed']} ok, {measured['failed']} failed) | simulator "
                    f"{report.throughput_tok_s:6.1f} tok/s ({err('throughput_tok_s')}), P50 {report.latency_p50_s:6.2f} s "
                    f"({err('latency_p50_s')}), P99 {report.latency_p99_s:6.2f} s ({err('latency_p99_s')}) | "
                    f"CPU share per busy worker: predicted {expected:.2f}, got {got:.2f}; engine CPU "
                    + ", ".join(f"{c:.1f}" for c in engine_cpu)
                    + " s vs predicted "
                    + ", ".join(f"{c:.1f}" for c in predicted_engine)
                    + f" s; router + client {own:.1f} s CPU; workers' minor faults "
                    + ", ".join(str(f) for f in faults),
                    flush=True,
                )
                print(
                    f"  {'':12s} predicted from the profile and the probes alone: {unscaled.throughput_tok_s:6.1f} tok/s "
                    f"({unscaled.throughput_tok_s / measured['throughput_tok_s'] - 1:+.0%}), P50 {unscaled.latency_p50_s:6.2f} s "
                    f"({unscaled.latency_p50_s / measured['latency_p50_s'] - 1:+.0%}), P99 {unscaled.latency_p99_s:6.2f} s "
                    f"({unscaled.latency_p99_s / measured['latency_p99_s'] - 1:+.0%})",
                    flush=True,
                )
                if rehearsal_only:
                    print(
                        f"  {'':12s} predicted from the rehearsal alone (fifth session): P50 "
                        f"{rehearsal_only.latency_p50_s:6.2f} s ({rehearsal_only.latency_p50_s / measured['latency_p50_s'] - 1:+.0%}), "
                        f"P99 {rehearsal_only.latency_p99_s:6.2f} s "
                        f"({rehearsal_only.latency_p99_s / measured['latency_p99_s'] - 1:+.0%})",
                        flush=True,
                    )
                for name, f in run_by_shape.items():
                    print(f"  {'':12s} the run's own step CPU by shape, {name}: {f.describe()}", flush=True)
                print(
                    f"  {'':12s} replayed with the step CPU the run took ("
                    + ", ".join(f"{f:.2f}" for f in run_factor)
                    + f" x the profile's): P50 {replay_cpu.latency_p50_s:6.2f} s "
                    f"({replay_cpu.latency_p50_s / measured['latency_p50_s'] - 1:+.0%}), P99 {replay_cpu.latency_p99_s:6.2f} s "
                    f"({replay_cpu.latency_p99_s / measured['latency_p99_s'] - 1:+.0%})",
                    flush=True,
                )
                print(
                    f"  {'':12s} replayed at the share the run got: {replay.throughput_tok_s:6.1f} tok/s, "
                    f"P50 {replay.latency_p50_s:6.2f} s, P99 {replay.latency_p99_s:6.2f} s; with the share it got "
                    f"every {SAMPLE_EVERY_S:g} s: {replay_t.throughput_tok_s:6.1f} tok/s, P50 {replay_t.latency_p50_s:6.2f} s, "
                    f"P99 {replay_t.latency_p99_s:6.2f} s",
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
    parser.add_argument(
        "--slowest-utilisation",
        type=float,
        help="choose the rate instead of --load: the one at which round robin drives the slowest worker at this "
        "fraction of its capacity (`rate_at_round_robin_utilisation`); a forecast error e of the workers' speed "
        "becomes about e / (1 - this) in the latencies",
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="send every request at once (the offline-throughput benchmark; vLLM's benchmark_serving "
        "--request-rate inf) instead of Poisson arrivals: with no arrival process to keep up with, a request's "
        "latency is the time its worker takes to drain the work ahead of it, linear in the workers' speed",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="serve several request sets (one per seed, each with its own rehearsals and predictions) after one "
        "profile; results keyed scheduler@seed",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--max-num-seqs", type=int, default=16, help="each worker's batch limit")
    parser.add_argument(
        "--rehearsal",
        type=int,
        default=100,
        help="requests of the rehearsal before each scheduler's run (the step CPU by shape and the CPU share the "
        "simulator is given; 0: none, the profile and the probed shares alone)",
    )
    parser.add_argument(
        "--step-cpu",
        choices=("pooled", "rehearsal"),
        default="pooled",
        help="what prices the simulated steps: every step the workers ran so far, by shape and by busy workers, with "
        "the schedulers' latencies scaled to it (pooled), or the last rehearsal's steps by shape alone (rehearsal)",
    )
    parser.add_argument(
        "--calibration-burst",
        type=int,
        default=0,
        help="requests per worker in the step-CPU calibration (0: none; the simulator then assumes the profile's CPU)",
    )
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--name", default="live_router", help="the results file's name (<out>/<name>.json)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated bench still stops its workers
    results = asyncio.run(run(args))
    runs = results["runs"]
    for suffix in [f"@{s}" for s in args.seeds] if args.seeds else [""]:
        if f"round_robin{suffix}" in runs and f"trex{suffix}" in runs:
            rr, tx = runs[f"round_robin{suffix}"]["measured"], runs[f"trex{suffix}"]["measured"]
            print(
                f"trex / round robin{suffix and ' (seed ' + suffix[1:] + ')'}: throughput "
                f"{tx['throughput_tok_s'] / rr['throughput_tok_s']:.2f}x, "
                f"P99 latency {tx['latency_p99_s'] / rr['latency_p99_s']:.2f}x"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timelines = results.pop("timelines", {})
    (out / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    with gzip.open(out / f"{args.name}_timelines.json.gz", "wt") as handle:
        json.dump(timelines, handle)
    for key in ("throughput_tok_s", "latency_p50_s", "latency_p99_s"):
        errors = [abs(r["predicted"][key] / r["measured"][key] - 1) for r in runs.values()]
        print(f"simulator vs measurement, {key}: |error| median {statistics.median(errors):.1%}, max {max(errors):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
