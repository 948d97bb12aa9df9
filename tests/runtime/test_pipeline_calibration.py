"""The calibration's split of a pipeline step's non-compute time: gaps before a rank's actions that need no
input from another rank (the runtime's per-action work), delays after a neighbour's action when the rank
waited for it (transfer + that work), and the step's head and tail - from action timestamps, without any
process group. A gap before an action whose remote input was sent before the rank got there is neither:
it is the rendezvous link's late receive, which the calibration measures on its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trex.runtime.pipeline.calibration import NullChunk, gaps
from trex.runtime.pipeline.schedules import receive_posts
from trex.runtime.pipeline.timing import Interval


def test_gaps_separate_local_overhead_remote_delay_head_and_tail():
    # two ranks, one chunk each, GPipe with 2 micro-batches; rank 1 also computes the loss after each forward
    rank0 = [
        Interval("F", 0, 0, 1.0, 2.0),
        Interval("F", 0, 1, 2.1, 3.1),  # local gap 0.1
        Interval("B", 0, 0, 6.5, 7.5),  # waits for B(1, 0) ending at 6.0: remote delay 0.5
        Interval("B", 0, 1, 8.5, 9.5),  # B(1, 1) ends at 8.2: remote delay 0.3
    ]
    rank1 = [
        Interval("F", 1, 0, 2.4, 3.4),  # F(0, 0) ended at 2.0: remote delay 0.4
        Interval("L", 1, -1, 3.45, 3.5),  # merged into the forward
        Interval("F", 1, 1, 3.7, 4.2),  # F(0, 1) ended at 3.1, before the previous action: a late receive
        Interval("L", 1, -1, 4.2, 4.3),
        Interval("B", 1, 0, 4.5, 6.0),  # local gap 0.2
        Interval("B", 1, 1, 6.2, 8.2),  # local gap 0.2
    ]
    records = [(0, [(10.0, rank0, 0.5)]), (1, [(8.0, rank1, 0.6)])]
    found = gaps(records, stages=2)
    assert sorted(found["local"]) == pytest.approx([0.1, 0.2, 0.2])
    assert sorted(found["remote"]) == pytest.approx([0.3, 0.4, 0.5])
    assert found["head"] == pytest.approx([0.5])  # rank 0's first action waits for nothing
    assert sorted(found["tail"]) == pytest.approx([0.4, 1.0])  # 0.6 + 8.0 - 8.2 and 0.5 + 10.0 - 9.5


def test_null_chunks_keep_the_activation_shapes():
    import torch

    ids = torch.randint(0, 32, (1, 8))
    first, middle, last = (
        NullChunk(True, False, 16, 32),
        NullChunk(False, False, 16, 32),
        NullChunk(False, True, 16, 32),
    )
    hidden = first(ids)
    assert hidden.shape == (1, 8, 16) and hidden.requires_grad
    assert middle(hidden).shape == (1, 8, 16)
    assert last(middle(hidden)).shape == (1, 8, 32)


def test_receive_posts_follow_the_engines_lowered_action_lists():
    """The multi-chunk schedules post a RECV where the engine's lowering (`_add_send_recv`) put it: after the
    receiving rank's compute action that precedes it; one-chunk schedules have no lowered list (just in
    time, the simulation's default)."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _ComputationType

    f, b = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    # 2 ranks, 2 stages, GPipe-like compute lists with 2 micro-batches
    compute = {
        0: [_Action(0, f, 0), _Action(0, f, 1), _Action(0, b, 0), _Action(0, b, 1)],
        1: [_Action(1, f, 0), _Action(1, f, 1), _Action(1, b, 0), _Action(1, b, 1)],
    }
    lowered = _add_send_recv({r: list(a) for r, a in compute.items()}, stage_to_rank=lambda s: s, num_stages=2)
    orders = {
        r: [(a.computation_type.value, a.stage_index, a.microbatch_index) for a in acts] for r, acts in compute.items()
    }
    posts = receive_posts(SimpleNamespace(pipeline_order_with_comms=lowered), orders)
    expected = {0: {}, 1: {}}
    for rank, actions in lowered.items():
        done = -1
        for action in actions:
            kind = action.computation_type.value
            if kind == "RECV_F":
                expected[rank][("F", action.stage_index, action.microbatch_index)] = done
            elif kind == "RECV_B":
                expected[rank][("B", action.stage_index, action.microbatch_index)] = done
            elif kind in ("F", "B"):
                done += 1
    assert posts == expected
    assert posts[1][("F", 1, 0)] == -1  # rank 1's first receive is posted at the start of the step
    assert set(posts[0]) == {("B", 0, 0), ("B", 0, 1)}
    assert receive_posts(SimpleNamespace(), orders) == {}


