"""Step estimates: consistent outputs, the right direction for every knob, clear infeasibility."""

import pytest

from trex.cost_model.catalog import get_cluster
from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import InfeasiblePlan, ParallelConfig
from trex.cost_model.step import estimate_step

DSV3 = get_model_spec("deepseek-v3")
H100 = get_cluster("h100", 1024)
PLAN = ParallelConfig(
    tp=2,
    pp=8,
    vpp=4,
    ep=64,
    seq=4096,
    gbs=8192,
    precision="fp8",
    recompute="selective:mla_up_proj+mlp",
    dispatcher="deepep",
    layers_per_chunk=(1,) + (2,) * 30 + (0,),
)


def _with(**changes):
    return ParallelConfig(**{**PLAN.to_dict(), **changes})


@pytest.fixture(scope="module")
def estimate():
    return estimate_step(DSV3, H100, PLAN)


def test_breakdown_adds_up_to_the_step_time(estimate):
    b = estimate.breakdown
    assert b.compute_s + b.exposed_comm_s + b.host_wait_s + b.bubble_s + b.optimizer_s == pytest.approx(
        estimate.step_time_s, rel=1e-6
    )
    assert 0 < b.recompute_s < b.compute_s


def test_throughput_metrics_are_consistent(estimate):
    assert estimate.tokens_per_s == pytest.approx(8192 * 4096 / estimate.step_time_s)
    assert estimate.model_tflops_per_device == pytest.approx(
        estimate.flops_per_token * estimate.tokens_per_s_per_device / 1e12
    )
    assert estimate.mfu == pytest.approx(estimate.model_tflops_per_device * 1e12 / 989.4e12)
    assert estimate.hfu > estimate.mfu  # recompute and duplicated down-projections are executed, not counted


def test_json_shape_has_what_the_cli_promises(estimate):
    data = estimate.to_dict()
    for key in (
        "step_time_s",
        "tokens_per_s_per_device",
        "model_tflops_per_device",
        "mfu",
        "mfu_6n",
        "memory_per_device_gib",
        "flops_per_token",
        "breakdown",
    ):
        assert key in data
    assert set(data["breakdown"]) >= {"compute", "exposed_communication", "bubble", "optimizer"}


def test_fp8_is_faster_than_bf16(estimate):
    bf16 = estimate_step(DSV3, H100, _with(precision="bf16"))
    assert bf16.step_time_s > estimate.step_time_s
    # the known optimism of FP8 pricing travels with every FP8 estimate, and only with those
    assert any("FP8 steps are priced optimistically" in note for note in estimate.notes)
    assert not any("priced optimistically" in note for note in bf16.notes)


def test_fp8_recipes_are_priced_by_what_their_kernels_do():
    from trex.cost_model.layer_cost import CostContext, layer_cost

    llama = get_model_spec("llama3-70b")
    cluster = get_cluster("h100", 64)
    plan = ParallelConfig(tp=4, pp=8, vpp=5, dp=2, seq=8192, gbs=128, precision="fp8", recompute="none")
    layer = llama.layers[0]

    def cost(recipe):
        return layer_cost(
            layer,
            llama.hidden_size,
            CostContext.of(ParallelConfig(**{**plan.to_dict(), "fp8_recipe": recipe}), cluster),
        )

    delayed, current, block = cost("delayed"), cost("tensorwise"), cost("blockwise")
    # per-tensor recipes run the gradient GEMMs with split accumulation; blockwise is at its own ceiling in every pass
    assert delayed.forward_s == pytest.approx(block.forward_s)
    assert delayed.backward_s > 1.08 * block.backward_s
    # current scaling reads each tensor once more for its amax and all-reduces it over TP
    assert current.forward_s > delayed.forward_s and current.backward_s > delayed.backward_s
    assert current.backward_s < 1.1 * delayed.backward_s  # memory passes, small next to the GEMMs
    step = estimate_step(llama, cluster, ParallelConfig(**{**plan.to_dict(), "fp8_recipe": "tensorwise"}))
    assert any(note.startswith("FP8 recipe tensorwise: per-tensor current scaling") for note in step.notes)
    import typing

    from trex.cost_model.caveats import FP8_RECIPE_PRICING
    from trex.cost_model.parallel import Fp8Recipe

    assert set(FP8_RECIPE_PRICING) == set(
        typing.get_args(Fp8Recipe)
    )  # every recipe the plan accepts says how it is priced
    with pytest.raises(InfeasiblePlan, match="fp8_recipe='mxfp4': use one of delayed, tensorwise, blockwise"):
        estimate_step(llama, cluster, ParallelConfig(**{**plan.to_dict(), "fp8_recipe": "mxfp4"}))


