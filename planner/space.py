"""The search space: which degrees, batch splits and recompute policies the planner enumerates.

A candidate is (tp, cp, ep, etp, micro-batch, recompute) - the layer-level choice, priced once per
layer kind - times (pp, vpp, ZeRO stage) - the pipeline layout - plus the stage split the splitter
finds for it. Only combinations the cost model accepts are enumerated:

* tp divides the attention heads (and, with sequence parallelism, the sequence shard) and stays
  inside a bounded domain of the cluster (a node or supernode: never over the scale-out network);
* cp splits the sequence in 2*cp load-balanced pieces; tp*cp*pp divides the devices;
* ep divides the routed experts, etp the expert width and tp; ep*etp divides a stage's tp*cp*dp ranks;
* the global batch is a whole number of micro-batches per data-parallel rank, a multiple of pp
  for interleaved schedules; pp*vpp chunks fit the layers plus an embedding and a head chunk;
* tensor- and expert-parallel groups sit inside the fastest tier that holds them (`topology`).

`SearchSpace` holds the candidate values of each dimension. Left open (None), a dimension takes
every valid value, except three defaults that keep the search inside what practice uses and the
cost model can still rank sensibly: tp <= 16, cp shards of at least 1024 tokens (and cp <= 8), and
expert tensor parallelism either off or equal to tp (Megatron's two usual settings). `--fix
tp=1,ep=64` (or `--fix cp=16`) on the command line narrows or widens a dimension to given values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from trex.cost_model.caveats import rows_per_local_expert
from trex.cost_model.cluster import Cluster
from trex.cost_model.model_spec import RECOMPUTE_MODULES, ModelSpec
from trex.cost_model.parallel import ParallelConfig, key_values
from trex.errors import TrexError
from trex.planner.pricing import LayerChoice
from trex.planner.topology import placement_problems

# Recompute policies tried by default (Megatron's --recompute-modules names), cheapest memory saving
# first. Policies that drop nothing a model has collapse into one (see `recompute_options`).
DEFAULT_RECOMPUTE = (
    "none",
    "selective:core_attn",  # Megatron's default selective recompute
    "selective:moe_act",
    "selective:layernorm+moe_act",  # Megatron-MoE's "norm, act" (Qwen3 / DeepSeek best practice)
    "selective:mla_up_proj",
    "selective:mla_up_proj+moe_act",
    "selective:mla_up_proj+mlp",  # Megatron-Bridge's DeepSeek-V3 recipe
    "selective:layernorm+mlp",
    "selective:moe",
    "full",
)

_DIMENSIONS = ("tp", "pp", "vpp", "ep", "etp", "cp", "zero", "mbs", "recompute")
MAX_TP = 16  # default cap on tensor parallelism
MAX_CP = 8  # default cap on context parallelism ...
MIN_CP_TOKENS = 1024  # ... and on how short a context-parallel shard may get


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    zero: tuple[int, ...] = (1, 0, 2, 3)
    mbs: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] | None = None
    # fewest rows a local expert's GEMMs may get per micro-batch (trex.cost_model.caveats.rows_per_local_expert);
    # None: any. The cost model prices layouts below 2048 rows optimistically (caveats.SMALL_EXPERT_ROWS).
    min_expert_rows: int | None = None

    @classmethod
    def parse(cls, text: str) -> SearchSpace:
        """ "tp=1,ep=32/64,recompute=full": fix dimensions to one value or to '/'-separated values;
        "min_expert_rows=2048" keeps only layouts whose experts get at least that many rows."""
        values: dict[str, tuple | int] = {}
        for key, raw in key_values(
            text, (*_DIMENSIONS, "min_expert_rows"), what="--fix", example="tp=1,ep=32/64,recompute=full"
        ):
            if key == "min_expert_rows":
                if not raw.isdigit():
                    raise TrexError(
                        f"--fix min_expert_rows={raw}: give one non-negative integer, e.g. min_expert_rows=2048"
                    )
                values[key] = int(raw)
                continue
            options = [v.strip() for v in raw.split("/") if v.strip()]
            if not options:
                raise TrexError(f"--fix {key}=: give at least one value")
            if key == "recompute":
                values[key] = tuple(options)
                continue
            try:
                numbers = tuple(int(v) for v in options)
            except ValueError:
                raise TrexError(f"--fix {key}={raw}: values must be integers") from None
            if any(n < (0 if key == "zero" else 1) for n in numbers):
                raise TrexError(f"--fix {key}={raw}: values must be {'>= 0' if key == 'zero' else 'positive'}")
            values[key] = numbers
        return dataclasses.replace(cls(), **values)

    def describe(self) -> str:
        parts = []
        for name in _DIMENSIONS:
            value = getattr(self, name)
            if value is not None and value != getattr(SearchSpace(), name):
                parts.append(f"{name}={'/'.join(str(v) for v in value)}")
        if self.min_expert_rows is not None:
            parts.append(f"min_expert_rows={self.min_expert_rows}")
        return ",".join(parts) or "(all valid values)"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pick(allowed: tuple | None, natural: list) -> list:
    return natural if allowed is None else [v for v in natural if v in allowed]


def model_facts(spec: ModelSpec) -> tuple[int, int | None, int | None]:
    """(smallest attention head count, routed experts, expert width) the degrees must divide."""
    heads = [core.heads for layer in spec.layers for core in layer.attention if core.v_head_dim]
    moe = next((layer.moe for layer in spec.layers if layer.moe), None)
    return (min(heads) if heads else 1, moe.num_experts if moe else None, moe.expert_ffn if moe else None)


def _effective(spec: ModelSpec, recompute: str) -> frozenset[str] | str:
    """What a policy really drops on this model (policies with the same effect are one)."""
    plan = ParallelConfig(recompute=recompute)
    if plan.recompute_mode == "full":
        return "full"
    present = {"core_attn"}
    for layer in spec.layer_kinds.values():
        present |= {x.tag for x in (*layer.linears, *layer.pointwise, *layer.saved) if x.tag}
    modules = set(plan.recompute_modules)
    if "moe" in modules:
        modules.add("moe_act")
    return frozenset(modules & present)


def recompute_options(spec: ModelSpec, space: SearchSpace, template: ParallelConfig) -> list[str]:
    """The policies to try, one per distinct effect on this model; the template's own policy included."""
    if space.recompute is not None:
        wanted = list(space.recompute)
        for policy in wanted:
            unknown = ParallelConfig(recompute=policy).recompute_modules - set(RECOMPUTE_MODULES)
            if ParallelConfig(recompute=policy).recompute_mode not in ("none", "selective", "full") or unknown:
                raise TrexError(
                    f"recompute policy {policy!r}: use none, selective, full or selective:<module>+<module> "
                    f"with modules from {', '.join(RECOMPUTE_MODULES)}"
                )
    else:
        wanted = list(DEFAULT_RECOMPUTE)
        if template.recompute not in wanted:
            wanted.insert(1, template.recompute)
    seen: dict[object, str] = {}
    for policy in wanted:
        effect = _effective(spec, policy)
        seen.setdefault(effect, _name(effect))
    return list(seen.values())


