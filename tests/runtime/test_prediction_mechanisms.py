"""What the runtime's prediction knows about the program its ranks run: the data-parallel collectives they issue
(how many, which kind), the cores they share, and the activations of bf16 autocast."""

from __future__ import annotations

import dataclasses

import pytest

from trex.cost_model.catalog import get_cluster
from trex.cost_model.cluster import MeasuredCollective
from trex.cost_model.model_spec import spec_from_config
from trex.cost_model.step import estimate_step
from trex.models import build_model, load_config
from trex.runtime.prediction import predict, reduction_calls
from trex.runtime.trainer import TrainJob, execute

MODEL = "tiny-qwen3-moe"
SHAPE = {"seq": 16, "gbs": 8, "mbs": 2}


def plan_of(text: str, nproc: int = 4, **fields):
    return TrainJob.create(MODEL, text, nproc, **SHAPE, steps=1, verbose=False, **fields).parallel


def test_the_runtime_plan_says_its_zero_0_to_2_hide_no_reduction():
    for text in ("zero=0", "zero=1", "zero=2"):
        plan = plan_of(text)
        assert not plan.overlap_grad_reduce and not plan.overlap_param_gather, text
    assert plan_of("zero=3").overlap_param_gather  # FSDP2 prefetches


def test_reduction_calls_count_what_the_runtime_issues():
    config = load_config(MODEL)
    model = build_model(config)
    experts = sum(
        1 for name, _ in model.named_parameters() if name.endswith(("experts.gate_up_proj", "experts.down_proj"))
    )
    dense = sum(1 for _ in model.parameters()) - experts
    assert experts == 2 * config.num_hidden_layers
    assert reduction_calls(config, plan_of("zero=1")) == (dense, experts)  # one collective per tensor
    # FSDP2: one unit per decoder layer plus the root; experts are their own units only under ep
    assert reduction_calls(config, plan_of("zero=3")) == (config.num_hidden_layers + 1, 0)
    assert reduction_calls(config, plan_of("ep=2,zero=3")) == (config.num_hidden_layers + 1, config.num_hidden_layers)


def _cpu_cluster(latency_us: float, cores: int | None):
    """A CPU cluster whose gloo tier carries a measured line per kind (as `trex calibrate` writes it)."""
    base = get_cluster("cpu")
    tier = dataclasses.replace(
        base.tiers[0],
        collectives=tuple(
            MeasuredCollective(kind, group, latency_us, 1.0)
            for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
            for group in (2, 4)
        ),
    )
    return dataclasses.replace(base, tiers=(tier,), cores=cores)


def test_each_issued_collective_pays_its_latency():
    spec = spec_from_config(load_config(MODEL), MODEL)
    cluster = _cpu_cluster(1000.0, None).sized(4)
    plan = plan_of("zero=0")
    bucketed = estimate_step(spec, cluster, dataclasses.replace(plan, grad_reduce_calls=None))
    per_tensor = estimate_step(spec, cluster, dataclasses.replace(plan, grad_reduce_calls=(30, 8)))
    # 30 + 8 calls instead of 1 + 1: 36 more latencies of 1 ms (the bytes are the same)
    extra = per_tensor.breakdown.dp_sync_s - bucketed.breakdown.dp_sync_s
    assert extra == pytest.approx(36 * 1e-3, rel=1e-6)
    # a ZeRO-1 that all-reduces pays the all-reduce's line, not the reduce-scatter's
    zero1 = plan_of("zero=1")
    slow_reduce = dataclasses.replace(
        cluster,
        tiers=(
            dataclasses.replace(
                cluster.tiers[0],
                collectives=tuple(
                    dataclasses.replace(m, latency_us=5000.0) if m.kind == "all_reduce" else m
                    for m in cluster.tiers[0].collectives
                ),
            ),
        ),
    )
    scatter = estimate_step(spec, slow_reduce, zero1).breakdown.dp_sync_s
    reduce = estimate_step(spec, slow_reduce, dataclasses.replace(zero1, grad_reduce_op="all_reduce")).breakdown
    assert reduce.dp_sync_s == pytest.approx(scatter + 2 * 4e-3, rel=1e-6)


def test_ranks_sharing_cores_compute_slower_and_gpus_do_not_change():
    spec = spec_from_config(load_config(MODEL), MODEL)
    plan = plan_of("zero=0")
    alone = estimate_step(spec, _cpu_cluster(100.0, 4).sized(4), plan).breakdown
    shared = estimate_step(spec, _cpu_cluster(100.0, 2).sized(4), plan).breakdown
    assert shared.compute_s == pytest.approx(2 * alone.compute_s, rel=1e-9)
    assert shared.optimizer_s == pytest.approx(2 * alone.optimizer_s, rel=1e-9)
    assert shared.dp_sync_s == pytest.approx(alone.dp_sync_s, rel=1e-9)  # measured collectives already share
    h100 = get_cluster("h100", 8)
    assert h100.cores is None and all(not t.collectives for t in h100.tiers)


