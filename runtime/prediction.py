"""What the cost model predicts for a run: step time and memory per rank, on the calibrated `cpu`
cluster (or the named one), for the model's spec and the resolved plan."""

from __future__ import annotations

import dataclasses
from typing import Any

from trex.cost_model.parallel import ParallelConfig


def predict(config: Any, plan: ParallelConfig, nproc: int, cluster: str = "cpu") -> dict[str, Any]:
    """{"step_time_s", "memory_per_rank_bytes", "memory_bytes": {...}} or {"error": why} when the model "
    "cannot price it."""
    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.model_spec import spec_from_config
    from trex.cost_model.step import estimate_step
    from trex.errors import TrexError

    try:
        spec = spec_from_config(config, getattr(config, "model_type", "model"))
        # transformers builds no multi-token-prediction layers (num_nextn_predict_layers is read only by
        # other frameworks): the runtime trains what is built, so the prediction leaves MTP out
        spec = dataclasses.replace(spec, mtp_layers=())
        estimate = estimate_step(spec, get_cluster(cluster, nproc), plan)
    except TrexError as error:
        return {"error": str(error)}
    memory = estimate.memory
    parts = {
        "parameters": memory.weights,
        "gradients": memory.gradients,
        "optimizer_states": memory.optimizer_states,
        "activations": memory.activations,
        "transient": memory.transient,
    }
    return {"step_time_s": estimate.step_time_s, "memory_per_rank_bytes": memory.total, "memory_bytes": parts}