def test_estimates_whose_experts_get_few_rows_say_they_are_optimistic():
    # Qwen3-235B at 4K tokens: EP8 gives each of 16 local experts 1024 rows (tp2) or 512 (tp4) per micro-batch, the regime
    # where published runs took ~2x the priced time; EP32 gives 4096, priced within ~20 %
    qwen = get_model_spec("qwen3-235b-a22b")
    cluster = get_cluster("h100", 256)

    def notes(**degrees):
        return [
            n
            for n in estimate_step(qwen, cluster, ParallelConfig(**degrees, seq=4096, gbs=2048)).notes
            if "rows per micro-batch" in n
        ]

    (note,) = notes(tp=4, pp=8, vpp=4, ep=8)
    assert "each local expert gets 512 rows" in note and "optimistic" in note
    assert notes(tp=2, pp=8, vpp=4, ep=32) == []
    dense = estimate_step(
        get_model_spec("llama3-70b"), get_cluster("h100", 64), ParallelConfig(tp=4, pp=8, seq=8192, gbs=128)
    )
    assert not any("rows per micro-batch" in n for n in dense.notes)


def test_full_recompute_costs_time_and_saves_memory(estimate):
    full = estimate_step(DSV3, H100, _with(recompute="full"))
    assert full.step_time_s > estimate.step_time_s and full.memory.activations < estimate.memory.activations


def test_overlapping_expert_all_to_alls_hides_communication(estimate):
    overlapped = estimate_step(DSV3, H100, _with(ep_comm_overlap=True))
    assert overlapped.breakdown.exposed_comm_s < estimate.breakdown.exposed_comm_s
    assert overlapped.step_time_s < estimate.step_time_s


def test_node_deduplicating_dispatch_beats_plain_all_to_all_across_nodes(estimate):
    assert estimate_step(DSV3, H100, _with(dispatcher="alltoall")).step_time_s > estimate.step_time_s


def test_load_imbalance_slows_the_step(estimate):
    assert estimate_step(DSV3, H100, _with(moe_imbalance=1.3)).step_time_s > estimate.step_time_s


def test_more_data_parallel_replicas_raise_throughput():
    spec, plan = get_model_spec("gpt-175b"), ParallelConfig(tp=8, pp=8, vpp=3, seq=2048, gbs=512)
    small = estimate_step(spec, get_cluster("a100", 64), plan)
    large = estimate_step(spec, get_cluster("a100", 256), plan)
    assert large.tokens_per_s > 3 * small.tokens_per_s


def test_interleaving_shrinks_the_bubble():
    spec, cluster = get_model_spec("gpt-175b"), get_cluster("a100", 64)
    plain = estimate_step(spec, cluster, ParallelConfig(tp=8, pp=8, vpp=1, seq=2048, gbs=64))
    interleaved = estimate_step(spec, cluster, ParallelConfig(tp=8, pp=8, vpp=3, seq=2048, gbs=64))
    assert interleaved.breakdown.bubble_s < plain.breakdown.bubble_s / 2


def test_inconsistent_plan_raises_with_every_violation():
    with pytest.raises(InfeasiblePlan) as error:
        estimate_step(DSV3, H100, _with(tp=3, ep=7))
    message = str(error.value)
    assert "tp*pp*cp = 3*8*1 = 24 does not divide the 1024 devices" in message


def test_a_plan_that_does_not_fit_reports_the_shortfall_per_component():
    estimate = estimate_step(
        get_model_spec("gpt-1t"), get_cluster("a100", 8), ParallelConfig(tp=8, seq=2048, gbs=8, recompute="full")
    )
    assert not estimate.feasible
    (problem,) = estimate.memory_violations()
    assert "exceeds the 77.0 GiB usable on a100" in problem and "optimizer" in problem
    assert estimate.to_dict()["feasible"] is False


