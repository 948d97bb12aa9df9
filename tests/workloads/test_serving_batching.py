"""The CPU worker's continuous batching: the same tokens as one-at-a-time generation, real batching,
cancelled requests leave, a failing step fails its requests; the simulator models the same engine
(one prompt per prefill step, instances sharing cores); profiles carry the worker's limits."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace

import pytest
from serving_helpers import instance

from trex.workloads.serving.batching import BatchedRequest, BatchingEngine
from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.cpu_share import CpuShares, measure_cpu_shares
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.http import Endpoint, open_request, request_json
from trex.workloads.serving.instance_model import EngineLimits
from trex.workloads.serving.latency_fit import LatencyModel, load_engine_limits, save_samples
from trex.workloads.serving.schedulers import make_scheduler
from trex.workloads.serving.simulator import Simulation
from trex.workloads.serving.step_timeline import (
    ShapeFactors,
    TimedStep,
    busy_counts,
    cpu_factors,
    estimate_step_cpu,
    shape_factors,
    wall_by_busy,
)
from trex.workloads.serving.worker import TinyEngine, Worker, WorkerModelConfig
from trex.workloads.serving.workload import Request


@pytest.fixture(scope="module")
def engine():
    return TinyEngine(WorkerModelConfig(layers=2, hidden=32, heads=2, vocab=64), threads=1)


def serve_all(batching: BatchingEngine, jobs: list[tuple[list[int], int]], timeout: float = 60.0) -> list:
    results: dict[int, object] = {}
    done = threading.Event()

    def finisher(i: int):
        def on_done(result):
            results[i] = result
            if len(results) == len(jobs):
                done.set()

        return on_done

    for i, (prompt, max_tokens) in enumerate(jobs):
        batching.submit(BatchedRequest(prompt, max_tokens, on_done=finisher(i)))
    assert done.wait(timeout), f"only {len(results)} of {len(jobs)} requests finished"
    return [results[i] for i in range(len(jobs))]


def test_batched_tokens_equal_one_at_a_time_generation(engine):
    jobs = [([1, 2, 3, 4, 5], 12), (list(range(10, 40)), 5), ([7], 20), (list(range(3, 20)), 9), ([9, 9], 1)]
    reference = [engine.generate(prompt, max_tokens) for prompt, max_tokens in jobs]
    batching = BatchingEngine(engine.model, engine.torch, max_num_seqs=3, threads=1)
    try:
        assert serve_all(batching, jobs) == reference
    finally:
        batching.stop()
    assert batching.steps["prefill"] == len(jobs)  # one prompt per prefill step
    one_at_a_time = sum(max_tokens - 1 for _, max_tokens in jobs)
    assert batching.steps["decode"] < one_at_a_time  # sequences really decoded together


def test_cache_buffers_grow_in_place_past_their_room(engine):
    from trex.workloads.serving.batching import ROOM

    jobs = [([1, 2, 3], ROOM + 40), (list(range(5, 30)), ROOM // 2)]
    batching = BatchingEngine(engine.model, engine.torch, max_num_seqs=4)
    try:
        assert serve_all(batching, jobs) == [engine.generate(p, n) for p, n in jobs]
    finally:
        batching.stop()


def test_batch_never_exceeds_max_num_seqs(engine):
    batching = BatchingEngine(engine.model, engine.torch, max_num_seqs=2)
    seen = []
    original = batching.decode

    def watch():
        original()
        seen.append(len(batching.batch))

    batching.decode = watch
    try:
        serve_all(batching, [([i + 1, i + 2], 6) for i in range(5)])
    finally:
        batching.stop()
    assert seen and max(seen) == 2


def test_a_cancelled_request_leaves_the_batch(engine):
    batching = BatchingEngine(engine.model, engine.torch, max_num_seqs=1)
    long = BatchedRequest([1, 2, 3], 4000)
    batching.submit(long)
    try:
        long.cancelled = True  # the client went away; the slot frees for the next request
        assert serve_all(batching, [([4, 5], 3)], timeout=30.0)[0] == engine.generate([4, 5], 3)
    finally:
        batching.stop()
    assert len(long.tokens) < 4000


def test_a_failing_step_fails_its_requests_with_the_error(engine):
    class Broken:
        def __call__(self, **_):
            raise RuntimeError("out of memory")

    batching = BatchingEngine(Broken(), engine.torch, max_num_seqs=4)
    try:
        results = serve_all(batching, [([1, 2], 3), ([3], 2)], timeout=10.0)
    finally:
        batching.stop()
    assert all(isinstance(r, RuntimeError) and "out of memory" in str(r) for r in results)


def test_bad_engine_inputs_are_named(engine):
    with pytest.raises(ServingError, match="max_num_seqs"):
        BatchingEngine(engine.model, engine.torch, max_num_seqs=0)
    batching = BatchingEngine(engine.model, engine.torch)
    with pytest.raises(ServingError, match="at least one prompt token"):
        batching.submit(BatchedRequest([], 3))


def test_worker_streams_concurrent_requests_from_one_batch(engine):
    async def scenario():
        worker = Worker(engine, max_num_seqs=4)
        server = await worker.start()
        endpoint = Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])

        async def one(words: int, max_tokens: int) -> list[str]:
            payload = {
                "prompt": " ".join(f"w{i}" for i in range(words)),
                "max_tokens": max_tokens,
                "stream": True,
                "user": f"c{words}",
            }
            response = await open_request(endpoint, "POST", "/v1/completions", payload, 30)
            texts = []
            async for line in response.lines(30):
                text = line.decode().strip()
                if text.startswith("data:") and text != "data: [DONE]":
                    texts.append(json.loads(text[5:])["choices"][0]["text"])
            response.close()
            return [t for t in texts if t]

        try:
            streams = await asyncio.gather(*(one(3 + i, 5 + i) for i in range(6)))
            # the last token reaches the client from inside the engine's final step (counted when it starts,
            # logged when it ends); a loaded machine can hold the engine thread back between the two, so read
            # /health and the timeline once that step is logged (no new step starts: nothing is left to serve)
            batching, waited = worker.batching, 0
            while sum(batching.steps.values()) != len(batching.step_log) and waited < 12000:
                await asyncio.sleep(0.01)
                waited += 1
            status, health = await request_json(endpoint, "GET", "/health", timeout=5)
            _, timeline = await request_json(endpoint, "GET", "/trex/timeline", timeout=5)
        finally:
            server.close()
            worker.close()
        assert [len(s) for s in streams] == [5 + i for i in range(6)]
        assert status == 200 and health["served"] == 6 and health["max_num_seqs"] == 4
        # CPU accounting a bench prices the HTTP overhead with: the engine's steps and the whole process
        assert health["tokens"] == sum(5 + i for i in range(6))
        assert 0 < health["engine_cpu_s"] <= health["process_cpu_s"] and health["engine_busy_s"] > 0
        assert isinstance(health["minor_faults"], int) and health["minor_faults"] > 0  # a process has faulted pages in
        assert health["steps"]["prefill"] == 6 and health["steps"]["decode"] == worker.batching.steps["decode"]
        assert worker.batching.steps["decode"] < sum(4 + i for i in range(6))
        # the engine's timeline, what a live bench compares with the simulator's: each request by its `user` tag,
        # its legs in order; every step with its shape, in order and not overlapping
        requests = {r[0]: dict(zip(timeline["request_fields"], r)) for r in timeline["requests"]}
        assert sorted(requests) == sorted(f"c{3 + i}" for i in range(6))
        for tag, r in requests.items():
            assert r["prompt_tokens"] == int(tag[1:]) and r["max_tokens"] == int(tag[1:]) + 2
            assert r["submitted_s"] <= r["prefill_start_s"] < r["first_token_s"] <= r["last_token_s"]
            assert r["last_token_s"] <= timeline["now_s"]
        steps = [dict(zip(timeline["step_fields"], s)) for s in timeline["steps"]]
        assert [s["kind"] for s in steps].count("prefill") == 6 == len(steps) - health["steps"]["decode"]
        assert sorted(s["context"] for s in steps if s["kind"] == "prefill") == [3 + i for i in range(6)]
        assert all(a["end_s"] <= b["start_s"] for a, b in zip(steps, steps[1:]))
        decode = [s for s in steps if s["kind"] == "decode"]
        assert all(1 <= s["seqs"] <= 4 and s["context"] <= s["padded"] and s["cpu_s"] > 0 for s in decode)
        assert decode[0]["repacked"] and sum(s["seqs"] for s in decode) == sum(4 + i for i in range(6))

    asyncio.run(scenario())


def test_simulator_prefills_one_prompt_per_step_when_the_engine_does():
    limits = EngineLimits(max_batched_tokens=4096, max_num_seqs=8, max_prefill_seqs=1)
    spec = instance("cpu", 1.0)
    spec = type(spec)(spec.name, spec.machine, spec.device, 1, spec.latency, spec.kv, spec.kv_capacity_bytes, limits)
    sim = Simulation([spec], make_scheduler("round_robin"), SLO(10, 1))
    sizes = []
    original = sim._start_step

    def watch(now, inst):
        original(now, inst)
        if inst.step and inst.step[0] == "prefill":
            sizes.append(len(inst.step[1]))

    sim._start_step = watch
    sim.run([Request(i, 0.0, 10, 4) for i in range(5)])
    assert sizes == [1] * 5
    assert limits.prompts_per_prefill(10) == 1 and EngineLimits().prompts_per_prefill(1000) == 8


def test_instances_sharing_cores_run_slower_while_both_are_busy():
    requests = [Request(i, 0.0, 10, 20) for i in range(4)]

    def duration(cores):
        sim = Simulation([instance("a", 1.0), instance("b", 1.0)], make_scheduler("round_robin"), SLO(10, 1),
                         shared_cores=cores)  # fmt: skip
        return sim.run(requests).report.duration_s

    assert duration(1) == pytest.approx(2 * duration(2), rel=0.05)
    with pytest.raises(ServingError, match="shared_cores"):
        Simulation([instance("a", 1.0)], make_scheduler("round_robin"), SLO(), shared_cores=0)


def test_measured_cpu_shares_stretch_steps_by_the_share_each_busy_instance_gets():
    requests = [Request(i, 0.0, 10, 20) for i in range(4)]
    specs = [instance("a", 1.0), instance("b", 1.0)]

    def run(**options):
        return Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), **options).run(requests)

    alone = run()
    # a host where other processes leave each instance 40% of a core alone, 25% when both are busy
    loaded = run(cpu_shares=CpuShares((0.4, 0.25)))
    assert loaded.report.duration_s == pytest.approx(4 * alone.report.duration_s, rel=0.05)
    assert loaded.cpu_s == pytest.approx(alone.cpu_s)  # contention costs wall time, not CPU time
    assert CpuShares.from_counters(list(loaded.cpu_s.values()), list(loaded.busy_s.values())) == pytest.approx(
        0.25, rel=0.02
    )  # the first step of the first instance runs alone, at 0.4
    assert CpuShares.from_cores(2, 3).shares == (1.0, 1.0, pytest.approx(2 / 3))
    assert CpuShares((0.5, 0.3)).share(3) == pytest.approx(0.2)  # past the table: the same CPU split further
    with pytest.raises(ServingError, match="not both"):
        run(shared_cores=2, cpu_shares=CpuShares((1.0, 1.0)))
    with pytest.raises(ServingError, match="fractions of a core"):
        CpuShares((0.5, 1.5))


def test_decode_steps_after_a_join_or_leave_pay_the_repack():
    spec = instance("a", 1.0)
    costly = replace(spec, latency=replace(spec.latency, repack=(0.005, 1e-4)))
    requests = [Request(0, 0.0, 10, 5), Request(1, 0.0, 10, 8)]

    def busy(s):
        return Simulation([s], make_scheduler("round_robin"), SLO(10, 1)).run(requests).busy_s["a"]

    # both prompts prefill (one per step: the first arrives at an idle engine) and join before the first decode
    # step: one repack of 2 x (10 + 1)
    # tokens; the first leaves after 4 decode steps: one repack of the second's 10 + 5 tokens before step 5;
    # the other decode steps re-pack nothing
    assert busy(costly) - busy(spec) == pytest.approx(0.005 + 1e-4 * 22 + 0.005 + 1e-4 * 15)
    # the simulator's timeline says the same step by step: the steps a live worker logs at `/trex/timeline`
    steps = Simulation([costly], make_scheduler("round_robin"), SLO(10, 1)).run(requests).steps
    assert [(kind, seqs, repacked) for _, kind, _, _, _, seqs, _, repacked in steps] == [
        ("prefill", 1, False),
        ("prefill", 1, False),
        *[("decode", 2, i == 0) for i in range(4)],
        *[("decode", 1, i == 0) for i in range(3)],
    ]
    assert [context for *_, context, _ in steps[:4]] == [10, 10, 22, 24]  # prompt tokens; then 2 x (10 + 1 + i)
    assert all(a[3] == pytest.approx(b[2]) for a, b in zip(steps, steps[1:]))  # back to back, never overlapping


def test_cpu_share_probes_measure_this_host():
    shares = measure_cpu_shares(2, seconds=0.3, rounds=1)
    assert len(shares.shares) == 2 and all(0 < s <= 1 for s in shares.shares)
    with pytest.raises(ServingError, match="instances >= 1"):
        measure_cpu_shares(0)


def test_per_token_overhead_is_charged_to_the_step_that_emits_the_token():
    model = LatencyModel((0.01, 1e-4, 0.0), (0.02, 1e-3, 1e-6), "fit", 0.004)
    loaded = model.with_token_overhead(0.0005, "HTTP streaming")
    assert loaded.prefill_s(32, 32 * 32) == pytest.approx(model.prefill_s(32, 32 * 32) + 0.0005)
    assert loaded.decode_s(8, 400) == pytest.approx(model.decode_s(8, 400) + 8 * 0.0005)
    assert loaded.decode_multi == model.decode_multi and "HTTP streaming 0.50 ms/token" in loaded.source
    with pytest.raises(ServingError, match="non-negative"):
        model.with_token_overhead(-1e-3)


def test_profile_files_carry_the_engine_limits(tmp_path):
    model = LatencyModel((0.01, 1e-4, 0.0), (0.02, 1e-3, 1e-6))
    path = save_samples([], model, tmp_path / "p.json", extra={"limits": {"max_num_seqs": 8, "max_prefill_seqs": 1}})
    assert load_engine_limits(path) == EngineLimits(max_num_seqs=8, max_prefill_seqs=1)
    assert load_engine_limits(save_samples([], model, tmp_path / "old.json")) is None
    bad = save_samples([], model, tmp_path / "bad.json", extra={"limits": {"max_num_seqz": 8}})
    with pytest.raises(ServingError, match="unknown or missing field"):
        load_engine_limits(bad)


def test_a_host_whose_share_moves_during_the_run_slows_the_steps_then():
    requests = [Request(i, 0.0, 10, 20) for i in range(2)]
    shares = CpuShares((0.5, 0.5))

    def duration(**options):
        sim = Simulation([instance("a", 1.0)], make_scheduler("round_robin"), SLO(10, 1), cpu_shares=shares, **options)
        return sim.run(requests).report.duration_s

    steady = duration()
    assert duration(share_over_time=lambda now: 1.0) == pytest.approx(steady)
    assert duration(share_over_time=lambda now: 0.5) == pytest.approx(2 * steady, rel=0.02)
    with pytest.raises(ServingError, match="give cpu_shares"):
        Simulation([instance("a", 1.0)], make_scheduler("round_robin"), SLO(), share_over_time=lambda now: 1.0)


def test_step_cpu_factors_come_from_the_workers_timelines_by_how_many_were_busy():
    model = LatencyModel((0.01, 0.0, 0.0), (0.02, 0.0, 0.0))  # every decode step 20 ms of CPU, alone

    def steps(start: float, n: int, cpu: float, width: float = 0.05) -> list[TimedStep]:
        return [TimedStep("decode", start + i * width, start + (i + 1) * width, cpu, 1, 10) for i in range(n)]

    # a runs alone for 20 steps at the profile's CPU, then beside b for 20 steps at 1.5x; b runs only beside a
    a = steps(0.0, 20, 0.020) + steps(1.0, 20, 0.030)
    b = steps(1.0, 20, 0.040)
    assert busy_counts([a, b]) == [[1] * 20 + [2] * 20, [2] * 20]
    factors = cpu_factors([a, b], [model, model])
    assert factors[0] == pytest.approx((1.0, 1.5))
    assert factors[1] == pytest.approx((2.0, 2.0))  # never alone: the nearest count measured stands in
    assert TimedStep.from_row(["decode", 0, 1, 0.5, 2, 30, 40, True]).repacked
    with pytest.raises(ServingError, match="calibration requests"):
        cpu_factors([a[:5], b], [model, model])
    with pytest.raises(ServingError, match="fields"):
        TimedStep.from_row(["decode", 0, 1])


def test_simulated_steps_take_their_instance_s_cpu_factor_for_the_instances_busy():
    requests = [Request(i, 0.0, 10, 20) for i in range(4)]
    specs = [instance("a", 1.0), instance("b", 1.0)]

    def run(**options):
        return Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), **options).run(requests)

    plain = run()
    # b's steps cost twice their profile's CPU beside a busy a (and as much as profiled alone); a's are unchanged
    scaled = run(cpu_factors={"b": (1.0, 2.0)})
    assert scaled.cpu_s["a"] == pytest.approx(plain.cpu_s["a"])
    a_spans = [(start, end) for name, _, start, end, *_ in scaled.steps if name == "a"]
    doubled = []
    for name, kind, start, _, cpu, seqs, context, _ in scaled.steps:
        if name == "b":
            profiled = specs[1].latency.prefill_s(context, context**2) if kind == "prefill" else (
                specs[1].latency.decode_s(seqs, context))  # fmt: skip
            beside_a = any(s <= start < e for s, e in a_spans)
            assert cpu == pytest.approx(profiled * (2.0 if beside_a else 1.0))
            doubled.append(beside_a)
    assert any(doubled) and not all(doubled)  # b's last steps run after a has finished: alone, as profiled
    assert scaled.busy_s["b"] == pytest.approx(scaled.cpu_s["b"])  # CPU, not shares: no cpu_shares given
    with pytest.raises(ServingError, match="not in the deployment"):
        run(cpu_factors={"c": (1.0,)})
    with pytest.raises(ServingError, match="positive finite"):
        run(cpu_factors={"a": (1.0, 0.0)})


def test_shape_factors_measure_step_cpu_by_kind_and_batch_size_and_fill_gaps_from_the_nearest_band():
    model = LatencyModel((0.01, 0.0, 0.0), (0.02, 0.0, 0.0), repack=(0.005, 0.0))  # 10 / 20 ms; re-pack 5 ms

    def step(kind: str, seqs: int, cpu: float, repacked: bool = False) -> TimedStep:
        return TimedStep(kind, 0.0, cpu, cpu, seqs, 10 if kind == "prefill" else 10 * seqs, 0, repacked)

    steps = (
        [step("prefill", 1, 0.012)] * 5  # 1.2x
        + [step("decode", 1, 0.018)] * 6  # B = 1: 0.9x
        + [step("decode", 9, 0.030)] * 5  # B >= 8: 1.5x
        + [step("decode", 9, 0.050, True)] * 5  # re-packed B >= 8: 50 ms over 25 ms: 2.0x
        + [step("decode", 2, 0.040)] * 4  # too few steps to measure the B = 2-3 band on its own
        + [step("decode", 0, 0.001)] * 3  # steps with nothing to decode are not counted
    )
    factors = shape_factors(steps, model)
    assert factors.prefill == pytest.approx(1.2)
    assert factors.decode == pytest.approx((0.9, 0.9, 1.5, 1.5))  # B2-3 -> nearest measured (B1; tie: smaller)
    assert factors.repacked == pytest.approx((2.0, 2.0, 2.0, 2.0))  # only B >= 8 re-packed steps were measured
    assert factors.counts == (5, 6, 4, 0, 5, 0, 0, 0, 5)
    assert factors.factor("decode", 12, True) == pytest.approx(2.0)
    assert factors.factor("decode", 5, False) == pytest.approx(1.5)  # B4-7: the nearest measured band is B8+
    assert "B8+ re-packed 2.00 (5)" in factors.describe()
    # no prefill measured: the instance's overall factor stands in
    only_decode = shape_factors([step("decode", 1, 0.030)] * 5, model)
    assert only_decode.prefill == pytest.approx(1.5) and only_decode.repacked == pytest.approx((1.5,) * 4)
    with pytest.raises(ServingError, match="rehearsal requests"):
        shape_factors(steps[:3], model)
    with pytest.raises(ServingError, match="positive finite"):
        ShapeFactors(1.0, (1.0, 0.0, 1.0, 1.0), (1.0,) * 4)


def test_simulated_steps_take_their_instance_s_factor_for_the_step_s_shape():
    requests = [Request(i, 0.0, 10, 20) for i in range(4)]
    specs = [instance("a", 1.0), instance("b", 1.0)]

    def run(**options):
        return Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), **options).run(requests)

    plain = run()
    # b's prefills cost 3x their profile, its plain decode steps of 2-3 sequences 2x, the rest as profiled
    b = ShapeFactors(3.0, (1.0, 2.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0))
    scaled = run(shape_factors={"b": b})
    assert scaled.cpu_s["a"] == pytest.approx(plain.cpu_s["a"])
    seen = set()
    for name, kind, _, _, cpu, seqs, context, repacked in scaled.steps:
        if name != "b":
            continue
        latency = specs[1].latency
        profiled = latency.prefill_s(context, context**2) if kind == "prefill" else latency.decode_s(seqs, context)
        if kind == "decode" and repacked:
            profiled += latency.repack_s(context)
        expected = 3.0 if kind == "prefill" else 2.0 if (2 <= seqs <= 3 and not repacked) else 1.0
        assert cpu == pytest.approx(profiled * expected)
        seen.add(expected)
    assert seen == {1.0, 2.0, 3.0}
    with pytest.raises(ServingError, match="not in the deployment"):
        run(shape_factors={"c": b})


def test_processor_sharing_lets_a_step_in_flight_follow_the_busy_count():
    # one core for two instances; each request is one 12 ms prefill (10 ms + 0.2 ms x 10 tokens) of CPU. a starts
    # alone at 0, b joins at 6 ms: from then on both run at half a core, and b runs alone once a is done
    requests = [Request(0, 0.0, 10, 1), Request(1, 0.006, 10, 1)]
    specs = [instance("a", 1.0), instance("b", 1.0)]

    def finishes(**options) -> list[float]:
        sim = Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), shared_cores=1, **options)
        return [r.finish_s for r in sim.run(requests).records]

    # the share fixed at each step's start: a alone throughout (12 ms), b at half a core throughout (24 ms)
    assert finishes() == pytest.approx([0.012, 0.030])
    # processor sharing: a 6 ms alone + 6 ms of CPU at half a core = 18 ms; b 6 ms of CPU by then, 6 ms alone after
    assert finishes(processor_sharing=True) == pytest.approx([0.018, 0.024])
    sim = Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), shared_cores=1, processor_sharing=True)
    result = sim.run(requests)
    assert [s[0] for s in result.steps] == ["a", "b"]
    assert [v for s in result.steps for v in s[2:5]] == pytest.approx([0.0, 0.018, 0.012, 0.006, 0.024, 0.012])
    assert result.busy_s == pytest.approx({"a": 0.018, "b": 0.018})
    with pytest.raises(ServingError, match="processor_sharing"):
        Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), processor_sharing=True)


def test_step_noise_draws_each_step_s_cpu_and_time_on_the_core_from_measured_residuals():
    requests = [Request(i, 0.0, 10, 5) for i in range(3)]
    specs = [instance("a", 1.0)]

    def run(**options):
        return Simulation(specs, make_scheduler("round_robin"), SLO(10, 1), shared_cores=1, **options).run(requests)

    plain = run()
    doubled = run(step_noise={"a": [(2.0, 1.0)]})  # every step twice its CPU, on the core as long as its CPU says
    assert doubled.cpu_s["a"] == pytest.approx(2 * plain.cpu_s["a"]) and doubled.busy_s["a"] == pytest.approx(
        2 * plain.busy_s["a"]
    )
    stretched = run(step_noise={"a": [(1.0, 3.0)]}, processor_sharing=True)  # same CPU, 3x the time on the core
    assert stretched.cpu_s["a"] == pytest.approx(plain.cpu_s["a"])
    assert stretched.busy_s["a"] == pytest.approx(3 * plain.busy_s["a"])
    mixed = [run(step_noise={"a": [(0.5, 1.0), (1.5, 1.0)]}, noise_seed=seed).cpu_s["a"] for seed in (0, 0, 1)]
    assert mixed[0] == mixed[1] and 0.5 * plain.cpu_s["a"] < mixed[0] < 1.5 * plain.cpu_s["a"]  # seeded draws
    with pytest.raises(ServingError, match="not in the deployment"):
        run(step_noise={"b": [(1.0, 1.0)]})
    with pytest.raises(ServingError, match="positive finite"):
        run(step_noise={"a": [(1.0, 0.0)]})


def test_pooled_step_cpu_separates_each_instance_s_shape_factors_from_the_host_s_busy_factor():
    model = LatencyModel((0.01, 0.0, 0.0), (0.02, 0.0, 0.0))  # every decode step 20 ms of CPU, alone

    def steps(start: float, cpus_and_seqs: list[tuple[float, int]], width: float) -> list[TimedStep]:
        return [
            TimedStep("decode", start + i * width, start + (i + 1) * width, cpu, seqs, 10 * seqs)
            for i, (cpu, seqs) in enumerate(cpus_and_seqs)
        ]

    # truth: a's batches of one cost 1.0x its profile and of nine 1.5x; b's batches of one 1.2x; and on this host any
    # step costs 1.25x more while both instances are busy. a runs alone, then beside b; b runs beside a, then alone.
    # A ratio per instance and shape alone would mix the two: a's B1 steps would read 1.125x, b's 1.3x
    busy = 1.25
    a = steps(0.0, [(0.020, 1)] * 10 + [(0.030, 9)] * 10, 0.05)
    a += steps(10.0, [(0.020 * busy, 1)] * 10 + [(0.030 * busy, 9)] * 10, 0.05)
    b = steps(10.0, [(0.024 * busy, 1)] * 10, 0.1) + steps(20.0, [(0.024, 1)] * 20, 0.05)
    estimate = estimate_step_cpu(["a", "b"], [a, b], [model, model])
    assert estimate.busy_steps == (40, 30)  # normalised to 1 at the busy count seen most often: one busy
    assert estimate.busy == pytest.approx((1.0, busy), rel=1e-4)
    assert estimate.shapes["a"].factor("decode", 1, False) == pytest.approx(1.0, rel=1e-4)
    assert estimate.shapes["a"].factor("decode", 9, False) == pytest.approx(1.5, rel=1e-4)
    assert estimate.shapes["b"].factor("decode", 1, False) == pytest.approx(1.2, rel=1e-4)
    assert estimate.overall["b"] == pytest.approx((10 * 0.024 * busy + 20 * 0.024) / (30 * 0.020))
    assert estimate.simulation_options()["cpu_factors"] == {"a": estimate.busy, "b": estimate.busy}
    assert "by busy instances 1: 1.00 (40), 2: 1.25 (30)" in estimate.describe()
    # the share of a core the steps got: CPU over wall, by busy instances (a alone: 20 ms in 50 ms steps)
    alone = (10 * 0.020 + 10 * 0.030 + 20 * 0.024) / (40 * 0.05)
    beside = (10 * 0.020 + 10 * 0.030 + 10 * 0.024) * busy / (20 * 0.05 + 10 * 0.1)
    assert estimate.shares == pytest.approx((alone, beside))
    assert estimate.simulation_options()["cpu_shares"].shares == pytest.approx((alone, beside))
    # a step that straddles a change of the busy count splits its wall time between the counts
    long, short = TimedStep("decode", 0.0, 1.0, 0.5, 1, 10), TimedStep("decode", 0.25, 0.5, 0.1, 1, 10)
    assert wall_by_busy([[long], [short]]) == [[[0.75, 0.25]], [[0.0, 0.25]]]
    # residuals: each step's CPU over the estimate's and its wall over CPU / share (a's B1 steps alone: exact, 2.5x)
    assert estimate.residuals["a"][0] == pytest.approx((1.0, 0.05 * alone / 0.020))
    assert len(estimate.residuals["b"]) == 30
    with pytest.raises(ServingError, match="fewer than 5 steps"):
        estimate_step_cpu(["a", "b"], [a, b[:3]], [model, model])
    with pytest.raises(ServingError, match="2 names, 1 timelines"):
        estimate_step_cpu(["a", "b"], [a], [model])
    # a scheduler's latency model scaled to the CPU its steps take in service
    fitted = LatencyModel((0.01, 0.001, 1e-6), (0.02, 0.002, 1e-5), "fit", 0.003, (0.004, 1e-4))
    doubled = fitted.scaled(2.0, "in service")
    assert doubled.prefill_s(30, 900) == pytest.approx(2 * fitted.prefill_s(30, 900))
    assert doubled.decode_s(3, 90) == pytest.approx(2 * fitted.decode_s(3, 90))
    assert doubled.repack_s(90) == pytest.approx(2 * fitted.repack_s(90)) and "x 2.000 (in service)" in doubled.source
    with pytest.raises(ServingError, match="positive finite"):
        fitted.scaled(0.0)


def test_a_warming_up_worker_answers_503_then_serves_with_its_memory_kept(engine):
    from trex.workloads.serving import host_memory

    assert host_memory.keep_freed_memory() is True  # glibc here: TinyEngine applied it already (idempotent)
    gate = threading.Event()
    warmed: list[int] = []

    class GatedEngine(BatchingEngine):
        def warm_up(self, context: int, max_rounds: int = 6) -> list[int]:  # held until the test saw the 503
            gate.wait(30)
            warmed.append(context)
            return super().warm_up(context, max_rounds)

    async def scenario():
        worker = Worker(engine, max_num_seqs=3)
        worker.batching = GatedEngine(engine.model, engine.torch, max_num_seqs=3, threads=1, warm_up_context=9)
        worker.batching.start()
        server = await worker.start()
        endpoint = Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            early = await request_json(endpoint, "GET", "/health", timeout=5)
            gate.set()
            await asyncio.get_running_loop().run_in_executor(None, worker.batching.ready.wait, 30)
            later = await request_json(endpoint, "GET", "/health", timeout=5)
            payload = {"prompt": "a b c", "max_tokens": 4}
            served = await request_json(endpoint, "POST", "/v1/completions", payload, timeout=30)
        finally:
            server.close()
            worker.close()
        return early, later, served

    early, later, served = asyncio.run(scenario())
    assert early == (503, {"status": "warming_up", "model": "tiny"})
    assert later[0] == 200 and later[1]["steps"] == {"prefill": 0, "decode": 0}  # the warm-up is not a served step
    assert served[0] == 200 and len(served[1]["choices"][0]["text"].split()) == 4
    assert warmed == [9]
    rounds = later[1]["warm_up_faults"]  # faults per warm-up round: it stops once the heap stops growing
    assert 2 <= len(rounds) <= 6 and (len(rounds) == 6 or rounds[-1] <= 0.01 * rounds[0])
    with pytest.raises(ServingError, match="warm-up context"):
        BatchingEngine(engine.model, engine.torch, warm_up_context=-1)
