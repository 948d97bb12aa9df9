"""Stage partitioning: optimal splits (checked against brute force), proofs, memory limits."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.planner.stage_split import SplitProblem, StageSplit, chunk_ranges, counts_feasible, device_times, split_stages


def compositions(total: int, mins: Sequence[int]) -> Iterator[tuple[int, ...]]:
    if len(mins) == 1:
        if total >= mins[0]:
            yield (total,)
        return
    for first in range(mins[0], total - sum(mins[1:]) + 1):
        for rest in compositions(total - first, mins[1:]):
            yield (first, *rest)


def every_split(problem: SplitProblem) -> Iterator[tuple[int, ...]]:
    return compositions(problem.num_layers, [problem.min_layers(c) for c in range(problem.chunks)])


def brute_force(problem: SplitProblem, memory=None) -> float | None:
    best = None
    for split in every_split(problem):
        if memory is not None and not all(memory.fits(d, r) for d, r in enumerate(chunk_ranges(split, problem.pp))):
            continue
        t = max(device_times(problem, split))
        best = t if best is None else min(best, t)
    return best


class LinearMemory:
    """A toy budget shaped like the cost model's: per-layer weights plus activations times the
    micro-batches each local chunk keeps in flight (earlier chunks and earlier stages hold more)."""

    def __init__(self, weights: Sequence[float], activations: Sequence[float], pp: int, vpp: int, capacity: float):
        self.weights, self.activations, self.pp, self.vpp, self.capacity = weights, activations, pp, vpp, capacity

    def in_flight(self, device: int, j: int) -> int:
        return (self.pp - device) + (self.vpp - 1 - j)

    def usage(self, device: int, ranges) -> float:
        return sum(
            self.weights[i] + self.activations[i] * self.in_flight(device, j)
            for j, (a, b) in enumerate(ranges)
            for i in range(a, b)
        )

    def fits(self, device, ranges):
        return self.usage(device, ranges) <= self.capacity

    def lower_bound_fits(self, device, ranges):
        return self.fits(device, ranges)

    def signature(self, device, ranges):
        return tuple(ranges)

    def excess(self, device, ranges):
        return self.usage(device, ranges) - self.capacity


layer_time = st.sampled_from([0.7, 1.0, 1.3, 2.0])


@st.composite
def problems(draw, max_layers: int = 9, grouped: bool = False) -> SplitProblem:
    pp = draw(st.integers(1, 3))
    vpp = draw(st.integers(1, 3)) if pp > 1 else 1
    layers = draw(st.integers(max(0, pp * vpp - 2), max(max_layers, pp * vpp - 2)))
    times = tuple(draw(st.lists(layer_time, min_size=layers, max_size=layers)))
    first, last = draw(st.floats(0, 1.5)), draw(st.floats(0, 3))
    chunk_time = None
    if grouped and layers:
        # a chunk's time groups its layers, like host-bound stretches: max(device sum, host sum) + extras
        host = tuple(draw(st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=layers, max_size=layers)))
        chunks = pp * vpp

        def chunk_time(start, end, c, times=times, host=host):
            busy = max(sum(times[start:end]), sum(h * t for h, t in zip(host[start:end], times[start:end])))
            return busy + (first if c == 0 else 0.0) + (last if c == chunks - 1 else 0.0)

    return SplitProblem(times, pp, vpp, first, last, chunk_time)


def assert_sound(split: StageSplit, problem: SplitProblem, optimum: float) -> None:
    assert sum(split.layers_per_chunk) == problem.num_layers
    assert all(n >= problem.min_layers(c) for c, n in enumerate(split.layers_per_chunk))
    assert split.bottleneck >= optimum * (1 - 1e-9)
    assert split.lower_bound <= optimum * (1 + 1e-9)
    if split.optimal:
        assert split.bottleneck == pytest.approx(optimum, rel=1e-9)


@given(problems())
def test_the_split_is_optimal_against_brute_force_on_small_stacks(problem):
    split = split_stages(problem)
    assert_sound(split, problem, brute_force(problem))
    assert split.optimal  # small stacks are always settled


@given(problems(grouped=True))
def test_grouped_chunk_times_are_split_optimally_too(problem):
    split = split_stages(problem)
    assert_sound(split, problem, brute_force(problem))


@given(problems(max_layers=8), st.data())
def test_memory_limits_are_respected_and_vpp1_stays_optimal(problem, data):
    weights = data.draw(st.lists(st.floats(0.5, 2.0), min_size=problem.num_layers, max_size=problem.num_layers))
    acts = data.draw(st.lists(st.floats(0.0, 1.0), min_size=problem.num_layers, max_size=problem.num_layers))
    capacity = data.draw(st.floats(1.0, 12.0))
    memory = LinearMemory(weights, acts, problem.pp, problem.vpp, capacity)
    optimum = brute_force(problem, memory)
    split = split_stages(problem, memory)
    if split is None:
        # vpp = 1 proves it; an interleaved local search may only miss a fit
        assert optimum is None or problem.vpp > 1
        return
    assert all(memory.fits(d, r) for d, r in enumerate(chunk_ranges(split.layers_per_chunk, problem.pp)))
    assert optimum is not None
    assert_sound(split, problem, optimum)
    if problem.vpp == 1:
        assert split.optimal


@given(problems(), st.floats(0.5, 1.0))
def test_the_count_relaxation_only_refutes_limits_no_split_reaches(problem, fraction):
    optimum = brute_force(problem)
    limit = optimum * fraction
    if not counts_feasible(problem, limit):
        assert optimum > limit
    assert counts_feasible(problem, optimum * (1 + 1e-9))


def test_uniform_stacks_balance_layer_counts_exactly():
    # GPT-530B's layout in Korthikanti et al.: 105 layers on pp=35 x vpp=3 = 105 chunks. The last
    # stage holds the head (0.5 layers' time) and two middle chunks; giving it three layers (3.5)
    # lets every other stage hold three (stage 0: 3 + 0.1), which beats any split that leaves it two.
    problem = SplitProblem(tuple([1.0] * 105), 35, 3, first_extra=0.1, last_extra=0.5)
    split = split_stages(problem)
    assert split.optimal
    assert split.bottleneck == pytest.approx(3.5)
    assert sorted(set(split.device_times)) == pytest.approx([3.0, 3.1, 3.5])


def test_deepseek_v4_alternating_attention_split_is_proved_optimal():
    # CSA layers cost 0.1302 s, HCA and the hash layers 0.1168 s (cost model, V4-Pro tp2 ep128):
    # total / pp is out of reach by integrality; the count relaxation proves the split optimal
    times = tuple(0.1168 if i < 3 or i % 2 == 0 else 0.1302 for i in range(61))
    problem = SplitProblem(times, 8, 2, first_extra=0.00035, last_extra=0.31)
    split = split_stages(problem)
    assert split.optimal
    assert split.bottleneck > (sum(times) + 0.31035) / 8 + 0.005  # strictly above the averaging bound


def test_deepseek_v3_dense_first_layers_move_the_first_stage_boundary():
    # three cheap dense layers first (0.014 s) then 58 MoE layers (0.035 s), MTP + head on the last stage
    times = tuple(0.0142 if i < 3 else 0.0353 for i in range(61))
    problem = SplitProblem(times, 8, 1, first_extra=0.0003, last_extra=0.069)
    split = split_stages(problem)
    assert split.optimal
    even = (8, 8, 8, 8, 8, 7, 7, 7)
    assert split.bottleneck < max(device_times(problem, even))
    assert (
        split.layers_per_chunk[0] > split.layers_per_chunk[-1]
    )  # the dense layers' stage takes more, the head's fewer


def test_an_empty_middle_chunk_is_never_produced():
    problem = SplitProblem((1.0,) * 4, 2, 3, first_extra=0.0, last_extra=10.0)
    split = split_stages(problem)
    assert all(n >= 1 for n in split.layers_per_chunk[1:-1])


def test_too_many_chunks_for_the_layers_is_an_error():
    from trex.errors import TrexError

    with pytest.raises(TrexError, match="need at least 6 layers"):
        split_stages(SplitProblem((1.0,) * 5, 4, 2))