def test_fp8_on_a100_is_infeasible():
    with pytest.raises(InfeasiblePlan, match="fp8 is not supported by a100"):
        estimate_step(
            get_model_spec("gpt-22b"), get_cluster("a100", 8), ParallelConfig(tp=8, gbs=4, mbs=4, precision="fp8")
        )


def test_deepseek_v4_pro_on_cloudmatrix_is_priced():
    spec = get_model_spec("deepseek-v4-pro")
    estimate = estimate_step(
        spec, get_cluster("cloudmatrix384", 1024), ParallelConfig(tp=4, pp=8, vpp=2, ep=64, seq=4096, gbs=1024)
    )
    assert 0 < estimate.mfu < 1 and estimate.memory.total > 0


def _exposed_expert_traffic(cluster_name: str, overlap: bool) -> tuple[float, float]:
    from trex.cost_model.layer_cost import CostContext, layer_cost

    spec = get_model_spec("deepseek-v4-pro")
    plan = ParallelConfig(
        tp=1, pp=16, ep=64, seq=4096, gbs=1024, dispatcher="deepep", ep_comm_overlap=overlap
    ).with_devices(1024)
    cost = layer_cost(
        spec.layer_kinds["csa+moe"],
        spec.hidden_size,
        CostContext.of(plan, get_cluster(cluster_name, 1024), detail=True),
    )
    (ep,) = [op for op in cost.ops if op.category == "ep_comm"]
    return ep.forward_s + ep.backward_s, cost.compute_s


def test_v4_expert_traffic_hides_behind_compute_on_the_unified_bus_but_not_over_h800_infiniband():
    # DeepSeek-V4 report Sec. 3.1: EP traffic hides when compute/bandwidth <= 2d FLOP/byte; the 910C on
    # UB (~1.9K FLOP/byte) passes for V4-Pro (d = 3072), an H800 over IB (~20-25K) does not.
    exposed_ub, _ = _exposed_expert_traffic("cloudmatrix384", overlap=True)
    exposed_ib, _ = _exposed_expert_traffic("h800", overlap=True)
    assert exposed_ub == 0.0
    assert exposed_ib > 0.0
    assert _exposed_expert_traffic("cloudmatrix384", overlap=False)[0] > 0.0


@pytest.mark.parametrize("zero, grows", [(1, False), (2, True), (3, True)])
def test_sharded_gradients_are_reduced_once_per_micro_batch(zero, grows):
    # Without overlap every gradient reduce is exposed: ZeRO-0/1 accumulate the micro-batches locally and
    # reduce once per step; ZeRO-2/3 keep only a shard, so each micro-batch's gradients are reduce-scattered.
    def dp_sync(gbs):
        plan = _with(zero=zero, gbs=gbs, overlap_grad_reduce=False, overlap_param_gather=False)
        return estimate_step(DSV3, H100, plan).breakdown.dp_sync_s

    one, four = dp_sync(64 * 8), dp_sync(64 * 32)  # 8 and 32 micro-batches per data-parallel rank
    if zero == 3:  # its parameter gathers are per micro-batch too: everything scales with the micro-batches
        assert four == pytest.approx(4 * one, rel=1e-9)
    elif grows:  # the once-per-step parameter gather (bf16) is small beside the per-micro-batch fp32 gradients
        assert 3 * one < four < 4 * one
    else:
        assert four == pytest.approx(one, rel=1e-9)


def _exposure(zero, *, m=4, prefetch=True, overlap_reduce=True, grad_sync=1.0, gather=0.5, forward=0.6, backward=1.2):
    from trex.cost_model.step import data_parallel_exposure

    plan = _with(zero=zero, gbs=64 * m, overlap_param_gather=prefetch, overlap_grad_reduce=overlap_reduce).with_devices(
        1024
    )
    assert plan.microbatches == m
    return data_parallel_exposure(plan, grad_sync, gather, forward, backward)


def test_zero1_reduces_once_under_the_last_backward_and_gathers_under_the_next_forward():
    assert _exposure(1) == pytest.approx((0.0, 1.5))  # 1.0 under 1.2, 0.5 under 0.6
    assert _exposure(1, forward=0.2, backward=0.7) == pytest.approx((0.3 + 0.3, 1.5))
    assert _exposure(1, prefetch=False, overlap_reduce=False) == pytest.approx((1.5, 1.5))