def test_task_slowdowns_compare_each_action_with_its_burned_work():
    from trex.runtime.pipeline.calibration import task_slowdowns

    burns = {0: (10, 0, 20), 1: (10, 5, 5)}  # (forward, input-gradient, weight-gradient) iterations per chunk
    intervals = [
        Interval("F", 0, 0, 0.0, 0.010),  # nominal 10 x 1 ms
        Interval("W", 0, 0, 0.1, 0.130),  # the first chunk's weight pass runs its whole backward: 20 ms nominal
        Interval("I", 0, 0, 0.09, 0.0901),  # no input gradient on the first chunk: nothing to slow, left out
        Interval("B", 1, 0, 0.2, 0.210),  # full backward: 5 + 5 iterations
        Interval("L", 1, -1, 0.3, 0.31),
    ]
    assert task_slowdowns(intervals, burns, 1e-3) == pytest.approx(
        {("F", 0, 0): 1.0, ("W", 0, 0): 1.5, ("B", 1, 0): 1.0}
    )


def test_burning_null_chunks_spend_their_work_in_the_pass_it_belongs_to():
    import time

    import torch

    from trex.runtime.pipeline.calibration import burn_seconds_per_iteration

    per = burn_seconds_per_iteration()
    n = max(1, round(0.02 / per))
    chunk = NullChunk(False, False, 16, 32, (n, 0, 0))
    x = torch.randn(1, 8, 16, requires_grad=True)
    start = time.process_time()
    y = chunk(x)
    forward = time.process_time() - start
    start = time.process_time()
    y.sum().backward()
    backward = time.process_time() - start
    assert forward > 5 * backward  # all the work sits in the forward
    assert x.grad is not None and chunk.scale.grad is not None


def test_slowdowns_are_taken_around_each_tasks_typical_time():
    from trex.runtime.pipeline.calibration import around_typical

    steps = [{("F", 0, 0): 2.0, ("F", 0, 1): 2.0}, {("F", 0, 0): 4.0, ("F", 0, 1): 2.0}, {("B", 1, 0): 3.0}]
    assert around_typical(steps) == (
        {("F", 0, 0): 1.0, ("F", 0, 1): 1.0},
        {("F", 0, 0): 2.0, ("F", 0, 1): 1.0},
        {("B", 1, 0): 1.0},
    )


