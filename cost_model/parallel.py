"""`ParallelConfig`: the plan-shaped input the estimator prices, its parsing, and its constraints.

Degrees follow Megatron: tp (with sequence parallelism), pp with vpp virtual stages (interleaved
1F1B), cp, dp, and for MoE layers ep and etp over the same tp*cp*dp ranks of a pipeline stage
(expert data parallelism edp = tp*cp*dp / (ep*etp)). Rank order is tp fastest, then cp, dp, pp
(Megatron's default `tp-cp-ep-dp-pp`); expert groups are laid over a stage's ranks etp fastest.

`ParallelConfig` carries the training shape (seq, micro/global batch, precision, recompute) and the
software choices that change the time of a step (overlaps, attention kernel, MoE dispatcher, optimizer
state dtypes). The planner's `Plan` holds one of these; `validate` names every violated constraint
with its numbers.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trex.cost_model.model_spec import RECOMPUTE_MODULES, ModelSpec
from trex.errors import TrexError

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
AttentionKernel = Literal["flash", "unfused"]
Dispatcher = Literal["alltoall", "deepep"]
Optimizer = Literal["auto", "adamw", "muon"]
# Megatron's `--fp8-recipe` (Transformer Engine recipes): per-tensor scales from an amax history
# (delayed) or from the tensor itself (tensorwise = TE's Float8CurrentScaling), or per-block scales
# (blockwise: 1x128 activations, 128x128 weights, as DeepSeek-V3 trained). Only read when precision=fp8.
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise"]


class InfeasiblePlan(TrexError):
    """A plan that violates a constraint; `violations` lists each with its numbers."""

    def __init__(self, violations: list[str]):
        self.violations = violations
        super().__init__("infeasible plan: " + "; ".join(violations))


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    dp: int | None = None  # derived from the device count when None
    zero: int = 1  # 0: replicated optimizer; 1: distributed optimizer (ZeRO-1); 2: + gradients; 3: + parameters
    seq: int = 2048
    gbs: int = 64
    mbs: int = 1
    precision: Precision = "bf16"
    fp8_recipe: Fp8Recipe = "delayed"  # Megatron's default; see Fp8Recipe
    recompute: str = "selective"  # none | selective | full | selective:<module>+<module>
    sequence_parallel: bool = True
    attention_kernel: AttentionKernel = "flash"
    dispatcher: Dispatcher = "alltoall"
    moe_imbalance: float = 1.0  # max/mean routed rows over EP ranks (1.0: balanced routing)
    tp_comm_overlap: bool = False
    ep_comm_overlap: bool = False  # EP all-to-all hidden behind another micro-batch (1F1B A2A overlap / DualPipe)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_p2p: bool = True
    # collectives one data-parallel gradient reduction (and one parameter gather) is issued as, (dense, expert):
    # None = one flattened bucket each (Megatron / DeepSpeed bucket the gradients); an executor that reduces
    # tensor by tensor, or per FSDP unit, says how many (each call pays the link's latency)
    grad_reduce_calls: tuple[int, int] | None = None
    # the collective that reduces gradients: "auto" = reduce_scatter for a sharded optimizer (zero >= 1, Megatron's
    # distributed optimizer), all_reduce at zero=0; an executor whose ZeRO-1 all-reduces and keeps its shard says so
    grad_reduce_op: str = "auto"
    # parameters replicated over tp but computed on a rank's tokens (norms, router) need their gradients summed
    # over tp: (collectives per micro-batch, bytes) when an executor issues that every backward tensor by tensor;
    # None = once per step, coalesced with the data-parallel reduction (Megatron's layer-norm all-reduce)
    tp_grad_sync: tuple[int, float] | None = None
    # True: those `tp_grad_sync` collectives are issued once per step (the partial gradients accumulate locally
    # over the micro-batches and are summed with the last one's), not every micro-batch
    tp_grad_sync_per_step: bool = False
    # what one rank issues per step on an eager CPU executor, counted on its program (`runtime.issued_ops`):
    # (plain ops, DTensor ops, FSDP2 unit passes); priced by the device's measured issue costs
    # (`cost_model.eager_issue`). None: not counted (production plans: the host model prices issue time)
    issued_ops: tuple[int, int, int] | None = None
    grad_dtype: Precision = "fp32"  # main-gradient buffer and gradient reduction dtype
    # the dtype the parameters are stored in: None = the compute precision's (bf16 weights plus an fp32 master
    # copy in the optimizer state, Megatron's mixed precision); "fp32" = fp32 parameters the optimizer steps
    # directly while torch.autocast casts each op's inputs to `precision` (no master copy) - what
    # `runtime.training_layout` runs
    param_dtype: Precision | None = None
    optimizer_state_dtype: Precision = "fp32"  # optimizer moments
    optimizer: Optimizer = "auto"  # auto (model's own), adamw, muon
    layers_per_chunk: tuple[int, ...] | None = None  # explicit stage split: layers in each of pp*vpp chunks
    # A dropless MoE layer copies its token counts to the host in the forward (to size buffers and
    # grouped GEMMs), draining the launch queue. True for Megatron-Core's alltoall dispatcher
    # (`cuda_dtoh_stream.synchronize()`) and its DeepEP path (`buffer.dispatch` waits for the GPU's
    # counts: "the CPU will wait for GPU's signal"); False for capacity-padded or graph-captured MoE.
    moe_host_sync: bool = True

    # -- derived -----------------------------------------------------------------------------
    def with_devices(self, devices: int) -> ParallelConfig:
        """Fill in dp from the device count (tp*pp*cp*dp = devices)."""
        if self.dp is not None:
            return self
        per_replica = self.tp * self.pp * self.cp
        if devices % per_replica:
            raise InfeasiblePlan(
                [f"tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {per_replica} does not divide the {devices} devices"]
            )
        return dataclasses.replace(self, dp=devices // per_replica)

    @property
    def data_parallel(self) -> int:
        if self.dp is None:
            raise TrexError("dp is not set; call with_devices(n) first")
        return self.dp

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.cp * self.data_parallel

    @property
    def stage_ranks(self) -> int:
        """Ranks in one pipeline stage: tp*cp*dp."""
        return self.tp * self.cp * self.data_parallel

    @property
    def edp(self) -> int:
        return self.stage_ranks // (self.ep * self.etp)

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.mbs * self.data_parallel)

    @property
    def recompute_mode(self) -> str:
        return self.recompute.split(":", 1)[0]

    @property
    def recompute_modules(self) -> frozenset[str]:
        """Modules whose activations are dropped and recomputed (selective); all for full."""
        mode = self.recompute_mode
        if mode == "none":
            return frozenset()
        if mode == "full":
            return frozenset(RECOMPUTE_MODULES)
        if ":" in self.recompute:
            return frozenset(m for m in self.recompute.split(":", 1)[1].replace(",", "+").split("+") if m)
        return frozenset({"core_attn"})  # Megatron's default selective recompute

    def label(self) -> str:
        parts = [
            f"tp={self.tp}",
            f"pp={self.pp}",
            f"vpp={self.vpp}",
            f"ep={self.ep}",
            f"etp={self.etp}",
            f"cp={self.cp}",
            f"dp={self.dp}",
            f"zero={self.zero}",
        ]
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.layers_per_chunk is not None:
            data["layers_per_chunk"] = list(self.layers_per_chunk)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParallelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrexError(f"unknown plan field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}")
        values = dict(data)
        if values.get("layers_per_chunk") is not None:
            values["layers_per_chunk"] = tuple(values["layers_per_chunk"])
        return cls(**values)


PLAN_STRING_KEYS = ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero")  # what a plan string ("tp=8,pp=4,...") sets


def key_values(text: str, keys: Sequence[str], *, what: str, example: str) -> list[tuple[str, str]]:
    """Split `"k=v,k=v"` into (key, raw value) pairs, refusing an item without '=' and a key not in `keys`;
    errors name `what` is being parsed and show `example`."""
    pairs: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise TrexError(f'{what} item {item!r} is not key=value; write e.g. "{example}"')
        key, raw = (s.strip() for s in item.split("=", 1))
        if key not in keys:
            raise TrexError(f"{what}: unknown key {key!r}; valid keys: {', '.join(keys)}")
        earlier = [r for k, r in pairs if k == key]
        if earlier:
            raise TrexError(f"{what} {text!r} names {key} twice ({key}={earlier[0]} and {key}={raw}); keep one")
        pairs.append((key, raw))
    return pairs


def settings_without_effect(config: ParallelConfig, given: Iterable[str]) -> list[str]:
    """A note for each field the user set (`given`) that changes nothing under this configuration,
    so a setting is never silently ignored (e.g. an FP8 recipe when training in bf16)."""
    given = set(given)
    notes = []
    if "fp8_recipe" in given and config.precision != "fp8":
        notes.append(
            f"fp8_recipe={config.fp8_recipe} has no effect at precision {config.precision}: it prices FP8 GEMMs only "
            "(use --precision fp8)"
        )
    if "tp_comm_overlap" in given and config.tp_comm_overlap and config.tp == 1:
        notes.append("tp_comm_overlap has no effect with tp=1: there is no tensor-parallel communication to overlap")
    if "ep_comm_overlap" in given and config.ep_comm_overlap and config.ep == 1:
        notes.append("ep_comm_overlap has no effect with ep=1: there is no expert-parallel all-to-all to overlap")
    if "dispatcher" in given and config.ep == 1:
        notes.append(f"dispatcher={config.dispatcher} has no effect with ep=1: tokens never leave the device")
    if "overlap_param_gather" in given and config.zero < 1:
        notes.append("overlap_param_gather has no effect with zero=0: parameters are replicated, never gathered")
    return notes


def parse_plan(text: str, **training: Any) -> ParallelConfig:
    """Parse `"tp=8,pp=8,vpp=3,ep=1,etp=1,cp=1,dp=1,zero=1"`; omitted degrees default to 1 (dp: derived)."""
    values: dict[str, Any] = {}
    for key, raw in key_values(text, PLAN_STRING_KEYS, what="plan", example="tp=8,pp=4,ep=8"):
        try:
            number = int(raw)
        except ValueError:
            raise TrexError(f"plan value {key}={raw!r} is not an integer") from None
        if number < (0 if key == "zero" else 1):
            raise TrexError(f"plan value {key}={number} must be {'>= 0' if key == 'zero' else 'a positive integer'}")
        values[key] = number
    return ParallelConfig(**values, **training)


def validate(plan: ParallelConfig, spec: ModelSpec, devices: int) -> list[str]:
    """Every violated constraint, each with its numbers (empty when the plan is consistent)."""
    problems: list[str] = []
    sizes = {name: getattr(plan, name) for name in ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "mbs", "gbs", "seq")}
    not_positive = [
        f"{name}={value} must be a positive integer"
        for name, value in sizes.items()
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1)
    ]
    if not_positive:
        return not_positive  # every count below divides by these
    if plan.grad_reduce_op not in ("auto", "all_reduce", "reduce_scatter"):
        problems.append(f"grad_reduce_op={plan.grad_reduce_op!r} must be auto, all_reduce or reduce_scatter")
    if plan.grad_reduce_calls is not None and any(
        not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in plan.grad_reduce_calls
    ):
        problems.append(f"grad_reduce_calls={plan.grad_reduce_calls} must be two non-negative integers")
    dp = plan.dp
    if dp is None:
        if devices % (plan.tp * plan.pp * plan.cp):
            problems.append(
                f"tp*pp*cp = {plan.tp}*{plan.pp}*{plan.cp} = {plan.tp * plan.pp * plan.cp} does not divide the {devices} devices"
            )
            return problems
        dp = devices // (plan.tp * plan.pp * plan.cp)
    if plan.tp * plan.pp * plan.cp * dp != devices:
        problems.append(
            f"tp*pp*cp*dp = {plan.tp}*{plan.pp}*{plan.cp}*{dp} = {plan.tp * plan.pp * plan.cp * dp} differs from the {devices} devices"
        )
    if plan.zero not in (0, 1, 2, 3):
        problems.append(f"zero={plan.zero}: ZeRO stages are 0, 1, 2 or 3")
    heads = [core.heads for layer in spec.layers for core in layer.attention if core.v_head_dim]
    if heads and min(heads) % plan.tp:
        problems.append(f"tp={plan.tp} does not divide the {min(heads)} attention heads")
    if plan.sequence_parallel and plan.tp > 1 and (plan.seq // plan.cp) % plan.tp:
        problems.append(f"sequence parallelism needs tp={plan.tp} to divide seq/cp = {plan.seq // plan.cp}")
    if plan.tp_comm_overlap and plan.tp > 1 and not plan.sequence_parallel:
        problems.append(
            "tp_comm_overlap overlaps the sequence-parallel all-gathers and reduce-scatters: it needs sequence_parallel=true"
        )
    if plan.seq % (2 * plan.cp if plan.cp > 1 else 1):
        problems.append(f"cp={plan.cp} needs seq={plan.seq} divisible by 2*cp (load-balanced causal split)")
    chunks = plan.pp * plan.vpp
    if plan.layers_per_chunk is not None:
        if len(plan.layers_per_chunk) != chunks:
            problems.append(f"layers_per_chunk has {len(plan.layers_per_chunk)} entries for pp*vpp = {chunks} chunks")
        if sum(plan.layers_per_chunk) != spec.num_layers:
            problems.append(
                f"layers_per_chunk sums to {sum(plan.layers_per_chunk)} but the model has {spec.num_layers} layers"
            )
    elif chunks > spec.num_layers + 2:
        problems.append(
            f"pp*vpp = {plan.pp}*{plan.vpp} = {chunks} chunks exceed the {spec.num_layers} layers (+ an embedding and a head chunk)"
        )
    if plan.vpp > 1 and plan.pp == 1:
        problems.append("vpp > 1 needs pp > 1 (virtual stages interleave a pipeline)")
    per_step = plan.mbs * dp
    if plan.gbs % per_step:
        problems.append(f"gbs={plan.gbs} is not a multiple of mbs*dp = {plan.mbs}*{dp} = {per_step}")
    elif plan.vpp > 1 and (plan.gbs // per_step) % plan.pp:
        problems.append(
            f"interleaved schedule needs the {plan.gbs // per_step} micro-batches per step to be a multiple of pp={plan.pp}"
        )
    moe = next((layer.moe for layer in spec.layers if layer.moe), None)
    if moe is None:
        if plan.ep > 1 or plan.etp > 1:
            problems.append(f"ep={plan.ep}, etp={plan.etp} but {spec.name} has no MoE layers")
    else:
        if moe.num_experts % plan.ep:
            problems.append(f"ep={plan.ep} does not divide the {moe.num_experts} experts")
        stage = plan.tp * plan.cp * dp
        if stage % (plan.ep * plan.etp):
            problems.append(
                f"ep*etp = {plan.ep}*{plan.etp} = {plan.ep * plan.etp} does not divide the tp*cp*dp = {stage} data-parallel ranks of a stage"
            )
        if moe.expert_ffn % plan.etp:
            problems.append(f"etp={plan.etp} does not divide the expert width {moe.expert_ffn}")
    if plan.recompute_mode not in ("none", "selective", "full"):
        problems.append(f"recompute={plan.recompute!r}: use none, selective, full or selective:<module>+<module>")
    unknown = plan.recompute_modules - set(RECOMPUTE_MODULES)
    if unknown:
        problems.append(
            f"unknown recompute module(s) {', '.join(sorted(unknown))}; known: {', '.join(RECOMPUTE_MODULES)}"
        )
    if plan.moe_imbalance < 1.0:
        problems.append(f"moe_imbalance={plan.moe_imbalance} must be >= 1 (it is max/mean load)")
    for name, allowed in _choices().items():
        value = getattr(plan, name)
        if value not in allowed:
            problems.append(f"{name}={value!r}: use one of {', '.join(allowed)}")
    return problems


def _choices() -> dict[str, tuple[str, ...]]:
    """The fields whose values come from a fixed set (their Literal types), with that set: a value
    outside it would otherwise be priced as some default without a word."""
    global _CHOICES
    if _CHOICES is None:
        hints = typing.get_type_hints(ParallelConfig)
        _CHOICES = {
            f.name: typing.get_args(hints[f.name])
            for f in dataclasses.fields(ParallelConfig)
            if typing.get_origin(hints[f.name]) is Literal
        }
    return _CHOICES


_CHOICES: dict[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class RankLayout:
    """Global ranks of the groups a rank belongs to, in Megatron's tp-cp-dp-pp order."""

    plan: ParallelConfig
    groups: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (size, stride) of rank 0's group

    @classmethod
    def of(cls, plan: ParallelConfig) -> RankLayout:
        tp, cp, dp, pp = plan.tp, plan.cp, plan.data_parallel, plan.pp
        stage = tp * cp * dp
        groups = {
            "tp": (tp, 1),
            "cp": (cp, tp),
            "dp": (dp, tp * cp),
            "pp": (pp, stage),
            "etp": (plan.etp, 1),
            "ep": (plan.ep, plan.etp),
            "edp": (plan.edp, plan.etp * plan.ep),
            "tp_cp_dp": (stage, 1),
        }
        return cls(plan, groups)

    def ranks(self, kind: str, start: int = 0) -> tuple[int, ...]:
        size, stride = self.groups[kind]
        return tuple(start + stride * i for i in range(size))
