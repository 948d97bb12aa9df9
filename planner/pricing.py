"""Layer costs priced once per layer-level choice, and what the stage splitter needs from them.

A layer's cost under a plan (`trex.cost_model.layer_cost`) depends only on the layer-level choices
- tp, cp, ep, etp, micro-batch, recompute, and the software settings - not on pp, vpp, dp, ZeRO or
the stage split. `PricedLayers` prices each layer kind, the embedding and the head once per
`LayerChoice`; the search then

* bounds every pipeline layout built on that choice from below (`step_lower_bound`), to prune,
* gives the stage splitter the time of any chunk (`chunk_time`: the same sums `estimate_step` forms,
  host-bound stretches included) and the memory of any device (`Layout`, a `MemoryBudget`).

The price of a finished candidate is always `trex.cost_model.estimate_step` itself; tests/planner
check that the chunk times and memory here equal the estimate's on the plans the planner returns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from trex.cost_model import collectives
from trex.cost_model.cluster import Cluster
from trex.cost_model.layer_cost import CostContext, LayerCost, embedding_cost, head_cost, layer_cost
from trex.cost_model.memory import MemoryEstimate, ParamCounts, activation_memory, static_memory
from trex.cost_model.model_spec import ModelSpec
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.pipeline import in_flight
from trex.cost_model.step import (
    _layer_params as layer_params,
)  # the parameters a device holds of one layer (as estimate_step counts them)

try:  # host-bound stretches (trex.cost_model.host); a cost model without them has no host wait
    from trex.cost_model.host import chunk_host_wait
except ImportError:  # pragma: no cover - depends on the cost model's version
    chunk_host_wait = None


@dataclass(frozen=True, order=True)
class LayerChoice:
    """The plan choices a layer's cost depends on."""

    tp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    recompute: str

    def label(self) -> str:
        return f"tp={self.tp},cp={self.cp},ep={self.ep},etp={self.etp},mbs={self.mbs},recompute={self.recompute}"


def _device_time(cost: LayerCost) -> float:
    """Forward + backward (recompute included) + the communication the layer cannot hide."""
    return cost.forward_s + cost.comm_forward_s + cost.backward_s + cost.recompute_s + cost.comm_backward_s


@dataclass(frozen=True)
class ChunkFacts:
    """One chunk for one micro-batch: its time (pipeline sends aside), the parameters it holds, what it saves."""

    time: float
    params: ParamCounts
    saved: float