def test_zero2_reduce_scatters_every_micro_batch_under_the_backwards():
    # 4 reduce-scatters (4.0 s) under 4 backwards (4.8 s); one gather under the next forward
    assert _exposure(2) == pytest.approx((0.0, 4.5))
    assert _exposure(2, backward=0.9) == pytest.approx((0.4, 4.5))


def test_zero3_backward_gathers_share_the_backwards_with_the_reduce_scatters():
    # forwards: 4 gathers (2.0 s) under 2.4 s -> hidden; backwards: 4 gathers + 4 reduce-scatters (6.0 s)
    # under 4.8 s -> 1.2 s exposed. A backward gather is prefetched under the backward, not left exposed.
    assert _exposure(3) == pytest.approx((1.2, 8.0))  # total: 4 reduce-scatters + 8 gathers
    assert _exposure(3, forward=0.4) == pytest.approx((0.4 + 1.2, 8.0))
    assert _exposure(3, backward=2.0) == pytest.approx((0.0, 8.0))
    # without prefetching every gather waits in line; the reduce-scatters still overlap the backwards
    assert _exposure(3, prefetch=False) == pytest.approx((4.0 + 0.0, 8.0))


def test_hiding_the_all_to_all_costs_the_compute_beside_it_the_sms_it_holds():
    from dataclasses import replace

    from trex.cost_model.layer_cost import CostContext, layer_cost

    spec = get_model_spec("qwen3-235b-a22b")
    plan = ParallelConfig(tp=2, pp=8, vpp=4, ep=32, seq=4096, gbs=2048, dispatcher="deepep").with_devices(256)
    cluster = get_cluster("h100", 256)
    layer = spec.layers[0]

    def cost(overlap, cl):
        return layer_cost(
            layer, spec.hidden_size, CostContext.of(replace(plan, ep_comm_overlap=overlap), cl, detail=True)
        )

    blocking, hidden = cost(False, cluster), cost(True, cluster)
    assert cluster.device.comm_units == 20  # Megatron-Core's DeepEP SM default
    moved = blocking.comm_s - hidden.comm_s  # all-to-all time now under another micro-batch's compute
    assert moved > 0
    slowed = hidden.compute_s - blocking.compute_s
    assert slowed == pytest.approx(moved * 20 / 132)
    (share,) = [op for op in hidden.ops if op.category == "overlap"]
    assert share.forward_s + share.backward_s == pytest.approx(slowed)
    # a device whose communication holds no compute units hides it for free
    free = cluster.with_device(replace(cluster.device, comm_units=0.0))
    assert cost(True, free).compute_s == pytest.approx(blocking.compute_s)


def _llama_layer(tp_comm_overlap, detail=True, **plan_fields):
    from trex.cost_model.layer_cost import CostContext, layer_cost

    spec = get_model_spec("llama3-70b")
    plan = ParallelConfig(
        tp=4,
        pp=8,
        vpp=5,
        seq=8192,
        gbs=256,
        precision="bf16",
        recompute="none",
        tp_comm_overlap=tp_comm_overlap,
        **plan_fields,
    ).with_devices(64)
    ctx = CostContext.of(plan, get_cluster("h100", 64), detail=detail)
    return spec, ctx, layer_cost(spec.layers[0], spec.hidden_size, ctx)