def _name(effect: frozenset[str] | str) -> str:
    """A policy named by what it drops on the model ("selective:layernorm+moe_act"), "none" or "full"."""
    if effect == "full":
        return "full"
    if not effect:
        return "none"
    return "selective:" + "+".join(m for m in RECOMPUTE_MODULES if m in effect)


def largest_bounded_domain(cluster: Cluster) -> int:
    return max((t.size for t in cluster.tiers if t.size is not None), default=cluster.devices)


@dataclass(frozen=True)
class PipelineOption:
    pp: int
    vpp: int
    dp: int
    microbatches: int


def layer_choices(
    spec: ModelSpec, cluster: Cluster, template: ParallelConfig, space: SearchSpace
) -> Iterator[LayerChoice]:
    """Every (tp, cp, ep, etp, mbs) with recompute "none" that some pipeline layout can complete."""
    devices, seq = cluster.devices, template.seq
    heads, experts, width = model_facts(spec)
    tp_limit = min(largest_bounded_domain(cluster), devices)
    tps = [d for d in _divisors(devices) if heads % d == 0 and d <= tp_limit]
    for tp in _pick(space.tp, [d for d in tps if space.tp is not None or d <= MAX_TP]):
        cps = _divisors(devices // tp)
        for cp in _pick(
            space.cp, [c for c in cps if space.cp is not None or c == 1 or (c <= MAX_CP and seq // c >= MIN_CP_TOKENS)]
        ):
            if cp > 1 and seq % (2 * cp):
                continue
            if template.sequence_parallel and tp > 1 and (seq // cp) % tp:
                continue
            for ep in _pick(space.ep, _divisors(experts) if experts else [1]):
                etps = (
                    [
                        d
                        for d in _divisors(tp)
                        if (width is None or width % d == 0) and (space.etp is not None or d in (1, tp))
                    ]
                    if experts
                    else [1]
                )
                for etp in _pick(space.etp, etps):
                    if placement_problems(cluster, tp, ep, etp):
                        continue
                    for mbs in _pick(space.mbs, sorted(set(space.mbs))):
                        if (
                            space.min_expert_rows
                            and experts
                            and (
                                rows_per_local_expert(
                                    spec, dataclasses.replace(template, tp=tp, cp=cp, ep=ep, etp=etp, mbs=mbs)
                                )
                                or 0
                            )
                            < space.min_expert_rows
                        ):
                            continue
                        choice = LayerChoice(tp, cp, ep, etp, mbs, "none")
                        if any(True for _ in pipeline_options(spec, cluster, template, space, choice)):
                            yield choice


def pipeline_options(
    spec: ModelSpec, cluster: Cluster, template: ParallelConfig, space: SearchSpace, choice: LayerChoice
) -> Iterator[PipelineOption]:
    """Every (pp, vpp) completing `choice` into a plan the cost model accepts (ZeRO stages aside)."""
    devices, layers = cluster.devices, spec.num_layers
    per_replica = choice.tp * choice.cp
    for pp in _pick(space.pp, _divisors(devices // per_replica)):
        if pp > layers + 2:
            continue
        dp = devices // (per_replica * pp)
        if (choice.tp * choice.cp * dp) % (choice.ep * choice.etp):
            continue
        if template.gbs % (choice.mbs * dp):
            continue
        m = template.gbs // (choice.mbs * dp)
        for vpp in _pick(space.vpp, list(range(1, (layers + 2) // pp + 1)) if pp > 1 else [1]):
            if pp * vpp > layers + 2:
                continue
            if vpp > 1 and m % pp:
                continue
            yield PipelineOption(pp, vpp, dp, m)


def zero_options(space: SearchSpace, choice: LayerChoice, option: PipelineOption) -> list[int]:
    """ZeRO stages that differ: with one data-parallel and one expert-data-parallel rank there is
    nothing to shard, so only the plain stage is kept."""
    stage_ranks = choice.tp * choice.cp * option.dp
    if option.dp * choice.cp == 1 and stage_ranks // (choice.ep * choice.etp) == 1:
        return [min(space.zero)]
    return list(space.zero)
