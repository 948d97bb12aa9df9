"""trex.cost_model: analytical pricing of training steps and of captured graphs.

    from trex.cost_model import get_model_spec, get_cluster, parse_plan, estimate_step
    estimate = estimate_step(get_model_spec("deepseek-v3"), get_cluster("h100", 1024),
                             parse_plan("tp=2,pp=8,vpp=4,ep=64", seq=4096, gbs=8192, precision="fp8"))
    estimate.mfu, estimate.step_time_s, estimate.memory.gib(), estimate.breakdown

Modules, one concept each:
    devices       device profiles (peaks, memory, tile-wave GEMM / attention / bandwidth models), files
    cluster       tiers and clusters: where a process group lands; cluster files
    catalog       the built-in hardware: tiers (NVLink, HCCS, Unified Bus, InfiniBand, RoCE), clusters, targets
    collectives   alpha-beta costs of all_reduce, all_gather, reduce_scatter, all_to_all(v), send/recv
    model_spec    ModelSpec: what a model computes per token (from transformers configs or built-in shapes)
    config_cache  the full-size models' configurations, stored so that pricing them needs no transformers
    flops         FLOP conventions: Megatron per-GEMM count (mfu) and 6N + attention (mfu_6n)
    parallel      ParallelConfig: degrees, batch, precision, recompute, overlaps; parsing; constraints
    layer_cost    time, FLOPs and saved memory of one layer under a plan (the planner's inner loop)
    host          host side of eager execution: ops a layer issues, host-bound stretches, syncs
    memory        weights, gradients, optimizer states (AdamW, Muon), ZeRO, activations in flight
    pipeline      stage split, 1F1B / interleaved makespan (closed form and event simulation)
    step          estimate_step: the whole step -> StepEstimate (time, throughput, MFU, memory, breakdown)
    caveats       the regimes validation found priced optimistically (FP8, few rows per expert), stated on estimates
    trace         Chrome-trace timeline of an estimated step (Perfetto)
    op_formulas   per-op FLOPs and bytes as sympy expressions
    annotate      writes node.meta["cost"] on captured fx graphs
    agreement     graph-side (annotate) vs spec-side (layer_cost) cost of one layer, class by class: one truth
    cpu_loops     CPU TensorIterator loop counts of element-wise ops (what a broken layout costs)
    cpu_rows      CPU row-wise kernels: scalar softmax over short rows, reductions' per-output cost
    calibrate     microbenchmarks of this machine -> the `cpu` profile
    op_timing     measured vs predicted per-node times on this machine
    validation    predicted vs published training runs
"""

from __future__ import annotations

from typing import Any

from trex.cost_model.catalog import cluster_names, get_cluster, resolve_target, target_names
from trex.cost_model.cluster import Cluster, Tier
from trex.cost_model.collectives import all_gather, all_reduce, all_to_all, all_to_all_v, reduce_scatter, send_recv
from trex.cost_model.devices import DeviceProfile, device_names, get_device, load_device_profile
from trex.cost_model.flops import megatron_flops_per_token, six_n_flops_per_token
from trex.cost_model.model_spec import ModelSpec, get_model_spec, spec_from_config
from trex.cost_model.parallel import InfeasiblePlan, ParallelConfig, parse_plan, validate
from trex.cost_model.step import StepEstimate, estimate_step

# These import torch / sympy / transformers, so they load on first use. The graph-side functions
# share their module's name (annotate, calibrate): import them from the module, e.g.
# `from trex.cost_model.annotate import annotate`, as an attribute of this package would be the module.
_LAZY = {
    "NodeCost": ("trex.cost_model.annotate", "NodeCost"),
    "AnnotationReport": ("trex.cost_model.annotate", "AnnotationReport"),
    "write_trace": ("trex.cost_model.trace", "write_trace"),
    "compare_all": ("trex.cost_model.validation", "compare_all"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'trex.cost_model' has no attribute {name!r}")


__all__ = [
    "AnnotationReport",
    "Cluster",
    "DeviceProfile",
    "InfeasiblePlan",
    "ModelSpec",
    "NodeCost",
    "ParallelConfig",
    "StepEstimate",
    "Tier",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "all_to_all_v",
    "cluster_names",
    "compare_all",
    "device_names",
    "estimate_step",
    "get_cluster",
    "get_device",
    "get_model_spec",
    "load_device_profile",
    "megatron_flops_per_token",
    "parse_plan",
    "reduce_scatter",
    "resolve_target",
    "send_recv",
    "six_n_flops_per_token",
    "spec_from_config",
    "target_names",
    "validate",
    "write_trace",
]
