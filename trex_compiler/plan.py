"""`Plan`: the result of parallel planning, one serializable object.

    plan = Plan.load("plan.json")            # or trex.planner.plan_parallel(...).best
    print(plan)                              # degrees, stage split, predicted step time, MFU, memory
    plan.save("plan.json"); Plan.from_json(plan.to_json()) == plan
    for change in plan.diff(other): print(change)
    compiled = trex.compile(model, plan=plan)

A plan holds the parallel layout as the cost model's `ParallelConfig` (degrees, ZeRO stage, micro
and global batch, recompute policy, stage split as layers per pipeline chunk, and the software
settings it was priced with), what it was made for (`ModelShape`, cluster, device count) and what
the cost model predicted for it (`Prediction`). The JSON form also lists which layers sit on which
pipeline stage; it is derived from the split and checked when a plan is loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trex.cost_model.parallel import ParallelConfig, validate
from trex.cost_model.pipeline import default_layers_per_chunk
from trex.errors import TrexError

if TYPE_CHECKING:
    from trex.cost_model.model_spec import ModelSpec
    from trex.cost_model.step import StepEstimate

PLAN_FORMAT = "trex-plan/1"


@dataclass(frozen=True)
class ModelShape:
    """What a plan was made for: enough of the model to reject a plan that does not fit another one."""

    name: str
    num_layers: int
    hidden_size: int
    attention_heads: int  # the smallest head count of any attention core (tp must divide it)
    num_experts: int | None = None  # routed experts (ep must divide them); None for dense models
    layer_kinds: tuple[str, ...] = ()  # kind of each decoder layer, in stack order

    @classmethod
    def of(cls, spec: ModelSpec) -> ModelShape:
        heads = [core.heads for layer in spec.layers for core in layer.attention if core.v_head_dim]
        moe = next((layer.moe for layer in spec.layers if layer.moe), None)
        return cls(
            spec.name,
            spec.num_layers,
            spec.hidden_size,
            min(heads) if heads else 1,
            moe.num_experts if moe else None,
            tuple(layer.kind for layer in spec.layers),
        )

    def mismatches(self, other: ModelShape) -> list[str]:
        """How `other` (the model at hand) differs from the model this plan was made for."""
        problems = []
        for name, label in (
            ("num_layers", "decoder layers"),
            ("hidden_size", "hidden size"),
            ("num_experts", "routed experts"),
            ("attention_heads", "attention heads"),
        ):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                problems.append(f"the plan was made for {mine} {label}, the model has {theirs}")
        return problems


@dataclass(frozen=True)
class Prediction:
    """What the cost model predicted for the plan (`trex.cost_model.estimate_step`)."""

    step_time_s: float
    mfu: float  # Megatron per-GEMM model FLOPs over the dense BF16 peak
    mfu_6n: float
    tokens_per_s_per_device: float
    model_tflops_per_device: float
    memory_gib: dict[str, float]  # weights, gradients, optimizer_states, activations, transient, total, capacity
    breakdown: dict[str, float]  # seconds: compute, recompute, exposed_communication, bubble, optimizer, ...
    feasible: bool = True

    @property
    def memory_per_device_gib(self) -> float:
        return self.memory_gib.get("total", math.nan)

    @classmethod
    def of(cls, estimate: StepEstimate) -> Prediction:
        return cls(
            estimate.step_time_s,
            estimate.mfu,
            estimate.mfu_6n,
            estimate.tokens_per_s_per_device,
            estimate.model_tflops_per_device,
            dict(estimate.memory.gib()),
            dict(estimate.breakdown.to_dict()),
            estimate.feasible,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "mfu_6n": self.mfu_6n,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "model_tflops_per_device": self.model_tflops_per_device,
            "memory_per_device_gib": self.memory_per_device_gib,
            "memory_gib": dict(self.memory_gib),
            "breakdown": dict(self.breakdown),
            "feasible": self.feasible,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prediction:
        known = {f.name for f in fields(cls)}
        missing = sorted(k for k in known if k not in data and k != "feasible")
        if missing:
            raise TrexError(f"plan prediction is missing {', '.join(missing)}")
        return cls(**{k: data[k] for k in known if k in data})


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    cluster: str
    devices: int
    device: str
    parallel: ParallelConfig  # dp and layers_per_chunk filled in
    prediction: Prediction | None = None
    source: str = "trex planner"  # or the public recipe a baseline stands for
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise TrexError("inconsistent plan: " + "; ".join(problems))

    # -- derived -----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Processes the plan runs on: tp * pp * cp * dp."""
        p = self.parallel
        return p.tp * p.pp * p.cp * p.data_parallel

    @property
    def layers_per_chunk(self) -> tuple[int, ...]:
        p = self.parallel
        return p.layers_per_chunk or default_layers_per_chunk(self.model.num_layers, p.pp * p.vpp)

    def stages(self) -> list[list[tuple[int, int]]]:
        """Per pipeline stage, the [start, end) decoder-layer range of each of its chunks, in order.
        Stage 0's first chunk also holds the embedding; the last chunk (on the last stage) the head and MTP."""
        p = self.parallel
        out: list[list[tuple[int, int]]] = [[] for _ in range(p.pp)]
        start = 0
        for c, n in enumerate(self.layers_per_chunk):
            out[c % p.pp].append((start, start + n))
            start += n
        return out

    def problems(self) -> list[str]:
        """Internal consistency: degrees multiply to the devices, the split covers the layers."""
        p = self.parallel
        problems = []
        if p.dp is None:
            problems.append("dp is not set")
        elif p.tp * p.pp * p.cp * p.dp != self.devices:
            problems.append(
                f"tp*pp*cp*dp = {p.tp}*{p.pp}*{p.cp}*{p.dp} = {p.tp * p.pp * p.cp * p.dp} differs from the plan's {self.devices} devices"
            )
        if p.layers_per_chunk is not None:
            if len(p.layers_per_chunk) != p.pp * p.vpp:
                problems.append(f"the stage split has {len(p.layers_per_chunk)} chunks for pp*vpp = {p.pp * p.vpp}")
            if sum(p.layers_per_chunk) != self.model.num_layers:
                problems.append(
                    f"the stage split places {sum(p.layers_per_chunk)} layers; the model has {self.model.num_layers}"
                )
            if any(n < 0 for n in p.layers_per_chunk):
                problems.append("the stage split has a negative layer count")
        return problems

    def check(self, *, spec: ModelSpec | None = None, num_layers: int | None = None) -> list[str]:
        """Why this plan cannot run a model (empty when it can), from what the caller knows of it:
        its `ModelSpec` (everything is checked), or only its decoder-layer count."""
        if spec is not None:
            return self.check_model(spec)
        if num_layers != self.model.num_layers:
            return [f"the plan was made for {self.model.num_layers} decoder layers, the model has {num_layers}"]
        return []

    def check_model(self, spec: ModelSpec) -> list[str]:
        """Why this plan cannot run `spec` (empty when it can): shape mismatches, then every
        constraint of the cost model (`trex.cost_model.validate`) on this plan and model."""
        problems = self.model.mismatches(ModelShape.of(spec))
        if self.model.num_layers == spec.num_layers:
            problems += validate(self.parallel, spec, self.devices)
        return problems

    # -- serialization -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        model = {
            "name": self.model.name,
            "num_layers": self.model.num_layers,
            "hidden_size": self.model.hidden_size,
            "attention_heads": self.model.attention_heads,
            "num_experts": self.model.num_experts,
            "layer_kinds": list(self.model.layer_kinds),
        }
        stages = [
            {
                "stage": s,
                "chunks": [
                    {
                        "layers": [a, b],
                        **({"embedding": True} if s == 0 and j == 0 else {}),
                        **({"head": True} if s == self.parallel.pp - 1 and j == self.parallel.vpp - 1 else {}),
                    }
                    for j, (a, b) in enumerate(ranges)
                ],
            }
            for s, ranges in enumerate(self.stages())
        ]
        return {
            "format": PLAN_FORMAT,
            "model": model,
            "cluster": self.cluster,
            "devices": self.devices,
            "device": self.device,
            "parallel": self.parallel.to_dict(),
            "stages": stages,
            "prediction": self.prediction.to_dict() if self.prediction is not None else None,
            "source": self.source,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Plan:
        if not isinstance(data, dict):
            raise TrexError(f"{source}: a plan is a JSON object, got {type(data).__name__}")
        if data.get("format") != PLAN_FORMAT:
            raise TrexError(
                f"{source}: not a trex plan (format {data.get('format')!r}; expected {PLAN_FORMAT!r}); write one with `trex plan --out`"
            )
        for key in ("model", "cluster", "devices", "device", "parallel"):
            if key not in data:
                raise TrexError(f"{source}: plan field {key!r} is missing")
        m = data["model"]
        try:
            model = ModelShape(
                str(m["name"]),
                int(m["num_layers"]),
                int(m["hidden_size"]),
                int(m["attention_heads"]),
                None if m.get("num_experts") is None else int(m["num_experts"]),
                tuple(m.get("layer_kinds", ())),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise TrexError(f"{source}: plan field 'model' is incomplete or malformed ({error})") from None
        try:
            parallel = ParallelConfig.from_dict(dict(data["parallel"]))
        except TypeError as error:
            raise TrexError(f"{source}: plan field 'parallel' is malformed ({error})") from None
        prediction = Prediction.from_dict(data["prediction"]) if data.get("prediction") is not None else None
        try:
            plan = cls(
                model,
                str(data["cluster"]),
                int(data["devices"]),
                str(data["device"]),
                parallel,
                prediction,
                str(data.get("source", "")),
                tuple(data.get("notes", ())),
            )
        except TrexError as error:
            raise TrexError(f"{source}: {error}") from None
        if "stages" in data and data["stages"] != plan.to_dict()["stages"]:
            raise TrexError(
                f"{source}: the plan's 'stages' list does not match its parallel.layers_per_chunk; edit the split there (stages are derived)"
            )
        return plan

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise TrexError(
                f"{source}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
            ) from None
        return cls.from_dict(data, source)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        if not path.exists():
            raise TrexError(f"plan file {path} does not exist; write one with `trex plan ... --out {path}`")
        return cls.from_json(path.read_text(), str(path))

    # -- comparison and display ----------------------------------------------------------------
    def diff(self, other: Plan) -> list[PlanChange]:
        """Every field that differs, flattened (`parallel.tp`, `prediction.step_time_s`, ...)."""
        mine, theirs = _flatten(self.to_dict()), _flatten(other.to_dict())
        changes = []
        for key in sorted(set(mine) | set(theirs)):
            if key.startswith("stages"):
                continue  # derived from parallel.layers_per_chunk
            a, b = mine.get(key), theirs.get(key)
            if a != b:
                changes.append(PlanChange(key, a, b))
        return changes

    def summary(self) -> str:
        p = self.parallel
        lines = [
            f"plan for {self.model.name} on {self.devices} x {self.device} ({self.cluster}) - {self.source}",
            f"  degrees   tp={p.tp} (sequence parallel {'on' if p.sequence_parallel and p.tp > 1 else 'off'}), pp={p.pp}, vpp={p.vpp}, "
            f"ep={p.ep}, etp={p.etp}, cp={p.cp}, dp={p.dp}",
            f"  optimizer ZeRO-{p.zero}{' (distributed optimizer)' if p.zero == 1 else ''}; batch: global {p.gbs} x {p.seq} tokens, "
            f"micro {p.mbs}, {p.microbatches} micro-batches per step; {p.precision}; recompute {p.recompute}",
        ]
        for s, ranges in enumerate(self.stages()):
            # A chunk with no decoder layer (e.g. the first one, which carries the embedding) shows as "(empty)".
            chunks = ", ".join(f"{a}-{b - 1}" if b > a + 1 else str(a) if b > a else "(empty)" for a, b in ranges)
            ends = (" +embedding" if s == 0 else "") + (" +head" if s == p.pp - 1 else "")
            label = "layers" if len(ranges) == 1 else f"{len(ranges)} chunks: layers"
            lines.append(f"  stage {s:<3} {label} {chunks}{ends}")
        if self.prediction is not None:
            r = self.prediction
            m = r.memory_gib
            lines.append(
                f"  predicted {r.step_time_s:.3f} s/step, MFU {r.mfu:.1%} (6N: {r.mfu_6n:.1%}), {r.tokens_per_s_per_device:,.0f} tokens/s/device, "
                f"{r.memory_per_device_gib:.1f} of {m.get('capacity', math.nan):.1f} GiB per device"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


@dataclass(frozen=True)
class PlanChange:
    field: str
    before: Any
    after: Any

    def __str__(self) -> str:
        return f"{self.field}: {_show(self.before)} -> {_show(self.after)}"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value) if not isinstance(value, str) else value


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        out = {}
        for i, value in enumerate(data):
            out.update(_flatten(value, f"{prefix}[{i}]"))
        return out
    return {prefix: tuple(data) if isinstance(data, list) else data}


def load_plan(plan: Plan | str | Path) -> Plan:
    return plan if isinstance(plan, Plan) else Plan.load(plan)
