"""Deployment search: per machine type, the TP degree and instance count that maximise throughput under SLOs.

For every machine type and every TP degree that fits in one of its servers, the instance is
checked for memory (`InstanceModel.memory`; infeasible degrees are pruned before any latency is
priced), its step latencies are fitted by least squares to samples of the cost model
(`latency_fit`), and its SLO-bound throughput is estimated (`capacity`). A type runs as many
instances as its devices allow (`count // tp`: with a fixed device count more instances never
serve less). The cluster's throughput is the sum over types - a capacity-aware scheduler keeps
each instance at its own rate - so the search enumerates the product of every type's feasible
options (leaving a type unused is an option) and ranks the deployments; the runners-up say what
they change against the best and what it costs.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trex.cost_model.model_spec import ModelSpec
from trex.workloads.serving.capacity import SLO, CapacityEstimate, describe_limit, estimate_capacity
from trex.workloads.serving.cluster_spec import MachineType, ServingCluster
from trex.workloads.serving.errors import InfeasibleError, ServingError
from trex.workloads.serving.instance_model import EngineLimits, InstanceMemory, InstanceModel, engine_defaults
from trex.workloads.serving.kv_cache import KVLayout
from trex.workloads.serving.latency_fit import LatencyModel, fit_latency, sample_instance
from trex.workloads.serving.workload import WorkloadStats


@dataclass(frozen=True)
class InstanceSpec:
    """What the simulator and the scheduler know about one running instance."""

    name: str
    machine: str
    device: str
    tp: int
    latency: LatencyModel
    kv: KVLayout
    kv_capacity_bytes: float
    limits: EngineLimits = field(default_factory=EngineLimits)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "machine": self.machine,
            "device": self.device,
            "tp": self.tp,
            "latency_model": self.latency.to_dict(),
            "kv_layout": self.kv.to_dict(),
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "limits": vars(self.limits),
        }

    @staticmethod
    def from_dict(data: dict[str, Any], source: str) -> InstanceSpec:
        try:
            return InstanceSpec(
                data["name"],
                data["machine"],
                data["device"],
                int(data["tp"]),
                LatencyModel.from_dict(data["latency_model"], source),
                KVLayout.from_dict(data["kv_layout"]),
                float(data["kv_capacity_bytes"]),
                EngineLimits(**data.get("limits", {})),
            )
        except (KeyError, TypeError) as error:
            raise ServingError(
                f"{source}: an instance entry lacks or misstates {error}; write deployment files with "
                "`trex serve plan --out plan.json`"
            ) from None


@dataclass(frozen=True)
class Option:
    """One machine type at one TP degree: feasible (with its estimate) or not (with the reason)."""

    machine: str
    tp: int
    instances: int
    memory: InstanceMemory | None  # None when the instance could not be described (e.g. no such dtype)
    estimate: CapacityEstimate | None = None
    spec: InstanceSpec | None = None
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return not self.reason

    @property
    def output_tok_s(self) -> float:
        return self.instances * self.estimate.output_tok_s if self.estimate else 0.0

    @property
    def requests_s(self) -> float:
        return self.instances * self.estimate.requests_s if self.estimate else 0.0

    def label(self) -> str:
        return f"{self.machine}: {self.instances} x TP{self.tp}"


@dataclass(frozen=True)
class Deployment:
    choices: tuple[Option, ...]  # one per machine type used

    @property
    def output_tok_s(self) -> float:
        return sum(o.output_tok_s for o in self.choices)

    @property
    def requests_s(self) -> float:
        return sum(o.requests_s for o in self.choices)

    def instances(self) -> list[InstanceSpec]:
        specs = []
        for option in self.choices:
            assert option.spec is not None
            specs.extend(
                replace(option.spec, name=f"{option.machine}/tp{option.tp}#{i}") for i in range(option.instances)
            )
        return specs

    def describe(self) -> str:
        return ", ".join(o.label() for o in self.choices)


@dataclass(frozen=True)
class DeploymentPlan:
    model: str
    cluster: str
    slo: SLO
    workload: WorkloadStats
    best: Deployment
    runners_up: tuple[tuple[Deployment, str], ...]
    options: tuple[Option, ...]  # every (machine type, TP) considered, feasible or not

    def to_dict(self) -> dict[str, Any]:
        def option(o: Option) -> dict[str, Any]:
            entry: dict[str, Any] = {
                "machine": o.machine,
                "tp": o.tp,
                "instances": o.instances,
                "feasible": o.feasible,
                "memory_gib": {"weights": o.memory.weights / 2**30, "kv_cache": max(o.memory.kv_cache, 0) / 2**30}
                if o.memory
                else None,
            }
            if o.estimate:
                entry.update(
                    batch=o.estimate.batch,
                    output_tok_s=o.output_tok_s,
                    requests_s=o.requests_s,
                    tpot_s=o.estimate.tpot_s,
                    ttft_s=o.estimate.ttft_s,
                    limit=o.estimate.limit,
                )
            if o.reason:
                entry["reason"] = o.reason
            return entry

        return {
            "model": self.model,
            "cluster": self.cluster,
            "slo": vars(self.slo),
            "workload": vars(self.workload),
            "deployment": [option(o) for o in self.best.choices],
            "predicted": {"output_tok_s": self.best.output_tok_s, "requests_s": self.best.requests_s},
            "instances": [spec.to_dict() for spec in self.best.instances()],
            "runners_up": [
                {"deployment": d.describe(), "output_tok_s": d.output_tok_s, "why_it_loses": why}
                for d, why in self.runners_up
            ],
            "options": [option(o) for o in self.options],
        }


def _option(
    spec: ModelSpec,
    machine: MachineType,
    tp: int,
    stats: WorkloadStats,
    slo: SLO,
    limits: EngineLimits,
    weight_dtype: str,
    kv_dtype: str,
) -> Option:
    instances = machine.count // tp
    limits = replace(limits, max_context=max(limits.max_context, stats.max_context))
    try:
        instance = InstanceModel(spec, machine, tp, weight_dtype, kv_dtype, limits)
    except ServingError as error:  # e.g. FP8 weights on a device without FP8 GEMMs: this type is out, not the plan
        return Option(machine.name, tp, instances, None, reason=str(error))
    memory = instance.memory
    if not memory.fits:
        return Option(machine.name, tp, instances, memory, reason=f"does not fit: {memory.explain()}")
    latency = fit_latency(sample_instance(instance), source=f"cost model: {spec.name} on {machine.device.name} TP{tp}")
    estimate = estimate_capacity(latency, instance.kv, instance.kv_capacity_bytes, instance.limits, stats, slo)
    if not estimate.feasible:
        return Option(machine.name, tp, instances, memory, estimate, reason=describe_limit(estimate, slo))
    instance_spec = InstanceSpec(
        instance.name,
        machine.name,
        machine.device.name,
        tp,
        latency,
        instance.kv,
        instance.kv_capacity_bytes,
        instance.limits,
    )
    return Option(machine.name, tp, instances, memory, estimate, instance_spec)


def _why(candidate: Deployment, best: Deployment) -> str:
    by_machine = {o.machine: o for o in best.choices}
    mine = {o.machine: o for o in candidate.choices}
    changes = []
    for machine in sorted(set(by_machine) | set(mine)):
        ours, theirs = mine.get(machine), by_machine.get(machine)
        if ours is None and theirs is not None:
            changes.append(f"leaves {machine} unused (-{theirs.output_tok_s:.0f} tok/s)")
        elif ours is not None and theirs is None:
            changes.append(f"adds {ours.label()} (+{ours.output_tok_s:.0f} tok/s)")
        elif ours is not None and theirs is not None and ours.tp != theirs.tp:
            assert ours.estimate is not None
            changes.append(
                f"{ours.label()} instead of {theirs.instances} x TP{theirs.tp}: {ours.output_tok_s:.0f} vs "
                f"{theirs.output_tok_s:.0f} tok/s ({describe_limit(ours.estimate, SLO())})"
            )
    loss = 1 - candidate.output_tok_s / best.output_tok_s if best.output_tok_s else 0.0
    return "; ".join(changes) + f" -> {loss:.1%} less throughput"


def plan_deployment(
    spec: ModelSpec,
    cluster: ServingCluster,
    stats: WorkloadStats,
    slo: SLO,
    *,
    limits: EngineLimits | None = None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    runners_up: int = 5,
) -> DeploymentPlan:
    """Exhaustive search over every machine type's (TP degree, instance count).

    `limits` apply to every machine type; without them each type gets its serving engine's defaults
    (`engine_defaults`). Raises InfeasibleError, with every option's reason, when nothing meets memory
    and SLOs."""
    per_machine: list[list[Option]] = []
    considered: list[Option] = []
    for machine in cluster.machines:
        chosen = limits or engine_defaults(machine.device)
        options = [
            _option(spec, machine, tp, stats, slo, chosen, weight_dtype, kv_dtype) for tp in machine.tp_degrees()
        ]
        considered.extend(options)
        per_machine.append([o for o in options if o.feasible])
    if not any(per_machine):
        reasons = "\n".join(f"  {o.label()}: {o.reason}" for o in considered)
        raise InfeasibleError(
            f"no deployment of {spec.name} on {cluster.describe()} fits in memory and meets {slo.describe()} "
            f"for {stats.describe()}:\n"
            f"{reasons}\nrelax the SLOs (--ttft-slo/--tpot-slo), shorten the longest context, quantise "
            "(--weight-dtype fp8, --kv-dtype fp8), or add devices with more memory (an instance stays inside one "
            "server: TP across servers and pipeline parallelism are not modelled)"
        )
    deployments = []
    for combo in itertools.product(*[[None, *options] for options in per_machine]):
        chosen = tuple(o for o in combo if o is not None)
        if chosen:
            deployments.append(Deployment(chosen))
    deployments.sort(key=lambda d: (-d.output_tok_s, sum(o.tp * o.instances for o in d.choices)))
    best = deployments[0]
    others = tuple((d, _why(d, best)) for d in deployments[1 : 1 + runners_up])
    return DeploymentPlan(spec.name, cluster.name, slo, stats, best, others, tuple(considered))


def save_plan(plan: DeploymentPlan, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    return path


def load_instances(path: str | Path) -> list[InstanceSpec]:
    """The instances of a deployment file written by `trex serve plan --out`."""
    path = Path(path)
    if not path.exists():
        raise ServingError(f"deployment file {path} does not exist; write one with `trex serve plan ... --out {path}`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ServingError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None
    entries = data.get("instances") if isinstance(data, dict) else None
    if not entries:
        raise ServingError(f"{path}: no `instances` list; write deployment files with `trex serve plan --out`")
    return [InstanceSpec.from_dict(entry, f"{path}: instances[{i}]") for i, entry in enumerate(entries)]