def test_tp_overlap_runs_the_forward_gemms_as_one_sub_gemm_per_peer():
    spec, ctx, blocking = _llama_layer(False)
    _, _, ring = _llama_layer(True)
    device, tokens = ctx.device, ctx.tokens
    fc1 = next(lin for lin in spec.layers[0].linears if lin.name == "mlp.fc1")
    fc2 = next(lin for lin in spec.layers[0].linears if lin.name == "mlp.fc2")
    n1, k2 = fc1.out_features / 4, fc2.in_features / 4
    by_name = {op.name: op for op in ring.ops}
    # column-parallel fc1: forward in 4 sub-GEMMs of tokens/4 rows; data gradient whole (bulk overlap)
    assert by_name["mlp.fc1"].forward_s == pytest.approx(4 * device.gemm_time(tokens / 4, n1, fc1.in_features, "bf16"))
    wgrad1 = device.gemm_time(fc1.in_features, n1, tokens, "bf16", 1, ctx.wgrad_out_bytes)
    assert by_name["mlp.fc1"].backward_s == pytest.approx(
        device.gemm_time(tokens, fc1.in_features, n1, "bf16") + wgrad1
    )
    # row-parallel fc2: the data gradient follows the all-gather of the incoming gradient, in 4 pieces too
    wgrad2 = device.gemm_time(k2, fc2.out_features, tokens, "bf16", 1, ctx.wgrad_out_bytes)
    assert by_name["mlp.fc2"].backward_s == pytest.approx(
        4 * device.gemm_time(tokens / 4, k2, fc2.out_features, "bf16") + wgrad2
    )
    # smaller GEMMs fill the device less: the GEMMs get slower, the collectives disappear
    assert ring.forward_s > blocking.forward_s
    assert blocking.comm_s > 0 and ring.comm_s == pytest.approx(0.0)


def test_tp_overlap_window_is_the_same_with_and_without_the_per_op_detail():
    # the step estimate prices layers without per-op detail; `explain` with it: both must hide the same
    _, _, detailed = _llama_layer(True, detail=True)
    _, _, plain = _llama_layer(True, detail=False)
    assert detailed.tp_gemm_forward_s > 0
    assert plain.tp_gemm_forward_s == pytest.approx(detailed.tp_gemm_forward_s)
    assert (plain.comm_forward_s, plain.comm_backward_s) == pytest.approx(
        (detailed.comm_forward_s, detailed.comm_backward_s)
    )
    gemms = sum(op.forward_s for op in detailed.ops if op.category == "gemm")
    assert detailed.tp_gemm_forward_s == pytest.approx(gemms)  # every GEMM of a Llama layer is tensor-parallel


def test_tp_overlap_shows_what_its_window_cannot_hide():
    from dataclasses import replace

    from trex.cost_model.layer_cost import CostContext, layer_cost

    spec = get_model_spec("llama3-70b")
    cluster = get_cluster("h100", 64)
    slow = replace(cluster, tiers=(replace(cluster.tiers[0], bandwidth_gbs=5.0),) + tuple(cluster.tiers[1:]))
    plan = ParallelConfig(tp=4, pp=8, vpp=5, seq=8192, gbs=256, recompute="none").with_devices(64)

    def cost(overlap):
        return layer_cost(
            spec.layers[0], spec.hidden_size, CostContext.of(replace(plan, tp_comm_overlap=overlap), slow)
        )

    blocking, ring = cost(False), cost(True)
    assert blocking.comm_forward_s > ring.tp_gemm_forward_s > 0  # 5 GB/s: the collectives outlast the GEMMs
    assert ring.comm_forward_s == pytest.approx(blocking.comm_forward_s - ring.tp_gemm_forward_s)
    assert ring.comm_backward_s == pytest.approx(blocking.comm_backward_s - ring.tp_gemm_backward_s)


def test_tp_overlap_without_sequence_parallelism_is_named():
    # Megatron/TE overlap the sequence-parallel collectives; without sequence parallelism there is none to overlap
    plan = ParallelConfig(tp=8, seq=2048, gbs=4, mbs=4, sequence_parallel=False, tp_comm_overlap=True)
    with pytest.raises(InfeasiblePlan, match="tp_comm_overlap .* needs sequence_parallel=true"):
        estimate_step(get_model_spec("gpt-22b"), get_cluster("a100", 8), plan)


def test_pipeline_stages_account_for_every_layer_and_the_worst_device(estimate):
    stages = estimate.to_dict()["pipeline"]
    assert [s["device"] for s in stages] == list(range(estimate.plan.pp))
    assert sum(sum(s["layers_per_chunk"]) for s in stages) == DSV3.num_layers
    assert [s["holds_embedding"] for s in stages].count(True) == 1 and stages[-1]["holds_head"]
    assert max(s["memory_gib"] for s in stages) == pytest.approx(estimate.to_dict()["memory_per_device_gib"])
    assert tuple(s["time_per_microbatch_s"] for s in stages) == estimate.per_device_s