@pytest.mark.parametrize("model", [MODEL, "tiny-deepseek-v3"])
def test_bf16_activations_of_one_rank_equal_the_prediction(model):
    job = TrainJob.create(model, "", 1, seq=16, gbs=2, mbs=2, steps=1, precision="bf16", verbose=False)
    result = execute(job)
    predicted = predict(load_config(model), job.parallel, 1)
    assert "bf16 autocast" in predicted["activation_model"]
    assert result["memory_by_rank"][0]["activations"] == predicted["memory_bytes"]["activations"]
    fp32 = predict(load_config(model), TrainJob.create(model, "", 1, seq=16, gbs=2, mbs=2, steps=1).parallel, 1)
    assert predicted["memory_bytes"]["activations"] > fp32["memory_bytes"]["activations"]  # bf16 copies of weights


def test_tp_replicated_gradients_are_summed_every_micro_batch():
    from trex.runtime.prediction import tp_replicated_gradients

    config = load_config(MODEL)
    plan = plan_of("tp=2")
    calls, nbytes = tp_replicated_gradients(config, plan)
    # per layer: input and post-attention norms, q/k norms, the router; plus the final norm
    assert calls == 5 * config.num_hidden_layers + 1
    hidden, experts, head_dim = config.hidden_size, config.num_experts, config.head_dim
    per_layer = 2 * hidden + 2 * head_dim + hidden * experts
    assert nbytes == 4 * (config.num_hidden_layers * per_layer + hidden)
    spec = spec_from_config(config, MODEL)
    cluster = _cpu_cluster(1000.0, None).sized(4)
    without = estimate_step(spec, cluster, plan).breakdown.dp_sync_s
    with_sync = estimate_step(spec, cluster, dataclasses.replace(plan, tp_grad_sync=(calls, nbytes))).breakdown
    # each micro-batch's backward: `calls` all-reduces of 1 ms latency (plus their bytes at 1 GB/s)
    assert with_sync.dp_sync_s - without == pytest.approx(plan.microbatches * (calls * 1e-3 + nbytes / 1e9), rel=1e-6)
    # an eager rank sums them in its backward graph with the dp reduction: once per step, not per micro-batch
    once = dataclasses.replace(plan, tp_grad_sync=(calls, nbytes), tp_grad_sync_per_step=True)
    assert estimate_step(spec, cluster, once).breakdown.dp_sync_s - without == pytest.approx(
        calls * 1e-3 + nbytes / 1e9, rel=1e-6
    )


def test_tp_partial_gradient_sums_are_priced_where_the_runtime_issues_them():
    """Eager ZeRO-0/1: once per step, whole (`ReducedGradient`); eager ZeRO-2 with replicas: every micro-batch on
    the reduce-scattered shard; FSDP2: once per step on its shard; a compiled rank: its hook, every micro-batch."""
    from trex.runtime.prediction import tp_gradient_sums, tp_replicated_gradients
    from trex.runtime.run_plan import resolve_plan

    config = load_config(MODEL)
    calls, nbytes = tp_replicated_gradients(config, plan_of("tp=2"))

    def sums(text: str, compiled: bool = False) -> tuple:
        plan = resolve_plan(text, config, 4, seq=16, gbs=8, mbs=1)
        got = tp_gradient_sums(config, plan, compiled)
        return got["tp_grad_sync"], got["tp_grad_sync_per_step"]

    assert sums("tp=2,zero=1") == ((calls, nbytes), True)
    assert sums("tp=2,zero=2") == ((calls, nbytes / 2), False)
    assert sums("tp=2,zero=3") == ((calls, nbytes / 2), True)
    assert sums("tp=2,zero=1", compiled=True) == ((calls, nbytes), False)


@pytest.mark.slow  # one start of 2 gloo ranks, 4 plans (~1.5 min on the loaded 2-core machine)
def test_bf16_activations_on_two_ranks_equal_the_prediction():
    from trex.runtime.launcher import launch_function, run_jobs

    plans = ["zero=1", "zero=3", "ep=2", "ep=2,zero=3"]
    # one micro-batch per rank: under ep the ranks together receive what they send, so the mean is exact
    jobs = [
        TrainJob.create(MODEL, plan, 2, seq=16, gbs=2, mbs=1, steps=1, precision="bf16", verbose=False)
        for plan in plans
    ]
    results = launch_function(run_jobs, (jobs,), 2)[0]
    for plan, job, result in zip(plans, jobs, results):
        predicted = predict(load_config(MODEL), job.parallel, 2)["memory_bytes"]["activations"]
        measured = [m["activations"] for m in result["memory_by_rank"]]
        assert sum(measured) / len(measured) == predicted, (plan, measured, predicted)
