"""The per-chunk task times the bubble prediction simulates are measured on the chunks themselves with the
pipelining engine's own backward functions: forward, full backward, and the zero-bubble schedules' input-
and weight-gradient passes - the first chunk with no input pass and the whole backward as its weight pass,
as the engine runs it. Measuring leaves the parameters' gradients as they were. No timing thresholds: only
which passes ran (a time of 0 means the pass was not run)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trex.models import build_model, tiny_config
from trex.runtime.pipeline.split import from_counts
from trex.runtime.pipeline.stages import ChunkModule
from trex.runtime.pipeline.task_calibration import (
    full_backward_split,
    measure_stage_tasks,
    measure_stage_tasks_first_in_turn,
    time_chunk_tasks,
)

SEQ = 8


def _chunks():
    config = tiny_config("qwen3-moe")
    model = build_model(config, seed=0)
    model.train()
    split = from_counts((2, 2), config.num_hidden_layers, 2, 1)
    return config, model, [ChunkModule(model, chunk) for chunk in split.chunks]


def _inputs(config):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, SEQ), generator=generator)

    def make_input(module):
        if module.chunk.first:
            return ids
        return torch.randn(1, SEQ, config.hidden_size, generator=generator).requires_grad_(True)

    def loss_of(logits):
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten(), reduction="sum") / ids.numel()

    return make_input, loss_of


def test_every_pass_of_a_middle_chunk_is_timed_and_unsplit_schedules_time_no_split():
    config, _, (first, last) = _chunks()
    make_input, loss_of = _inputs(config)
    split = time_chunk_tasks(last, False, True, lambda: make_input(last), loss_of, True, repeats=2, warmups=1)
    assert all(split[kind] > 0 for kind in ("F", "B", "I", "W")), split
    whole = time_chunk_tasks(last, False, True, lambda: make_input(last), loss_of, False, repeats=2, warmups=1)
    assert whole["F"] > 0 and whole["B"] > 0 and whole["I"] == 0 and whole["W"] == 0, whole
    # a schedule without the split still gets every kind, I and W from B (the first chunk's W is its whole B)
    filled = full_backward_split({"F": [1.0, 1.0], "B": [2.0, 4.0], "I": [0.0, 0.0], "W": [0.0, 0.0]})
    assert filled["I"] == [0.0, 2.0] and filled["W"] == [2.0, 2.0]


@pytest.fixture
def one_rank_group(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_stage_tasks_follow_the_engines_split_and_leave_the_gradients_alone(one_rank_group):
    config, model, chunks = _chunks()
    make_input, loss_of = _inputs(config)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    before = {name: p.grad.clone() for name, p in model.named_parameters()}
    times = measure_stage_tasks(chunks, chunks, make_input, loss_of, True, 0, 1, 2, None, repeats=2)
    assert set(times) == {"F", "B", "I", "W"} and all(len(v) == 2 for v in times.values())
    assert all(t > 0 for kind in ("F", "B", "W") for t in times[kind]), times
    assert times["I"][0] == 0 and times["I"][1] > 0, times  # the first chunk has no input-gradient pass
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, before[name]), name


def test_the_sample_that_opens_a_turn_is_kept_apart_from_the_first_chunks_times(one_rank_group):
    """Each turn opens with one more sample of the rank's first chunk (right after the barrier, where the passes
    run slow); the medians come from the samples after it, and the opening samples give the first chunk's times
    of the old calibration. The other chunks' times are the same in both."""
    config, _, chunks = _chunks()
    make_input, loss_of = _inputs(config)
    times, opened, concurrent = measure_stage_tasks_first_in_turn(
        chunks, chunks, make_input, loss_of, True, 0, 1, 2, None, repeats=3
    )
    assert concurrent is None  # the samples with every rank at once are taken only when asked
    assert set(opened) == set(times) == {"F", "B", "I", "W"}
    for kind in ("F", "B", "I", "W"):
        assert opened[kind][1] == times[kind][1], kind  # the second chunk: one measurement, both tables
    assert opened["F"][0] > 0 and opened["I"][0] == 0  # the first chunk, timed by its own (opening) samples
    assert opened["F"][0] != times["F"][0]


def test_the_samples_taken_with_every_rank_at_once_are_their_own(one_rank_group):
    """With `concurrent`, every chunk is also timed in a phase where all pipeline ranks sample at once (after the
    turns of each round); those medians come from their own samples, under the same first-chunk rule (I = 0)."""
    config, _, chunks = _chunks()
    make_input, loss_of = _inputs(config)
    times, _, concurrent = measure_stage_tasks_first_in_turn(
        chunks, chunks, make_input, loss_of, True, 0, 1, 2, None, repeats=3, concurrent=True
    )
    assert set(concurrent) == {"F", "B", "I", "W"}
    assert all(value > 0 for value in concurrent["F"] + concurrent["B"] + concurrent["W"])
    assert concurrent["I"][0] == 0 and concurrent["I"][1] > 0
    assert concurrent["F"] != times["F"]  # separate samples, not a copy of the turns' medians
