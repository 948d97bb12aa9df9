"""The planner's chunk times, memory and bounds are the cost model's own numbers."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from trex.cost_model import ParallelConfig, estimate_step, get_cluster, get_model_spec, validate
from trex.cost_model.pipeline import in_flight
from trex.planner.pricing import LayerChoice, Layout, PricedLayers
from trex.planner.search import pipeline_time
from trex.planner.stage_split import chunk_ranges, even_split

CASES = {
    "deepseek-v4-pro": ("cloudmatrix384", 1024, 4096, 1024),
    "deepseek-v3": ("h100", 1024, 4096, 8192),
    "qwen3-235b-a22b": ("h100", 256, 4096, 2048),
    "gpt-175b": ("a100", 64, 2048, 64),
}


@cache
def setup(name: str):
    cluster, devices, seq, gbs = CASES[name]
    return get_model_spec(name), get_cluster(cluster, devices), ParallelConfig(seq=seq, gbs=gbs)


@st.composite
def plans(draw):
    name = draw(st.sampled_from(sorted(CASES)))
    spec, cluster, template = setup(name)
    moe = any(layer.moe for layer in spec.layers)
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    plan = dataclasses.replace(
        template,
        tp=tp,
        cp=draw(st.sampled_from([1, 1, 2])),
        pp=draw(st.sampled_from([1, 2, 4, 8])),
        vpp=draw(st.sampled_from([1, 2, 3])),
        ep=draw(st.sampled_from([1, 8, 32, 64])) if moe else 1,
        etp=draw(st.sampled_from([1, tp])) if moe else 1,
        mbs=draw(st.sampled_from([1, 2])),
        zero=draw(st.sampled_from([0, 1, 2, 3])),
        recompute=draw(st.sampled_from(["none", "selective", "full", "selective:layernorm+moe_act"])),
        overlap_p2p=draw(st.booleans()),
    )
    try:
        plan = plan.with_devices(cluster.devices)
    except Exception:
        assume(False)
    assume(not validate(plan, spec, cluster.devices))
    return spec, cluster, dataclasses.replace(plan, layers_per_chunk=even_split(spec.num_layers, plan.pp * plan.vpp))


def layout_of(spec, cluster, plan) -> Layout:
    layers = PricedLayers(
        spec, cluster, plan, LayerChoice(plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.recompute)
    )
    return Layout(layers, plan.pp, plan.vpp, plan.zero, cluster.devices)


@given(plans())
def test_chunk_times_and_memory_equal_estimate_step(case):
    spec, cluster, plan = case
    estimate = estimate_step(spec, cluster, plan)
    layout = layout_of(spec, cluster, plan)
    start = 0
    for c, n in enumerate(plan.layers_per_chunk):
        chunk = estimate.chunks[c]
        assert layout.chunk_time(start, start + n, c) == pytest.approx(chunk.forward_s + chunk.backward_s, rel=1e-9)
        start += n
    memories = [layout.device_memory(d, r) for d, r in enumerate(chunk_ranges(plan.layers_per_chunk, plan.pp))]
    assert max(m.total for m in memories) == pytest.approx(estimate.memory.total, rel=1e-9)
    pipeline = pipeline_time(
        layout,
        tuple(
            sum(layout.chunk_time(a, b, d + j * plan.pp) for j, (a, b) in enumerate(r))
            for d, r in enumerate(chunk_ranges(plan.layers_per_chunk, plan.pp))
        ),
    )
    assert pipeline == pytest.approx(
        estimate.step_time_s - estimate.breakdown.dp_sync_s - estimate.breakdown.optimizer_s, rel=1e-9
    )
    for d, r in enumerate(
        chunk_ranges(plan.layers_per_chunk, plan.pp)
    ):  # the splitter's fast path: the same number up to rounding
        assert layout.excess(d, r) == pytest.approx(
            memories[d].total - memories[d].capacity, rel=1e-12, abs=1e-12 * memories[d].capacity
        )
        assert layout.excess(d, r) == layout.excess(d, r)  # asked again: from the per-chunk memo


@given(plans())
def test_bounds_never_exceed_what_estimate_step_prices(case):
    spec, cluster, plan = case
    estimate = estimate_step(spec, cluster, plan)
    layout = layout_of(spec, cluster, plan)
    assert layout.layers.step_lower_bound(cluster.devices, plan.gbs) <= estimate.step_time_s * (1 + 1e-12)
    assert layout.mean_memory_bound() <= estimate.memory.total * (1 + 1e-12)
    if estimate.memory.fits:
        assert layout.count_bound_fits()  # the memory filter never rejects a layout that fits
    ranges = chunk_ranges(plan.layers_per_chunk, plan.pp)
    for d, r in enumerate(ranges):
        assert layout.device_memory(d, r, bound=True).total <= layout.device_memory(d, r).total * (1 + 1e-12)


def test_the_last_chunk_of_the_last_stage_holds_the_fewest_micro_batches():
    # mean_memory_bound relies on it: Megatron's warm-up shrinks towards the last stage and later chunks
    for pp in range(1, 17):
        for vpp in range(1, 6):
            for m in (pp, 2 * pp, 8 * pp, 3 * pp + (0 if vpp > 1 else 1)):
                fewest = min(min(in_flight(d, pp, vpp, m)) for d in range(pp))
                assert in_flight(pp - 1, pp, vpp, m)[-1] == fewest


def test_layer_kinds_are_priced_once_per_layer_choice():
    spec, cluster, template = setup("deepseek-v4-pro")
    layers = PricedLayers(spec, cluster, template, LayerChoice(2, 1, 64, 1, 1, "selective"))
    assert set(layers.kinds) == {"hca+hash_moe", "csa+moe", "hca+moe", "mtp"}
    first = layers.chunk(3, 7, False, False, 4)
    assert layers.chunk(5, 9, False, False, 4) is first  # same kinds (2 CSA + 2 HCA), same facts object
