"""Branch and bound over parallel plans, priced by the cost model.

    result = search(spec, cluster, template)       # template: seq, gbs, precision, software settings
    result.best.estimate.step_time_s, result.runners_up, result.stats

Order of work, cheapest bound first:

1. Enumerate the layer-level choices (tp, cp, ep, etp, micro-batch) the rules allow (`space`),
   price each layer kind once per choice with no recompute, and bound each choice from below: no
   recompute policy, pipeline layout or split makes it faster than (m + (pp - 1)/vpp) * T / pp over
   the layouts whose parameters alone fit in memory (T: one micro-batch through the whole model).
2. Walk the choices in bound order; skip a choice whose bound reaches the time of the K-th best
   plan found so far (K = 1 + runners-up): nothing built on it can enter the result.
3. Per recompute policy (layer kinds priced once more), per (pp, vpp): bound again with that
   policy's T and memory; split the stages for time (`stage_split`) and bound by the split's
   proved lower bound; per ZeRO stage: check memory (re-split under the memory limit when the
   time-optimal split does not fit) and price the plan with `estimate_step` - the only price the
   ranking uses.
4. Interleaved splits the search settled without a proof of optimality are re-solved with the
   full branch-and-bound budget when their bound says a better split could still win; the
   winner also gets Megatron's even split as a rival (a split moves parameters between stages,
   which the data-parallel sync and the optimizer see).

Plans that do not fit are kept as data: the fastest ones (why the winner is not faster) and the one
closest to fitting (what to show when nothing fits).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trex.cost_model.cluster import Cluster
from trex.cost_model.memory import MemoryEstimate
from trex.cost_model.model_spec import ModelSpec
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.pipeline import closed_form_makespan
from trex.cost_model.step import StepEstimate, estimate_step
from trex.errors import TrexError
from trex.planner.pricing import LayerChoice, Layout, PricedLayers
from trex.planner.space import (
    PipelineOption,
    SearchSpace,
    layer_choices,
    pipeline_options,
    recompute_options,
    zero_options,
)
from trex.planner.stage_split import SplitProblem, StageSplit, chunk_ranges, device_times, even_split, split_stages

SEARCH_NODE_BUDGET = (
    0  # while searching, interleaved splits get incumbents and proofs; the winner gets a branch and bound
)
POLISH_NODE_BUDGET = 2_000
UNPROVED_KEPT = 3  # candidates on unproved splits re-split thoroughly when their bound could still win

Progress = Callable[[int, int], None]  # (layer choices done, layer choices in all)


@dataclass(frozen=True)
class Candidate:
    """One complete plan and what pricing it found."""

    plan: ParallelConfig  # dp and layers_per_chunk filled in
    estimate: StepEstimate | None  # None: never fit memory, so never priced by estimate_step
    split: StageSplit
    pipeline_s: float  # the pipeline part of the step
    memory: MemoryEstimate  # the device with the most memory

    @property
    def fits(self) -> bool:
        return self.estimate.feasible if self.estimate is not None else self.memory.fits

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s if self.estimate is not None else self.pipeline_s

    @property
    def layout_key(self) -> tuple[int, ...]:
        """Runners-up differ in these degrees (vpp, ZeRO, micro-batch and recompute are folded in)."""
        p = self.plan
        return (p.tp, p.pp, p.ep, p.etp, p.cp)

    @property
    def overflow(self) -> float:
        """Bytes over the usable memory of the fullest device (<= 0: fits)."""
        return self.memory.total - self.memory.capacity


@dataclass
class SearchStats:
    space_size: int = 0  # complete candidates (layer choice x recompute x pp x vpp x ZeRO) the rules allow
    layer_choices: int = 0  # (tp, cp, ep, etp, mbs)
    layer_pricings: int = 0  # layer-kind pricings (one per choice and recompute policy)
    splits: int = 0  # stage-split problems solved
    splits_unproved: int = 0  # interleaved splits left with a gap to their bound
    candidates_priced: int = 0  # estimate_step calls
    rejected_memory: int = 0  # candidates no split fits in memory
    pruned: int = 0  # candidates skipped by a bound
    seconds: float = 0.0
    exhaustive: bool = True  # False when a time limit stopped the search
    # Certificate: no plan in the space is faster than best / (1 + gap). Non-zero only when some
    # interleaved split kept a gap to its bound and that bound could still beat the winner.
    optimality_gap: float = 0.0

    def to_dict(self) -> dict[str, float | int | bool]:
        return dataclasses.asdict(self)


@dataclass
class SearchResult:
    best: Candidate | None
    runners_up: list[Candidate]
    faster_but_too_big: list[Candidate]  # faster pipelines than the winner that no split fits in memory
    closest: Candidate | None  # the candidate nearest to fitting (what to show when nothing fits)
    stats: SearchStats
    space: SearchSpace
    template: ParallelConfig

    @property
    def feasible(self) -> bool:
        return self.best is not None


@dataclass
class _Board:
    """The best candidate per layout key, and the time a newcomer must beat to matter."""

    keep: int
    by_key: dict[tuple[int, ...], Candidate] = field(default_factory=dict)
    threshold: float = math.inf

    def offer(self, candidate: Candidate) -> None:
        key = candidate.layout_key
        current = self.by_key.get(key)
        if current is None or rank(candidate) < rank(current):
            self.by_key[key] = candidate
            times = sorted(c.step_time_s for c in self.by_key.values())
            self.threshold = times[self.keep - 1] if len(times) >= self.keep else math.inf

    def ranked(self) -> list[Candidate]:
        return sorted(self.by_key.values(), key=rank)


def rank(c: Candidate) -> tuple:
    """Faster first; on a tie the simpler plan (fewer pipeline stages, lower ZeRO stage, less memory)."""
    p = c.plan
    return (round(c.step_time_s, 12), p.pp, p.vpp, p.zero, p.tp, p.cp, c.memory.total)


def _plan(
    template: ParallelConfig, layers: PricedLayers, option: PipelineOption, zero: int, split: StageSplit
) -> ParallelConfig:
    choice = layers.choice
    return dataclasses.replace(
        template,
        tp=choice.tp,
        cp=choice.cp,
        ep=choice.ep,
        etp=choice.etp,
        mbs=choice.mbs,
        recompute=choice.recompute,
        pp=option.pp,
        vpp=option.vpp,
        dp=option.dp,
        zero=zero,
        layers_per_chunk=split.layers_per_chunk,
    )


def pipeline_time(layout: Layout, per_device: tuple[float, ...]) -> float:
    """The pipeline part of the step from per-device times per micro-batch (estimate_step's formula)."""
    t = closed_form_makespan(per_device, layout.plan.microbatches, layout.vpp)
    if layout.pp > 1 and layout.plan.overlap_p2p:
        t += 2 * (layout.pp - 1) * layout.p2p
    return t


def pipeline_bound(layout: Layout, bottleneck: float) -> float:
    """No split whose slowest device takes at least `bottleneck` gives a shorter pipeline."""
    mean = (layout.layers.total_time + 2 * layout.vpp * layout.exposed_p2p * layout.pp) / layout.pp
    t = layout.plan.microbatches * bottleneck + (layout.pp - 1) / layout.vpp * mean
    if layout.pp > 1 and layout.plan.overlap_p2p:
        t += 2 * (layout.pp - 1) * layout.p2p
    return t


def split_problem(layout: Layout) -> SplitProblem:
    layers = layout.layers
    return SplitProblem(
        layers.layer_times,
        layout.pp,
        layout.vpp,
        layers.embed_time + 2 * layout.exposed_p2p,
        layers.tail_time + 2 * layout.exposed_p2p,
        layout.chunk_time,
    )


def solve_split(
    layout: Layout, *, memory: bool, node_budget: int, start: tuple[int, ...] | None = None, thorough: bool = False
) -> StageSplit | None:
    return split_stages(
        split_problem(layout), layout if memory else None, node_budget=node_budget, start=start, thorough=thorough
    )


class _Search:
    def __init__(
        self, spec: ModelSpec, cluster: Cluster, template: ParallelConfig, space: SearchSpace, runners_up: int
    ):
        self.spec, self.cluster, self.template, self.space = spec, cluster, template, space
        self.stats = SearchStats()
        self.board = _Board(keep=1 + max(0, runners_up))
        self.too_big: list[Candidate] = []
        self.closest: Candidate | None = None
        self.unproved: list[
            tuple[float, Candidate]
        ] = []  # the candidate priced on an unproved split whose bound is lowest
        self.priced: dict[LayerChoice, PricedLayers] = {}
        self.static: dict[tuple, bool] = {}
        self.shared: dict = {}  # static-memory bounds shared by every layout with the same sharding
        self.unfit: list[
            tuple[float, LayerChoice, PipelineOption, int]
        ] = []  # layouts no split fits: (memory bound / capacity, ...)
        # with several workers: the smallest K-th best time any worker has (no worker's K-th best is
        # below the global one, so pruning against it stays exact) and the layer choices done
        self.shared_threshold = None
        self.shared_done = None
        self.done = 0

    # -- bookkeeping ---------------------------------------------------------------------------
    def layers(self, choice: LayerChoice) -> PricedLayers:
        if choice not in self.priced:
            self.priced[choice] = PricedLayers(self.spec, self.cluster, self.template, choice)
            self.stats.layer_pricings += 1
        return self.priced[choice]

    def layout(self, layers: PricedLayers, option: PipelineOption, zero: int) -> Layout:
        return Layout(layers, option.pp, option.vpp, zero, self.cluster.devices, self.shared)

    def threshold(self) -> float:
        """What a candidate must beat to matter: the K-th best time found so far (by any worker)."""
        if self.shared_threshold is None:
            return self.board.threshold
        return min(self.board.threshold, self.shared_threshold.value)

    def _publish(self) -> None:
        if self.shared_threshold is not None and self.board.threshold < self.shared_threshold.value:
            with self.shared_threshold.get_lock():
                self.shared_threshold.value = min(self.shared_threshold.value, self.board.threshold)

    def too_big_candidate(self, candidate: Candidate) -> None:
        if (
            self.closest is None
            or candidate.overflow / candidate.memory.capacity < self.closest.overflow / self.closest.memory.capacity
        ):
            self.closest = candidate
        if candidate.pipeline_s < self.threshold():
            self.too_big.append(candidate)
            self.too_big.sort(key=lambda c: c.pipeline_s)
            del self.too_big[8:]

    def static_fits(self, layers: PricedLayers, option: PipelineOption, zero: int) -> bool:
        """Could the parameters, gradients and optimizer states alone fit (averaged over the stages)?"""
        c = layers.choice
        key = (c.tp, c.cp, c.ep, c.etp, option.pp, zero)
        if key not in self.static:
            layout = self.layout(layers, option, zero)
            self.static[key] = layout._static_bound("total") / option.pp <= layout.capacity
        return self.static[key]

    def price(self, plan: ParallelConfig, split: StageSplit) -> Candidate:
        estimate = estimate_step(self.spec, self.cluster, plan)
        self.stats.candidates_priced += 1
        pipeline = estimate.step_time_s - estimate.breakdown.dp_sync_s - estimate.breakdown.optimizer_s
        return Candidate(plan, estimate, split, pipeline, estimate.memory)

    # -- the walk ------------------------------------------------------------------------------
    def run(self, progress: Progress | None, time_limit_s: float | None, workers: int) -> SearchResult:
        started = time.perf_counter()
        spec, cluster, template, space, stats = self.spec, self.cluster, self.template, self.space, self.stats
        if not cluster.device.supports(template.precision):
            raise TrexError(
                f"precision {template.precision} is not supported by {cluster.device.name} (it has {', '.join(sorted(cluster.device.peak_tflops))})"
            )
        policies = recompute_options(spec, space, template)
        base = list(layer_choices(spec, cluster, template, space))
        stats.layer_choices = len(base)
        options = {choice: list(pipeline_options(spec, cluster, template, space, choice)) for choice in base}
        for choice in base:
            stats.space_size += len(policies) * sum(len(zero_options(space, choice, o)) for o in options[choice])
        deadline = started + time_limit_s if time_limit_s is not None else None
        workers = max(1, min(workers, len(base) // 32 or 1))
        report = (
            (lambda: progress(self.done + (self.shared_done.value if self.shared_done is not None else 0), len(base)))
            if progress
            else None
        )
        if workers == 1:
            self.explore(base, options, policies, deadline, report)
        else:
            self._explore_in_workers(base, options, policies, deadline, report, workers)
        if progress:
            progress(len(base), len(base))
        return self._result(started)

    def _explore_in_workers(
        self,
        base: list[LayerChoice],
        options: dict,
        policies: list[str],
        deadline: float | None,
        report: Callable[[], None] | None,
        workers: int,
    ) -> None:
        """Share the layer choices out round-robin; forked workers explore theirs and send back what they found."""
        context = multiprocessing.get_context("fork")
        self.shared_threshold = context.Value("d", math.inf)
        self.shared_done = context.Value("i", 0)
        children = []
        for shard in range(1, workers):
            reader, writer = context.Pipe(duplex=False)
            child = context.Process(
                target=_explore_child,
                args=(self, base[shard::workers], options, policies, deadline, writer),
                daemon=True,
            )
            child.start()
            writer.close()
            children.append((child, reader))
        self.explore(base[0::workers], options, policies, deadline, report)
        for child, reader in children:
            try:
                partial = reader.recv()
            except EOFError:
                raise TrexError(
                    "a planner worker process died before reporting (out of memory?); run with workers=1"
                ) from None
            child.join()
            self._merge(partial)

    def explore(
        self,
        base: list[LayerChoice],
        options: dict,
        policies: list[str],
        deadline: float | None,
        report: Callable[[], None] | None,
    ) -> None:
        """Bound, order and walk these layer choices (the whole search, or one worker's share)."""
        space, stats = self.space, self.stats
        bounded = []
        for choice in base:
            layers = self.layers(choice)
            usable = []
            for option in options[choice]:
                zeros = [z for z in zero_options(space, choice, option) if self.static_fits(layers, option, z)]
                if zeros:
                    usable.append((option, zeros))
                else:
                    stats.rejected_memory += len(zero_options(space, choice, option)) * len(policies)
            if usable:
                bounded.append((min(_mean_bound(layers, o) for o, _ in usable), choice, usable))
            else:
                self._remember_smallest(choice, options[choice])
                self._tick(report)
        bounded.sort(key=lambda item: (item[0], item[1]))
        for bound, choice, usable in bounded:
            self._tick(report)
            if bound >= self.threshold():
                stats.pruned += sum(len(z) for _, z in usable) * len(policies)
                continue
            if deadline is not None and time.perf_counter() > deadline:
                stats.exhaustive = False
                break
            for policy in policies:
                layers = self.layers(dataclasses.replace(choice, recompute=policy))
                for option, zeros in sorted(usable, key=lambda item: _mean_bound(layers, item[0])):
                    if _mean_bound(layers, option) >= self.threshold():
                        stats.pruned += len(zeros)
                        continue
                    self._price_layout(layers, option, zeros)

    def _tick(self, report: Callable[[], None] | None) -> None:
        self.done += 1
        if self.shared_done is not None and report is None:  # a worker: count for the parent's progress bar
            with self.shared_done.get_lock():
                self.shared_done.value += 1
        elif report is not None and self.done % 4 == 0:
            report()

    def _partial(self) -> dict:
        """What a worker found, to send to the parent."""
        return {
            "candidates": list(self.board.by_key.values()),
            "too_big": self.too_big,
            "closest": self.closest,
            "unfit": self.unfit,
            "unproved": self.unproved,
            "stats": self.stats,
        }

    def _merge(self, partial: dict) -> None:
        for candidate in partial["candidates"]:
            self.board.offer(candidate)
        self.too_big = sorted(self.too_big + partial["too_big"], key=lambda c: c.pipeline_s)[:8]
        for candidate in filter(None, [partial["closest"]]):
            if (
                self.closest is None
                or candidate.overflow / candidate.memory.capacity < self.closest.overflow / self.closest.memory.capacity
            ):
                self.closest = candidate
        self.unfit.extend(partial["unfit"])
        self.unproved = sorted(self.unproved + partial["unproved"], key=lambda item: item[0])[:UNPROVED_KEPT]
        for f in dataclasses.fields(SearchStats):
            if f.name in ("space_size", "layer_choices", "seconds", "optimality_gap"):
                continue
            mine, theirs = getattr(self.stats, f.name), getattr(partial["stats"], f.name)
            setattr(self.stats, f.name, (mine and theirs) if isinstance(mine, bool) else mine + theirs)

    def _price_layout(self, layers: PricedLayers, option: PipelineOption, zeros: list[int]) -> None:
        """Price one (layer choice, pp, vpp) for every ZeRO stage worth it."""
        stats, _board = self.stats, self.board
        layouts = {z: self.layout(layers, option, z) for z in zeros}
        capacity = layouts[zeros[0]].capacity
        fitting = [z for z in zeros if layouts[z].mean_memory_bound() <= capacity and layouts[z].count_bound_fits()]
        stats.rejected_memory += len(zeros) - len(fitting)
        if not fitting:
            self.unfit.append((layouts[zeros[-1]].mean_memory_bound() / capacity, layers.choice, option, zeros[-1]))
            return
        free_layout = layouts[fitting[0]]
        free = solve_split(free_layout, memory=False, node_budget=SEARCH_NODE_BUDGET)
        stats.splits += 1
        if free is None:
            return
        stats.splits_unproved += not free.optimal
        free_pipeline = pipeline_time(free_layout, free.device_times)
        floor = pipeline_bound(free_layout, free.lower_bound if not free.optimal else free.bottleneck)
        if floor >= self.threshold():
            stats.pruned += len(fitting)
            return
        measured_floor: float | None = None  # estimate_step's pipeline on the free split: the same for every ZeRO stage
        unfittable: int | None = None  # memory grows as the ZeRO stage drops: below a stage no split fits, none fits
        for zero in sorted(fitting, reverse=True):
            if unfittable is not None and zero < unfittable:
                stats.rejected_memory += 1
                continue
            layout = layouts[zero]
            if (measured_floor if measured_floor is not None and free.optimal else floor) >= self.threshold():
                stats.pruned += 1
                continue
            memories = [
                layout.device_memory(d, r) for d, r in enumerate(chunk_ranges(free.layers_per_chunk, option.pp))
            ]
            split = free
            if not all(m.fits for m in memories):
                worst = max(memories, key=lambda m: m.total)
                fitted = solve_split(layout, memory=True, node_budget=SEARCH_NODE_BUDGET, start=free.layers_per_chunk)
                stats.splits += 1
                if fitted is None:
                    stats.rejected_memory += 1
                    unfittable = zero
                    self.too_big_candidate(
                        Candidate(_plan(self.template, layers, option, zero, free), None, free, free_pipeline, worst)
                    )
                    continue
                stats.splits_unproved += not fitted.optimal
                split = fitted
                if (
                    pipeline_bound(layout, fitted.lower_bound if not fitted.optimal else fitted.bottleneck)
                    >= self.threshold()
                ):
                    stats.pruned += 1
                    continue
            candidate = self.price(_plan(self.template, layers, option, zero, split), split)
            if split is free:
                measured_floor = candidate.pipeline_s
            self._offer(candidate, layout)

    def _offer(self, candidate: Candidate, layout: Layout) -> None:
        if not candidate.fits:  # the cost model's memory disagrees with the splitter's: trust the cost model
            self.too_big_candidate(candidate)
            return
        self.board.offer(candidate)
        self._publish()
        if not candidate.split.optimal:
            gain = candidate.pipeline_s - pipeline_bound(layout, candidate.split.lower_bound)
            self.unproved.append((candidate.step_time_s - max(0.0, gain), candidate))
            self.unproved.sort(key=lambda item: item[0])
            del self.unproved[UNPROVED_KEPT:]  # the most promising: re-split thoroughly at the end

    def _resplit_unproved(self) -> None:
        """Re-split thoroughly the few candidates whose unproved split could still hide a winner."""
        kept, self.unproved = self.unproved, []
        for bound, candidate in kept:
            if bound >= self.threshold():
                self.unproved.append((bound, candidate))
                continue
            plan = candidate.plan
            layout = self.layout(
                self.layers(LayerChoice(plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.recompute)),
                PipelineOption(plan.pp, plan.vpp, plan.data_parallel, plan.microbatches),
                plan.zero,
            )
            split = solve_split(layout, memory=True, node_budget=POLISH_NODE_BUDGET, thorough=True)
            self.stats.splits += 1
            if split is None:
                continue
            if split.layers_per_chunk != plan.layers_per_chunk:
                candidate = self.price(dataclasses.replace(plan, layers_per_chunk=split.layers_per_chunk), split)
                if candidate.fits:
                    self.board.offer(candidate)
            else:
                candidate = dataclasses.replace(candidate, split=split)
            if not split.optimal:
                gain = candidate.pipeline_s - pipeline_bound(layout, split.lower_bound)
                self.unproved.append((candidate.step_time_s - max(0.0, gain), candidate))

    # -- nothing fits --------------------------------------------------------------------------
    def _remember_smallest(self, choice: LayerChoice, options: list[PipelineOption]) -> None:
        """A choice whose parameters fit nowhere: keep its smallest layout for the 'nothing fits' report."""
        if options:
            option = max(options, key=lambda o: (o.pp, o.vpp))
            zero = max(zero_options(self.space, choice, option))
            layers = self.layers(dataclasses.replace(choice, recompute="full"))
            layout = self.layout(layers, option, zero)
            self.unfit.append((layout.mean_memory_bound() / layout.capacity, layers.choice, option, zero))

    def _remember_unsplit(self, layers: PricedLayers, option: PipelineOption, zero: int) -> None:
        layout = self.layout(layers, option, zero)
        split = solve_split(layout, memory=False, node_budget=SEARCH_NODE_BUDGET)
        if split is None:
            return
        memories = [layout.device_memory(d, r) for d, r in enumerate(chunk_ranges(split.layers_per_chunk, option.pp))]
        worst = max(memories, key=lambda m: m.total)
        self.too_big_candidate(
            Candidate(
                _plan(self.template, layers, option, zero, split),
                None,
                split,
                pipeline_time(layout, split.device_times),
                worst,
            )
        )

    def _result(self, started: float) -> SearchResult:
        self._resplit_unproved()
        ranked = self.board.ranked()
        if ranked:
            ranked[0] = self._polish(ranked[0])
            ranked.sort(key=rank)
        best = ranked[0] if ranked else None
        faster = [c for c in self.too_big if best is None or c.pipeline_s < best.step_time_s]
        if best is None:
            for _, choice, option, zero in sorted(self.unfit, key=lambda item: item[0])[:8]:
                self._remember_unsplit(self.layers(choice), option, zero)
        closest = self.closest
        if best is None and closest is not None and closest.estimate is None:
            closest = self.price(closest.plan, closest.split)
        if best is not None:
            bounds = [b for b, c in self.unproved if c.plan != best.plan] + (
                []
                if best.split.optimal
                else [
                    best.step_time_s
                    - max(
                        0.0,
                        best.pipeline_s
                        - pipeline_bound(
                            self.layout(
                                self.layers(
                                    LayerChoice(
                                        best.plan.tp,
                                        best.plan.cp,
                                        best.plan.ep,
                                        best.plan.etp,
                                        best.plan.mbs,
                                        best.plan.recompute,
                                    )
                                ),
                                PipelineOption(
                                    best.plan.pp, best.plan.vpp, best.plan.data_parallel, best.plan.microbatches
                                ),
                                best.plan.zero,
                            ),
                            best.split.lower_bound,
                        ),
                    )
                ]
            )
            floor = min(bounds, default=best.step_time_s)
            self.stats.optimality_gap = max(0.0, best.step_time_s / floor - 1.0) if floor > 0 else 0.0
        self.stats.seconds = time.perf_counter() - started
        keep = self.board.keep - 1
        return SearchResult(
            best, ranked[1 : 1 + keep], _distinct(faster)[:2], closest, self.stats, self.space, self.template
        )

    def _polish(self, candidate: Candidate) -> Candidate:
        """The winner's split, solved with the full budget, against Megatron's even split; the faster that fits stays."""
        plan = candidate.plan
        layers = self.layers(LayerChoice(plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.recompute))
        layout = Layout(layers, plan.pp, plan.vpp, plan.zero, self.cluster.devices)
        rivals = [candidate]
        if not candidate.split.optimal:
            split = solve_split(layout, memory=True, node_budget=POLISH_NODE_BUDGET, thorough=True)
            self.stats.splits += 1
            if split is not None and split.layers_per_chunk != plan.layers_per_chunk:
                rivals.append(self.price(dataclasses.replace(plan, layers_per_chunk=split.layers_per_chunk), split))
            elif split is not None:
                rivals[0] = dataclasses.replace(candidate, split=split)
        even = even_split(self.spec.num_layers, plan.pp * plan.vpp)
        if even != plan.layers_per_chunk:
            times = device_times(split_problem(layout), even)
            best_split = min((c.split for c in rivals), key=lambda s: s.bottleneck)
            proved = best_split.optimal and max(times) <= best_split.bottleneck * (1 + 1e-12)
            rivals.append(
                self.price(
                    dataclasses.replace(plan, layers_per_chunk=even),
                    StageSplit(even, times, proved, best_split.lower_bound, "Megatron's even split"),
                )
            )
        fitting = [c for c in rivals if c.fits]
        return min(fitting, key=rank) if fitting else candidate


def _mean_bound(layers: PricedLayers, option: PipelineOption) -> float:
    """(m + (pp - 1) / vpp) * T / pp: the closed-form makespan with every device at the mean."""
    return (option.microbatches + (option.pp - 1) / option.vpp) * layers.total_time / option.pp


def _distinct(candidates: list[Candidate]) -> list[Candidate]:
    seen, out = set(), []
    for c in candidates:
        if c.layout_key not in seen:
            seen.add(c.layout_key)
            out.append(c)
    return out


def default_workers() -> int:
    """Worker processes for a search: one per core this process may use, at most two."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def search(
    spec: ModelSpec,
    cluster: Cluster,
    template: ParallelConfig,
    space: SearchSpace | None = None,
    *,
    runners_up: int = 3,
    progress: Progress | None = None,
    time_limit_s: float | None = None,
    workers: int | None = None,
) -> SearchResult:
    """The fastest plans for `spec` on `cluster` (sized) under `template`'s training shape and software.

    `workers` > 1 forks that many processes (fewer for small spaces); the result does not depend on it.
    """
    return _Search(spec, cluster, template, space or SearchSpace(), runners_up).run(
        progress, time_limit_s, workers or default_workers()
    )


def _explore_child(
    search_state: _Search, base: list[LayerChoice], options: dict, policies: list[str], deadline: float | None, writer
) -> None:
    """A forked worker: explore a share of the layer choices, send what was found, exit."""
    try:
        search_state.explore(base, options, policies, deadline, None)
        writer.send(search_state._partial())
    finally:
        writer.close()