def test_send_posts_follow_an_overlapped_forward_and_backward():
    """DualPipeV's OVERLAP_F_B: the engine's lowering (`_add_send_recv`) posts the pair's two sends after it, so
    the forward's send is listed after the backward; a plain action's send follows it (not listed). The
    calibration's remote delays then count from the send, not from the forward's end."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _ComputationType

    from trex.runtime.pipeline.schedules import send_posts

    f, b = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    overlap = _ComputationType.OVERLAP_F_B
    # 2 ranks, 3 stages (0, 2 on rank 0; 1 on rank 1), micro-batches 0 and 1
    compute = {
        0: [
            _Action(0, f, 0),
            _Action(2, f, 0),
            _Action(-1, overlap, None, (_Action(0, f, 1), _Action(2, b, 0))),
            _Action(2, f, 1),
            _Action(2, b, 1),
            _Action(0, b, 0),
            _Action(0, b, 1),
        ],
        1: [_Action(1, f, 0), _Action(1, f, 1), _Action(1, b, 0), _Action(1, b, 1)],
    }
    stage_rank = {0: 0, 1: 1, 2: 0}
    lowered = _add_send_recv({r: list(a) for r, a in compute.items()}, lambda s: stage_rank[s], 3)
    orders = {
        0: [("F", 0, 0), ("F", 2, 0), ("F", 0, 1), ("B", 2, 0), ("F", 2, 1), ("B", 2, 1), ("B", 0, 0), ("B", 0, 1)],
        1: [("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1)],
    }
    sends = send_posts(SimpleNamespace(pipeline_order_with_comms=lowered), orders)
    assert sends == {0: {("F", 0, 1): 3}, 1: {}}  # after B(2, 0), the pair's second half
    assert send_posts(SimpleNamespace(), orders) == {}

    # remote delay from the send: rank 1's F(1, 1) starts 0.5 after B(2, 0) ends (not 2.5 after F(0, 1) ends)
    rank0 = [
        Interval("F", 0, 1, 0.0, 1.0),
        Interval("B", 2, 0, 1.0, 3.0),
    ]
    rank1 = [Interval("F", 1, 0, 0.0, 0.5), Interval("F", 1, 1, 3.5, 4.0)]
    records = [(0, [(4.0, rank0, 0.0)]), (1, [(4.0, rank1, 0.0)])]
    released = {("F", 0, 1): ("B", 2, 0)}
    assert gaps(records, stages=3, released=released)["remote"] == pytest.approx([0.5])
    assert gaps(records, stages=3)["remote"] == pytest.approx([2.5])


def test_delivery_is_the_measured_remote_delay_less_the_action_work():
    from trex.runtime.pipeline.calibration import PipelineOverheads

    def overheads(remote: float) -> PipelineOverheads:
        return PipelineOverheads(
            action_s=0.3e-3,
            head_s=0.0,
            tail_s=0.0,
            p2p_s=0.1e-3,
            late_recv_s=1e-3,
            remote_delay_s=remote,
            link_latency_us=100.0,
            link_bandwidth_gbs=1.0,
            link_source="test",
            activation_bytes=4,
            samples=1,
        )

    assert overheads(1.0e-3).delivery_s == pytest.approx(0.7e-3)
    assert overheads(0.2e-3).delivery_s == pytest.approx(0.1e-3)  # never below the link's p2p time
    assert overheads(1.0e-3).to_dict()["delivery_s"] == pytest.approx(0.7e-3)


def test_step_split_separates_compute_posts_waits_and_the_rest():
    """A step's time: compute (the timed passes), the engine's message posts and waits (`p2p_timed`'s log), and
    what is left (the runtime's own work between actions); waits over 0.1 ms are counted."""
    from trex.runtime.pipeline.timing import comm_split

    steps = [
        (10.0e-3, [Interval("F", 0, 0, 0.0, 4.0e-3)], [("post", 4.0e-3, 4.5e-3), ("wait", 4.5e-3, 8.5e-3)]),
        (12.0e-3, [Interval("F", 0, 1, 0.0, 6.0e-3)], [("wait", 6.0e-3, 6.05e-3)]),
    ]
    split = comm_split(steps)
    assert split["step_ms"] == pytest.approx(11.0)
    assert split["compute_ms"] == pytest.approx(5.0)
    assert split["post_ms"] == pytest.approx(0.25)
    assert split["wait_ms"] == pytest.approx(2.025)
    assert split["long_waits"] == pytest.approx(0.5)
    assert split["other_ms"] == pytest.approx(11.0 - 5.0 - 0.25 - 2.025)
    assert comm_split([]) == {}


def test_p2p_timing_records_the_engines_posts_and_waits_and_restores_them():
    from torch.distributed.pipelining import schedules

    from trex.runtime.pipeline.timing import p2p_timed

    post, wait = schedules._batch_p2p, schedules._wait_batch_p2p
    log: list = []
    with p2p_timed(log):
        assert schedules._batch_p2p is not post and schedules._wait_batch_p2p is not wait
        assert schedules._batch_p2p([]) == []  # nothing posted: nothing recorded
        schedules._wait_batch_p2p([SimpleNamespace(wait=lambda: None)])
    assert schedules._batch_p2p is post and schedules._wait_batch_p2p is wait
    assert [what for what, _, _ in log] == ["wait"] and log[0][1] <= log[0][2]


def test_spinning_ranks_read_the_time_slices_between_their_descheduled_moments(monkeypatch):
    """`spin_runs` cuts a spin at every clock jump over `gap_s` (the thread was off its core) and leaves out the
    first run (begun before the spin); `time_slice` is the runs' median, None with too few (a core each)."""
    from trex.runtime.pipeline import calibration

    # a clock read every 10 us; descheduled (4 ms jumps) after 1 ms, 5 ms and 9 ms of running
    ticks, now = [], 0.0
    for run in (1e-3, 4e-3, 4e-3, 4e-3):
        for _ in range(round(run / 1e-5)):
            ticks.append(now)
            now += 1e-5
        now += 4e-3
    while now < 0.06:  # running on, past the spin's end
        ticks.append(now)
        now += 1e-5
    clock = iter(ticks)
    monkeypatch.setattr(calibration.time, "perf_counter", lambda: next(clock))
    runs = calibration.spin_runs(seconds=0.05)
    assert runs == pytest.approx([4e-3 - 1e-5] * 3)
    assert calibration.time_slice(runs, least=3) == pytest.approx(4e-3 - 1e-5)
    assert calibration.time_slice(runs) is None  # fewer than 8 runs: the ranks were hardly descheduled
