"""Predicted vs published: every row of published_runs.csv estimated as it was run.

Each row gives model, device count and kind, parallel degrees, batch, sequence, precision and the
published figure (step time, model TFLOP/s per device or MFU). `data/published_setups.toml` adds
the software facts the columns do not carry (attention kernel, recompute modules, dispatcher,
pipeline layout, gradient dtype), each with its source. The same device profile and cluster serve
every row of that device; nothing is tuned per row.
"""

from __future__ import annotations

import csv
import re
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from trex.cost_model.catalog import cluster_for_device, get_cluster
from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.step import StepEstimate, estimate_step
from trex.errors import TrexError


def _data(name: str) -> str:
    return resources.files("trex.cost_model").joinpath("data", name).read_text()


def published_runs(path: str | Path | None = None) -> list[dict[str, str]]:
    text = Path(path).read_text() if path else _data("published_runs.csv")
    return list(csv.DictReader(text.splitlines()))


def extra_published_runs() -> list[dict[str, str]]:
    """Further published runs of the same sources (`data/published_runs_extra.csv`): reported next to the
    validation table, never part of its mean, worst row or order check."""
    return list(csv.DictReader(_data("published_runs_extra.csv").splitlines()))


def published_setups() -> dict[str, dict[str, Any]]:
    return tomllib.loads(_data("published_setups.toml"))


def layers_per_chunk_from_layout(layout: str, chunks: int, num_layers: int) -> tuple[int, ...]:
    """Decoder layers per chunk from a Megatron pipeline layout such as "Et|(tt|)*30mL"."""
    expanded = layout
    pattern = re.compile(r"\(([^()]*)\)\*(\d+)")
    while True:
        match = pattern.search(expanded)
        if not match:
            break
        expanded = expanded[: match.start()] + match.group(1) * int(match.group(2)) + expanded[match.end() :]
    parts = expanded.split("|")
    if len(parts) != chunks:
        raise TrexError(f"pipeline layout {layout!r} has {len(parts)} chunks, the plan has pp*vpp = {chunks}")
    counts = tuple(part.count("t") for part in parts)
    if sum(counts) != num_layers:
        raise TrexError(f"pipeline layout {layout!r} places {sum(counts)} layers, the model has {num_layers}")
    if "E" not in parts[0] or "L" not in parts[-1]:
        raise TrexError(
            f"pipeline layout {layout!r}: the embedding (E) goes in the first chunk and the loss (L) in the last"
        )
    return counts


@dataclass(frozen=True)
class Comparison:
    id: str
    model: str
    devices: int
    device: str
    plan: str
    metric: str
    published: float
    predicted: float
    estimate: StepEstimate
    source: str

    @property
    def error(self) -> float:
        """Signed relative error of the prediction (positive: predicted larger)."""
        return self.predicted / self.published - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "devices": self.devices,
            "device": self.device,
            "plan": self.plan,
            "metric": self.metric,
            "published": self.published,
            "predicted": self.predicted,
            "error": self.error,
            "step_time_s": self.estimate.step_time_s,
            "mfu": self.estimate.mfu,
            "breakdown": self.estimate.breakdown.to_dict(),
            "memory_per_device_gib": self.estimate.memory.total / 2**30,
        }


def plan_of_row(row: dict[str, str], setup: dict[str, Any], num_layers: int) -> ParallelConfig:
    known = {f.name for f in fields(ParallelConfig)}
    values: dict[str, Any] = {
        key: int(row[key]) for key in ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero", "mbs", "gbs", "seq")
    }
    values["precision"] = row["precision"]
    values["recompute"] = row["recompute"]
    for key, value in setup.items():
        if key in known:
            values[key] = value
        elif key == "pipeline_layout":
            values["layers_per_chunk"] = layers_per_chunk_from_layout(value, values["pp"] * values["vpp"], num_layers)
        elif key != "source":
            raise TrexError(f"published_setups.toml: unknown key {key!r}")
    return ParallelConfig(**values)


def compare_row(
    row: dict[str, str], setup: dict[str, Any] | None = None, *, host_op_us: float | None = None
) -> Comparison:
    """Estimate one published row. `host_op_us` replaces the device profile's host cost per op (a
    sensitivity study of the host model, the same value for every row; None: the profile's own)."""
    setup = setup if setup is not None else published_setups().get(row["id"], {})
    spec = get_model_spec(row["model"])
    devices = int(row["devices"])
    cluster = get_cluster(cluster_for_device(row["device"]), devices)
    if host_op_us is not None:
        cluster = cluster.with_device(replace(cluster.device, host_op_us=host_op_us))
    plan = plan_of_row(row, setup, spec.num_layers)
    estimate = estimate_step(spec, cluster, plan)
    metric = row["metric"]
    if metric == "step_time_s":
        predicted = estimate.step_time_s
    elif metric == "model_tflops_per_device":
        predicted = estimate.model_tflops_per_device
    elif metric == "mfu":
        predicted = estimate.mfu
    else:
        raise TrexError(f"row {row['id']}: unknown metric {metric!r}")
    return Comparison(
        row["id"],
        row["model"],
        devices,
        row["device"],
        estimate.plan.label(),
        metric,
        float(row["value"]),
        predicted,
        estimate,
        setup.get("source", row.get("source", "")),
    )


def compare_all(
    path: str | Path | None = None, *, host_op_us: float | None = None, extra: bool = False
) -> list[Comparison]:
    """Every row of the published-runs CSV (`path`, default the shipped copy); `extra=True`: the rows of
    `extra_published_runs()` instead."""
    setups = published_setups()
    rows = extra_published_runs() if extra else published_runs(path)
    return [compare_row(row, setups.get(row["id"], {}), host_op_us=host_op_us) for row in rows]


@dataclass(frozen=True)
class LayerExecutions:
    """A row's step seen as layer executions (one layer's forward + backward for one micro-batch) on its
    busiest device: how many per step, and what one costs as predicted and as the published figure implies
    when everything else in the step (bubble, embedding, head, data-parallel sync, optimizer) is taken as
    predicted. Separates what scales with the layers from what does not."""

    count: int
    predicted_s: float
    published_s: float

    @property
    def ratio(self) -> float:
        return self.published_s / self.predicted_s


def layer_executions(comparison: Comparison) -> LayerExecutions | None:
    """For models whose decoder layers are all of one kind (GPT, Qwen3, Pangu rows); None otherwise."""
    from trex.cost_model.layer_cost import CostContext, layer_cost
    from trex.cost_model.pipeline import device_chunks

    estimate = comparison.estimate
    spec = get_model_spec(comparison.model)
    if len(spec.layer_kinds) != 1 or spec.mtp_layers:
        return None
    plan = estimate.plan
    cluster = get_cluster(cluster_for_device(comparison.device), comparison.devices)
    cost = layer_cost(spec.layers[0], spec.hidden_size, CostContext.of(plan, cluster))
    busiest = max(range(plan.pp), key=lambda d: estimate.per_device_s[d])
    ids = device_chunks(busiest, plan.pp, plan.vpp)
    count = plan.microbatches * sum(len(estimate.chunks[c].layers) for c in ids)
    host_wait = plan.microbatches * sum(estimate.chunks[c].host_wait_s for c in ids)  # the device idle behind the host
    per_layer = cost.device_forward_s + cost.device_backward_s + host_wait / count
    rest = estimate.step_time_s - count * per_layer
    published_step = (
        comparison.published
        if comparison.metric == "step_time_s"
        else estimate.step_time_s * comparison.predicted / comparison.published
    )
    return LayerExecutions(count, per_layer, (published_step - rest) / count)