class PricedLayers:
    """Every layer kind, the embedding and the head priced once under one `LayerChoice`.

    A chunk's time, parameters and saved activations depend only on how many layers of each kind
    it holds and whether it carries the embedding or the head, so they are computed once per
    (kind counts, ends) with the cost model's own functions and reused by every split and layout.
    """

    def __init__(self, spec: ModelSpec, cluster: Cluster, template: ParallelConfig, choice: LayerChoice):
        self.spec, self.cluster, self.choice = spec, cluster, choice
        # Layer costs do not depend on dp; RankLayout needs one to lay out the expert groups.
        dp = max(1, cluster.devices // (choice.tp * choice.cp))
        self.plan = dataclasses.replace(
            template,
            tp=choice.tp,
            cp=choice.cp,
            ep=choice.ep,
            etp=choice.etp,
            mbs=choice.mbs,
            recompute=choice.recompute,
            pp=1,
            vpp=1,
            dp=dp,
            layers_per_chunk=None,
        )
        self.ctx = CostContext.of(self.plan, cluster)
        hidden = spec.hidden_size
        self.kinds: dict[str, LayerCost] = {
            kind: layer_cost(layer, hidden, self.ctx) for kind, layer in spec.layer_kinds.items()
        }
        self.kind_names = tuple(self.kinds)
        self.embed = embedding_cost(spec, self.ctx)
        self.head = head_cost(spec, self.ctx, 1 + len(spec.mtp_layers))
        self.tail: list[tuple[LayerCost, int]] = [(self.kinds[layer.kind], 1) for layer in spec.mtp_layers] + [
            (self.head, 1)
        ]
        main = {kind: sum(1 for layer in spec.layers if layer.kind == kind) for kind in self.kind_names}
        self.body_kinds = tuple(kind for kind, n in main.items() if n)
        self.embed_time = _device_time(self.embed)
        self.tail_time = sum(_device_time(cost) * n for cost, n in self.tail)
        self.body_time = sum(_device_time(self.kinds[kind]) * n for kind, n in main.items())
        # the cost model charges every device the largest transient buffer of any part of the step
        self.transient = max(p.transient_bytes for p in (*self.kinds.values(), self.embed, self.head))
        self._chunks: dict[tuple, ChunkFacts] = {}

    @property
    def total_time(self) -> float:
        """One micro-batch through the whole model on one device's shard (host waits aside: a lower bound)."""
        return self.body_time + self.embed_time + self.tail_time

    def step_lower_bound(self, devices: int, gbs: int) -> float:
        """No pp, vpp, ZeRO stage or split built on this choice steps faster than this.

        The pipeline lasts at least m * mean_d t_d = m * T / pp with m = gbs / (mbs * dp) and
        dp = devices / (tp * cp * pp), i.e. gbs * tp * cp * T / (devices * mbs) whatever pp is; host
        waits, the bubble, the data-parallel sync and the optimizer only add to it.
        """
        c = self.choice
        return gbs * c.tp * c.cp * self.total_time / (devices * c.mbs)

    @cached_property
    def layer_times(self) -> tuple[float, ...]:
        """Additive per-layer time (host waits aside): the splitter's lower bounds."""
        per_kind = {kind: _device_time(cost) for kind, cost in self.kinds.items()}
        return tuple(per_kind[layer.kind] for layer in self.spec.layers)

    @cached_property
    def _kind_prefix(self) -> list[tuple[int, ...]]:
        index = {kind: i for i, kind in enumerate(self.kind_names)}
        rows = [(0,) * len(index)]
        for layer in self.spec.layers:
            row = list(rows[-1])
            row[index[layer.kind]] += 1
            rows.append(tuple(row))
        return rows

    @cached_property
    def kind_params(self) -> dict[str, ParamCounts]:
        return {
            kind: layer_params(layer, self.spec.hidden_size, self.plan) for kind, layer in self.spec.layer_kinds.items()
        }

    def kind_counts(self, start: int, end: int) -> tuple[int, ...]:
        prefix = self._kind_prefix
        return tuple(b - a for a, b in zip(prefix[start], prefix[end]))

    def chunk(self, start: int, end: int, first: bool, last: bool, pp: int) -> ChunkFacts:
        """Time, parameters and saved bytes of layers [start, end) (+ embedding / head), as estimate_step sums them."""
        key = (start, end, first, last, pp > 1)
        facts = self._chunks.get(key)
        if facts is None:
            counts = self.kind_counts(start, end)
            by_counts = (counts, first, last, pp > 1)
            facts = self._chunks.get(by_counts)
            if facts is None:
                facts = self._chunk_facts(counts, first, last, pp)
                self._chunks[by_counts] = facts
            self._chunks[key] = facts
        return facts

    def _chunk_facts(self, counts: tuple[int, ...], first: bool, last: bool, pp: int) -> ChunkFacts:
        parts = [(self.kinds[k], n) for k, n in zip(self.kind_names, counts) if n]
        params = ParamCounts()
        for kind, n in zip(self.kind_names, counts):
            if n:
                params = params + self.kind_params[kind].scaled(n)
        spec = self.spec
        if first:
            parts.append((self.embed, 1))
            params = params + ParamCounts(dense=spec.embedding_params / self.choice.tp)
        if last:
            parts.extend(self.tail)
            for layer in spec.mtp_layers:
                params = params + self.kind_params[layer.kind]
            head_weights = spec.head_params or (spec.vocab_size * spec.hidden_size if pp > 1 else 0)
            params = params + ParamCounts(dense=head_weights / self.choice.tp + spec.final_norm_params)
        time = sum(_device_time(cost) * n for cost, n in parts)
        if chunk_host_wait is not None and parts:
            wait_f, wait_b = chunk_host_wait(parts)
            time += wait_f + wait_b
        return ChunkFacts(time, params, sum(cost.saved_bytes * n for cost, n in parts))

    def total_params(self, pp: int) -> ParamCounts:
        """Every parameter one pipeline replica holds, summed over its devices (one device per stage)."""
        return self.chunk(0, self.spec.num_layers, True, True, pp).params

    @cached_property
    def total_saved(self) -> float:
        """Saved bytes of one micro-batch through the whole model (embedding, layers, MTP, head)."""
        return self.chunk(0, self.spec.num_layers, True, True, 2).saved


class Layout:
    """A pipeline layout (pp, vpp, ZeRO stage) on one `PricedLayers`: the splitter's time and memory.

    The search builds tens of thousands of these, so the derived quantities are plain numbers and
    the `ParallelConfig` is only built when asked for.
    """

    def __init__(self, layers: PricedLayers, pp: int, vpp: int, zero: int, devices: int, shared: dict | None = None):
        self.layers, self.pp, self.vpp, self.zero, self.devices = layers, pp, vpp, zero, devices
        # static memory depends only on the sharding, not on the micro-batch or recompute: layouts
        # of one search share it through `shared`
        self._shared = shared if shared is not None else {}
        c = layers.choice
        template = layers.plan
        self.dp = devices // (c.tp * c.cp * pp)
        self.edp = c.tp * c.cp * self.dp // (c.ep * c.etp)
        self.microbatches = template.gbs // (c.mbs * self.dp)
        self.chunks = pp * vpp
        self._chunk_bytes: dict[
            tuple[int, int, int], float
        ] = {}  # (chunk, start, end) -> its share of a device's memory
        self.capacity = layers.cluster.device.usable_memory_bytes
        self.muon = (template.optimizer if template.optimizer != "auto" else layers.spec.optimizer) == "muon"
        self.overlap_p2p = template.overlap_p2p
        self._in_flight: list[list[int]] | None = None
        self._p2p: float | None = None

    @cached_property
    def plan(self) -> ParallelConfig:
        return dataclasses.replace(self.layers.plan, pp=self.pp, vpp=self.vpp, zero=self.zero, dp=self.dp)

    @property
    def p2p(self) -> float:
        """One pipeline send of a micro-batch's activations between neighbouring stages."""
        if self._p2p is None:
            if self.pp == 1:
                self._p2p = 0.0
            else:
                c, spec = self.layers.choice, self.layers.spec
                tier = self.layers.cluster.tier_between(0, c.tp * c.cp * self.dp)
                self._p2p = collectives.send_recv(
                    self.layers.ctx.sp_tokens * spec.hidden_size * spec.residual_streams * 2.0, tier
                )
        return self._p2p

    @property
    def exposed_p2p(self) -> float:
        return 0.0 if (self.overlap_p2p or self.pp == 1) else self.p2p

    def chunk_time(self, start: int, end: int, chunk: int) -> float:
        """Forward + backward of chunk `chunk` holding layers [start, end), per micro-batch (estimate_step's sum)."""
        return self.layers.chunk(start, end, chunk == 0, chunk == self.chunks - 1, self.pp).time + 2 * self.exposed_p2p

    @property
    def in_flight(self) -> list[list[int]]:
        if self._in_flight is None:
            self._in_flight = [in_flight(d, self.pp, self.vpp, self.microbatches) for d in range(self.pp)]
        return self._in_flight

    def static_memory(self, params: ParamCounts, *, bound: bool = False) -> tuple[float, float, float]:
        """Weights, gradients and optimizer states of these parameters (`trex.cost_model.memory`)."""
        if bound and self.muon:  # Muon's share of the state (one moment, not two) taken as large as it can be
            params = ParamCounts(params.dense, params.expert, params.total, params.fp8_gemm)
        template = self.layers.plan
        return static_memory(
            params,
            dp=self.dp * self.layers.choice.cp,
            edp=self.edp,
            zero=self.zero,
            precision=template.precision,
            grad_dtype=template.grad_dtype,
            state_dtype=template.optimizer_state_dtype,
            muon=self.muon,
        )

    def _holdings(self, device: int, ranges: Sequence[tuple[int, int]]) -> tuple[ParamCounts, list[float]]:
        """The parameters of a device's chunks, summed, and each chunk's saved bytes per micro-batch."""
        dense = expert = muon = fp8 = 0.0
        saved = []
        layers, pp, last_chunk = self.layers, self.pp, self.chunks - 1
        for j, (start, end) in enumerate(ranges):
            chunk = device + j * pp
            facts = layers.chunk(start, end, chunk == 0, chunk == last_chunk, pp)
            p = facts.params
            dense += p.dense
            expert += p.expert
            muon += p.muon
            fp8 += p.fp8_gemm
            saved.append(facts.saved)
        return ParamCounts(dense, expert, muon, fp8), saved

    def device_memory(self, device: int, ranges: Sequence[tuple[int, int]], *, bound: bool = False) -> MemoryEstimate:
        """Memory of `device` holding these chunk ranges, as `estimate_step` counts it. `bound=True`
        is a lower bound that grows with every layer added (for pruning partial assignments)."""
        params, saved = self._holdings(device, ranges)
        weights, grads, states = self.static_memory(params, bound=bound)
        acts = activation_memory(saved, self.in_flight[device][: len(saved)])
        return MemoryEstimate(weights, grads, states, acts, self.layers.transient, self.capacity)

    @property
    def _sharding(self) -> tuple:
        c = self.layers.choice
        return (c.tp, c.ep, c.etp, self.pp > 1, self.dp * c.cp, self.edp, self.zero)

    def _static_bound(self, what: str) -> float:
        """Linear lower bound of the static memory of: the whole model ("total"), the embedding
        chunk ("embed"), the head chunk ("tail"), or one layer of a kind."""
        key = (self._sharding, what)
        value = self._shared.get(key)
        if value is None:
            layers = self.layers
            if what == "total":
                params = layers.total_params(self.pp)
            elif what == "embed":
                params = layers.chunk(0, 0, True, False, self.pp).params
            elif what == "tail":
                params = layers.chunk(0, 0, False, True, self.pp).params
            else:
                params = layers.kind_params[what]
            value = sum(self.static_memory(params, bound=True))
            self._shared[key] = value
        return value

    def mean_memory_bound(self) -> float:
        """No split gets the fullest device below this: the devices' mean memory, with every layer's
        activations held by the fewest micro-batches any chunk keeps in flight."""
        # warm-up shrinks towards the last stage and later local chunks hold fewer micro-batches:
        # the last device's last chunk holds the fewest (Megatron's schedule, `in_flight`)
        fewest = in_flight(self.pp - 1, self.pp, self.vpp, self.microbatches)[-1]
        return (self._static_bound("total") + self.layers.total_saved * fewest) / self.pp + self.layers.transient

    def count_bound_fits(self) -> bool:
        """Could any split fit? A layer on device d's j-th chunk costs at least the cheapest kind's
        parameters plus its activations times the micro-batches that chunk keeps in flight. Each
        middle chunk holds at least one layer at its own slot's cost; past those, a device can take at
        most (capacity - what it must hold) / (its cheapest slot) more; together they must hold the stack."""
        layers, pp, vpp, chunks = self.layers, self.pp, self.vpp, self.chunks
        capacity = self.capacity - layers.transient
        kinds = [(self._static_bound(kind), layers.kinds[kind].saved_bytes) for kind in layers.body_kinds]
        if not kinds:
            return True
        room = 0
        for d in range(pp):
            flights = self.in_flight[d]
            fixed = 0.0
            if d == 0:
                fixed += self._static_bound("embed") + layers.chunk(0, 0, True, False, pp).saved * flights[0]
            if d == (chunks - 1) % pp:
                fixed += self._static_bound("tail") + layers.chunk(0, 0, False, True, pp).saved * flights[vpp - 1]
            slot = [min(static + saved * flights[j] for static, saved in kinds) for j in range(vpp)]
            mandatory = [j for j in range(vpp) if d + j * pp not in (0, chunks - 1)]
            left = capacity - fixed - sum(slot[j] for j in mandatory)
            if left < 0:
                return False
            cheapest = min(slot)
            room += len(mandatory) + (math.floor(left / cheapest) if cheapest > 0 else layers.spec.num_layers)
        return room >= layers.spec.num_layers

    # -- trex.planner.stage_split.MemoryBudget ------------------------------------------
    def fits(self, device: int, ranges: Sequence[tuple[int, int]]) -> bool:
        return self.device_memory(device, ranges).fits

    def lower_bound_fits(self, device: int, ranges: Sequence[tuple[int, int]]) -> bool:
        return self.device_memory(device, ranges, bound=True).fits

    def signature(self, device: int, ranges: Sequence[tuple[int, int]]) -> object:
        return tuple(self.layers.kind_counts(start, end) for start, end in ranges)

    def excess(self, device: int, ranges: Sequence[tuple[int, int]]) -> float:
        """`device_memory(device, ranges).total - capacity`: the stage splitter's local search asks this
        millions of times, for ranges that differ from the last ask in one chunk. Without Muon the
        static memory is linear in the parameters, so it is a sum of per-chunk shares, each computed
        once (equal to the estimate up to rounding); with Muon (whose optimizer-state share mixes the
        device's parameters) it is the estimate's arithmetic without building the estimate."""
        if self.muon:
            params, saved = self._holdings(device, ranges)
            weights, grads, states = self.static_memory(params)
            acts = 0.0
            for held, count in zip(saved, self.in_flight[device]):
                acts += held * count
            return weights + grads + states + acts + self.layers.transient - self.capacity
        total = self.layers.transient - self.capacity
        shares, pp = self._chunk_bytes, self.pp
        for j, (start, end) in enumerate(ranges):
            chunk = device + j * pp
            key = (chunk, start, end)
            share = shares.get(key)
            if share is None:
                facts = self.layers.chunk(start, end, chunk == 0, chunk == self.chunks - 1, pp)
                share = shares[key] = sum(self.static_memory(facts.params)) + facts.saved * self.in_flight[device][j]
            total += share
        return total
