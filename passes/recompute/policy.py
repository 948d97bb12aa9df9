"""A plan's recompute policy ("none", "selective:core_attn+moe_act", "full") as a memory budget.

The planner prices fixed Megatron-style policies; the compiler's `recompute` pass takes a budget
instead. The budget a plan implies is the fraction of the save-everything activation bytes its
policy keeps, per the cost model's layer pricing (`trex.cost_model.layer_cost`: saved bytes per
layer kind under the plan vs. under "none", weighted by how many layers each kind has). The pass
then finds the least-recompute choice at that memory, rather than the policy's fixed one.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def budget_for_plan(plan: Any, model: Any):
    """The fraction of save-everything bytes `plan`'s recompute policy keeps (a `MemoryBudget` that
    rises to the reachable minimum rather than failing); None for "none" or a model without config."""
    from trex.passes.recompute import MemoryBudget

    parallel = plan.parallel
    if parallel.recompute_mode == "none":
        return None
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "model_type", None):
        return None
    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.layer_cost import layer_breakdown
    from trex.cost_model.model_spec import spec_from_config

    spec = spec_from_config(config, plan.model.name)
    cluster = get_cluster(plan.cluster)
    counts = spec.kind_counts
    kept = layer_breakdown(spec, parallel, cluster)
    everything = layer_breakdown(spec, dataclasses.replace(parallel, recompute="none"), cluster)
    full = sum(counts.get(kind, 0) * cost.saved_bytes for kind, cost in everything.items())
    if full <= 0:
        return None
    fraction = sum(counts.get(kind, 0) * cost.saved_bytes for kind, cost in kept.items()) / full
    return MemoryBudget(fraction=min(1.0, max(fraction, 1e-3)), at_least_minimum=True)
