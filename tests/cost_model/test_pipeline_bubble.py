"""The cost model's pipeline bubble: the event simulation of per-rank action lists reproduces the papers'
closed forms for GPipe, 1F1B and interleaved 1F1B, and zero-bubble action lists (backward split into
input and weight gradients) leave less idle time than 1F1B."""

from __future__ import annotations

import pytest

from trex.cost_model.pipeline import closed_form_bubble, simulate_actions, simulated_bubble


def one_chunk_orders(schedule: str, pp: int, m: int) -> dict[int, list[tuple[str, int, int]]]:
    out = {}
    for rank in range(pp):
        f = [("F", rank, mb) for mb in range(m)]
        b = [("B", rank, mb) for mb in range(m)]
        if schedule == "gpipe":
            out[rank] = f + b
        else:  # Megatron's 1F1B: pp - rank - 1 warm-up forwards, then one forward, one backward
            warm = min(pp - rank - 1, m)
            order = f[:warm]
            for i in range(m):
                if warm + i < m:
                    order.append(f[warm + i])
                order.append(b[i])
            out[rank] = order
    return out


def interleaved_orders(pp: int, vpp: int, m: int) -> dict[int, list[tuple[str, int, int]]]:
    """Megatron's interleaved order from the cost model's own helpers (chunk c on rank c % pp)."""
    from trex.cost_model.pipeline import forward_chunk_order, warmup_forwards

    out = {}
    for d in range(pp):
        fwd = [("F", local * pp + d, mb) for local, mb in forward_chunk_order(d, pp, vpp, m)]
        bwd = [("B", (vpp - 1 - local) * pp + d, mb) for local, mb in forward_chunk_order(d, pp, vpp, m)]
        warm = warmup_forwards(d, pp, vpp, m)
        order, f_i, b_i = fwd[:warm], warm, 0
        while f_i < len(fwd) or b_i < len(bwd):
            if f_i < len(fwd):
                order.append(fwd[f_i])
                f_i += 1
            if b_i < len(bwd):
                order.append(bwd[b_i])
                b_i += 1
        out[d] = order
    return out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), [(2, 2), (2, 8), (4, 4), (4, 16)])
def test_simulated_one_chunk_schedules_give_the_closed_form(schedule, pp, m):
    times = {"F": [1.0] * pp, "B": [2.0] * pp}
    tasks = simulate_actions(one_chunk_orders(schedule, pp, m), times, pp)
    assert simulated_bubble(tasks) == pytest.approx(closed_form_bubble(schedule, pp, 1, m))
    assert closed_form_bubble(schedule, pp, 1, m) == pytest.approx((pp - 1) / (m + pp - 1))


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (2, 4, 8)])
def test_simulated_interleaved_schedule_gives_the_closed_form(pp, vpp, m):
    chunks = pp * vpp
    times = {"F": [1.0 / vpp] * chunks, "B": [2.0 / vpp] * chunks}
    tasks = simulate_actions(interleaved_orders(pp, vpp, m), times, chunks)
    assert simulated_bubble(tasks) == pytest.approx(closed_form_bubble("interleaved", pp, vpp, m))
    assert closed_form_bubble("interleaved", pp, vpp, m) < closed_form_bubble("1f1b", pp, 1, m)


def test_weight_gradients_fill_the_drain():
    """1F1B with B split into I then W, the Ws deferred to the drain (ZB-H1-like): less idle than 1F1B."""
    pp, m = 4, 8
    plain = simulate_actions(one_chunk_orders("1f1b", pp, m), {"F": [1.0] * pp, "B": [2.0] * pp}, pp)
    split = {}
    for rank, order in one_chunk_orders("1f1b", pp, m).items():
        body = [("I", s, mb) if kind == "B" else (kind, s, mb) for kind, s, mb in order]
        deferred = [("W", rank, mb) for mb in range(m)]
        split[rank] = body + deferred
    zero = simulate_actions(split, {"F": [1.0] * pp, "I": [1.0] * pp, "W": [1.0] * pp}, pp)
    assert simulated_bubble(zero) < simulated_bubble(plain)


def test_closed_form_refuses_schedules_without_one():
    with pytest.raises(ValueError, match="no closed-form bubble for 'zbv'"):
        closed_form_bubble("zbv", 2, 2, 4)


def test_per_action_overhead_and_p2p_are_idle_time_the_simulation_prices():
    """Each action first costs `overhead` on its rank (not compute), each cross-rank dependency `p2p`: one
    rank's chain of 4 actions takes 4 (overhead + compute); the second rank waits for the transfers."""
    orders = one_chunk_orders("gpipe", 2, 2)
    times = {"F": [1.0, 1.0], "B": [2.0, 2.0]}
    plain = simulate_actions(orders, times, 2)
    costly = simulate_actions(orders, times, 2, p2p=0.5, overhead=0.25)
    rank0 = sorted((t for t in costly if t.rank == 0), key=lambda t: t.start)
    assert rank0[0].start == pytest.approx(0.25)  # overhead before the first forward
    first_f1 = next(t for t in costly if t.rank == 1 and t.kind == "F" and t.microbatch == 0)
    assert first_f1.start == pytest.approx(0.25 + 1.0 + 0.5 + 0.25)  # F(0,0) end + p2p + overhead
    busy = sum(t.end - t.start for t in costly)
    assert busy == pytest.approx(sum(t.end - t.start for t in plain))  # overheads are not compute
    assert simulated_bubble(costly) > simulated_bubble(plain)


def test_ranks_sharing_fewer_cores_slow_down_while_they_overlap():
    """Processor sharing: two independent ranks' forwards on one core take twice as long each."""
    times = {"F": [1.0, 1.0]}
    orders = {0: [("F", 0, 0)], 1: [("F", 0, 1)]}  # stage 0's forwards of two micro-batches: no dependency
    owned = simulate_actions(orders, times, 2)
    shared = simulate_actions(orders, times, 2, cores=1)
    assert max(t.end for t in owned) == pytest.approx(1.0)
    assert [t.end for t in shared] == pytest.approx([2.0, 2.0])


def test_time_slices_run_one_rank_per_core_and_rotate_when_a_slice_is_spent():
    """Two independent 1.0 s forwards on one core in 0.25 s slices: rank 0 runs first, rank 1 waits for the core
    (its action's clock starts when it first runs), then they alternate; both finish as under processor
    sharing, but rank 1's wait before its first slice is idle, not busy."""
    orders = {0: [("F", 0, 0)], 1: [("F", 0, 1)]}
    tasks = simulate_actions(orders, {"F": [1.0, 1.0]}, 2, cores=1, slice_s=0.25)
    by_rank = {t.rank: t for t in tasks}
    assert (by_rank[0].start, by_rank[0].end) == pytest.approx((0.0, 1.75))
    assert (by_rank[1].start, by_rank[1].end) == pytest.approx((0.25, 2.0))


def test_a_rank_woken_while_the_cores_are_taken_waits_idle_for_one():
    """One core; rank 1's forward needs rank 0's, rank 2 computes a 3 s forward meanwhile. Under processor sharing
    rank 1 starts the moment its input is there, at a fraction of the core (busy all along); with slices it waits
    in the run queue for rank 2's slice to end (idle time), then runs at full speed; with slices longer than
    rank 2's work it waits for all of it. Same work, less busy time, more bubble."""
    orders = {0: [("F", 0, 0)], 1: [("F", 1, 0)], 2: [("F", 0, 1)]}
    times, extra = {"F": [1.0, 1.0]}, {("F", 0, 1): 2.0}

    def run(**kw):
        tasks = simulate_actions(orders, times, 2, extra=extra, cores=1, **kw)
        return {t.rank: (t.start, t.end) for t in tasks}, simulated_bubble(tasks)

    sharing, sharing_bubble = run()
    sliced, sliced_bubble = run(slice_s=0.5)
    whole, whole_bubble = run(slice_s=10.0)
    assert sharing[1][0] == pytest.approx(sharing[0][1])  # starts as its input arrives (2.0), at half speed
    assert sliced[0][1] == pytest.approx(1.5)  # rank 0: slices 0-0.5 and 1.0-1.5
    assert sliced[1] == pytest.approx((2.0, 3.5))  # waits for rank 2's slice 1.5-2.0; 2.5-3.0 is rank 2's again
    assert whole[1] == pytest.approx((4.0, 5.0))  # behind rank 2's whole forward (1.0-4.0)
    assert sharing_bubble < sliced_bubble < whole_bubble


def test_time_slices_queue_ranks_first_come_first_served():
    """Three independent forwards on one core, slices longer than the work: run to completion in arrival order
    (a rank's clock starts when it first runs); with slices short enough they all overlap (processor sharing's
    limit)."""
    orders = {r: [("F", 0, r)] for r in range(3)}
    long = simulate_actions(orders, {"F": [1.0]}, 1, cores=1, slice_s=10.0)
    assert [(t.rank, t.start, t.end) for t in sorted(long, key=lambda t: t.start)] == [
        (0, 0.0, 1.0),
        (1, 1.0, 2.0),
        (2, 2.0, 3.0),
    ]
    short = simulate_actions(orders, {"F": [1.0]}, 1, cores=1, slice_s=1e-3)
    sharing = simulate_actions(orders, {"F": [1.0]}, 1, cores=1)
    assert sorted(t.end for t in short) == pytest.approx(sorted(t.end for t in sharing), abs=3e-3)
    assert simulated_bubble(short) == pytest.approx(simulated_bubble(sharing), abs=3e-3)


def test_time_slices_need_a_whole_number_of_cores_fewer_than_the_ranks():
    from trex.cost_model.pipeline import time_slice_slots

    assert time_slice_slots(2.0, 4e-3, 4) == 2
    assert time_slice_slots(2.0, 4e-3, 2) is None  # a core per rank: nothing to hand out
    assert time_slice_slots(1.5, 4e-3, 4) is None  # shared with another pipeline: processor sharing
    assert time_slice_slots(2.0, None, 4) is None
    with pytest.raises(ValueError, match="time slice must be positive"):
        time_slice_slots(2.0, 0.0, 4)


def test_own_span_bubble_ends_each_rank_at_its_last_action():
    """GPipe: the last stage returns before the first stage's drain, so its own step is shorter; head and
    tail lengthen every rank's step without adding compute."""
    orders = one_chunk_orders("gpipe", 2, 4)
    tasks = simulate_actions(orders, {"F": [1.0, 1.0], "B": [2.0, 2.0]}, 2)
    shared_span = simulated_bubble(tasks)
    own = simulated_bubble(tasks, own_span=True)
    assert own < shared_span
    assert simulated_bubble(tasks, head=1.0, tail=1.0, own_span=True) > own


def test_a_receive_posted_after_its_message_was_sent_waits_for_the_handshake():
    """Rendezvous link (gloo): rank 1 reaches F(1, 1) after F(0, 1) was sent (it was computing F(1, 0)), posts
    the receive then, and the message arrives `late_recv` later; had the receive been posted ahead (at the
    step's start, as the engine's lowered schedules do), it would have arrived p2p after the send."""
    orders = {0: [("F", 0, 0), ("F", 0, 1)], 1: [("F", 1, 0), ("F", 1, 1)]}
    times = {"F": [1.0, 3.0]}

    def start(tasks, mb):
        return next(t.start for t in tasks if t.rank == 1 and t.microbatch == mb)

    in_time = simulate_actions(orders, times, 2, p2p=0.1)
    late = simulate_actions(orders, times, 2, p2p=0.1, late_recv=0.5)
    ahead = simulate_actions(orders, times, 2, p2p=0.1, late_recv=0.5, posts={1: {("F", 1, 1): -1}})
    assert start(in_time, 0) == start(late, 0) == pytest.approx(1.1)  # rank 1 was waiting: posted in time
    assert start(in_time, 1) == pytest.approx(4.1)  # F(1, 0) ends at 4.1; F(0, 1) ended at 2.0
    assert start(late, 1) == pytest.approx(4.1 + 0.5)
    assert start(ahead, 1) == pytest.approx(4.1)
    assert simulated_bubble(late, own_span=True) > simulated_bubble(in_time, own_span=True)


def test_a_late_receive_is_priced_by_what_its_sender_does_when_it_is_posted():
    """Rank 1 posts F(1, 1)'s receive at 4.1, after F(0, 1) was sent (2.0). Rank 0 then either waits (nothing
    left to do: blocked, as the engine's 1F1B loop is in its batched send/recv wait), and the handshake costs the
    waiting sender's `late_recv_idle`, or still computes (F(0, 4), 4.0 to 5.0), and it costs `late_recv`."""
    times = {"F": [1.0, 3.0]}
    waiting = {0: [("F", 0, 0), ("F", 0, 1)], 1: [("F", 1, 0), ("F", 1, 1)]}
    computing = {0: [("F", 0, mb) for mb in range(5)], 1: [("F", 1, 0), ("F", 1, 1)]}

    def start(tasks):
        return next(t.start for t in tasks if t.rank == 1 and t.microbatch == 1)

    costs = {"p2p": 0.1, "late_recv": 0.5, "late_recv_idle": 0.2}
    assert start(simulate_actions(waiting, times, 2, **costs)) == pytest.approx(4.1 + 0.2)
    assert start(simulate_actions(computing, times, 2, **costs)) == pytest.approx(4.1 + 0.5)
    # without the waiting sender's price every late receive costs `late_recv` (the model before RESULTS 14.9)
    assert start(simulate_actions(waiting, times, 2, p2p=0.1, late_recv=0.5)) == pytest.approx(4.1 + 0.5)
    # the runtime's per-action work counts as working: a sender in its overhead is not waiting
    overhead = simulate_actions(computing, times, 2, overhead=0.05, **costs)
    assert start(overhead) == pytest.approx(next(t.end for t in overhead if t.rank == 1) + 0.05 + 0.5)


def test_extra_time_lengthens_one_action():
    orders = {0: [("F", 0, 0), ("F", 0, 1)]}
    tasks = simulate_actions(orders, {"F": [1.0]}, 1, extra={("F", 0, 1): 0.25})
    assert [t.end - t.start for t in tasks] == pytest.approx([1.0, 1.25])


def test_slowed_actions_scale_each_measured_action():
    from trex.cost_model.pipeline import slowed_actions

    extra = slowed_actions({"F": [2.0, 4.0]}, {("F", 1, 0): 1.5, ("F", 0, 3): 1.0, ("X", 0, 0): 2.0})
    assert extra == pytest.approx({("F", 1, 0): 2.0, ("F", 0, 3): 0.0})


def test_the_first_chunk_has_no_input_gradient_pass():
    from trex.runtime.pipeline.bubble import split_backward

    assert split_backward([4.0, 6.0]) == {"I": [0.0, 3.0], "W": [4.0, 3.0]}


def test_a_send_posted_after_a_later_action_delays_its_consumer():
    """`sends`: rank 0 posts F(0, 0)'s send only after its next action (as the engine does for an overlapped
    forward and backward, DualPipeV's OVERLAP_F_B), so rank 1's forward waits for that action too."""
    orders = {0: [("F", 0, 0), ("F", 0, 1)], 1: [("F", 1, 0), ("F", 1, 1)]}
    times = {"F": [1.0, 1.0]}
    at_end = simulate_actions(orders, times, 2, p2p=0.1)
    after_next = simulate_actions(orders, times, 2, p2p=0.1, sends={0: {("F", 0, 0): 1}})

    def start(tasks, mb):
        return next(t.start for t in tasks if t.rank == 1 and t.microbatch == mb)

    assert start(at_end, 0) == pytest.approx(1.1)
    assert start(after_next, 0) == pytest.approx(2.1)  # F(0, 1) ends at 2, then the send
    assert start(after_next, 1) == pytest.approx(3.1)  # F(0, 1)'s own send at its end (not listed)


def test_a_send_to_a_rank_already_waiting_holds_its_sender():
    """`ready_send`: rank 1 waits for F(0, 0) from the step's start (its receive is posted), so posting that send
    holds rank 0 for `ready_send` before F(0, 1) (gloo's transport thread on the sender's core); F(0, 1)'s send
    finds rank 1 still computing F(1, 0) (receive not posted), is only queued and costs rank 0 nothing."""
    orders = {0: [("F", 0, 0), ("F", 0, 1), ("F", 0, 2)], 1: [("F", 1, 0), ("F", 1, 1)]}
    times = {"F": [1.0, 3.0]}
    before = simulate_actions(orders, times, 2, p2p=0.1)
    held = simulate_actions(orders, times, 2, p2p=0.1, ready_send=0.4)

    def start(tasks, rank, mb):
        return next(t.start for t in tasks if t.rank == rank and t.microbatch == mb)

    assert start(before, 0, 1) == pytest.approx(1.0)
    assert start(held, 0, 1) == pytest.approx(1.4)
    assert start(held, 1, 0) == pytest.approx(1.1)  # the message itself leaves when the post begins
    assert start(held, 0, 2) == pytest.approx(2.4)  # F(0, 1)'s send was queued: rank 1 was computing F(1, 0)
    assert simulated_bubble(held, own_span=True) > simulated_bubble(before, own_span=True)


def test_sends_posted_together_leave_one_after_the_other():
    """Two sends posted after one action (as the engine posts SEND_F, then SEND_B, after DualPipeV's overlapped
    forward and backward), both to a rank that posted their receives at the step's start: the second leaves
    `ready_send` after the first, so its consumer starts that much later."""
    orders = {0: [("F", 0, 0), ("F", 0, 1)], 1: [("F", 1, 0), ("F", 1, 1)]}
    times = {"F": [1.0, 0.1]}
    costs = {"p2p": 0.1, "sends": {0: {("F", 0, 0): 1}}, "posts": {1: {("F", 1, 1): -1}}}
    before = simulate_actions(orders, times, 2, **costs)
    held = simulate_actions(orders, times, 2, ready_send=0.4, **costs)

    def start(tasks, mb):
        return next(t.start for t in tasks if t.rank == 1 and t.microbatch == mb)

    assert start(before, 0) == pytest.approx(2.1) and start(before, 1) == pytest.approx(2.2)
    assert start(held, 0) == pytest.approx(2.1)  # F(0, 0)'s send first, when F(0, 1) ends
    assert start(held, 1) == pytest.approx(2.0 + 0.4 + 0.1)  # F(0, 1)'s send once the first post let go


def test_under_time_slices_a_send_holds_its_senders_own_core_and_the_sender_computes_on():
    """One core, slices longer than the work: rank 0's send of F(0, 0) to rank 1 (waiting since the start, its
    receive posted) holds rank 0 for `ready_send`, and the hold is gloo's transport thread on rank 0's own core
    (RESULTS 14.18: the measured gap after such a send is the hold, not the hold and then a turn in the run
    queue). So the core is not handed to rank 1 during the hold, and rank 0 computes F(0, 1) right after it,
    without queueing behind rank 1 woken meanwhile; the hold is rank 0's work (not idle) only as a core's use."""
    orders = {0: [("F", 0, 0), ("F", 0, 1)], 1: [("F", 1, 0), ("F", 1, 1)]}
    times = {"F": [1.0, 3.0]}
    tasks = simulate_actions(orders, times, 2, p2p=0.1, ready_send=0.4, cores=1, slice_s=10.0)
    at = {(t.rank, t.microbatch): (t.start, t.end) for t in tasks}
    assert at[(0, 1)] == pytest.approx((1.4, 2.4))  # on its core after the hold (the old model: 4.1-5.1)
    assert at[(1, 0)] == pytest.approx((2.4, 5.4))  # woken at 1.1, its turn when rank 0 blocks
    released = simulate_actions(orders, times, 2, p2p=0.1, ready_send=0.4, cores=1, slice_s=10.0, hold_on_core=False)
    # the model before (RESULTS 14.17), kept for the bench's side-by-side: the core goes to rank 1 for the hold
    before = {(t.rank, t.microbatch): t.start for t in released}
    assert (before[(1, 0)], before[(0, 1)]) == pytest.approx((1.1, 4.1))
    # with a core per rank the hold is unchanged: rank 0 idle for it, no core to keep (the model at pp=2)
    own = {(t.rank, t.microbatch): t.start for t in simulate_actions(orders, times, 2, p2p=0.1, ready_send=0.4)}
    assert own[(0, 1)] == pytest.approx(1.4) and own[(1, 0)] == pytest.approx(1.1)


def test_under_time_slices_a_spent_slice_during_a_send_hold_goes_to_the_back_of_the_queue():
    """The hold runs on the sender's core like its compute: when the slice is spent mid-hold and another rank waits,
    the sender goes to the back of the run queue and the rest of the hold waits for its next turn."""
    orders = {0: [("F", 0, 0), ("F", 0, 1)], 1: [("F", 1, 0), ("F", 1, 1)]}
    tasks = simulate_actions(orders, {"F": [1.0, 1.0]}, 2, ready_send=0.4, cores=1, slice_s=1.2)
    at = {(t.rank, t.microbatch): (t.start, t.end) for t in tasks}
    # rank 0: F(0, 0) 0-1.0, hold 1.0-1.2 (slice spent, rank 1 woken at 1.0 waits), rank 1 1.2-2.2, hold's rest
    # 2.2-2.4, F(0, 1) 2.4-3.4 (the old model: rank 1 1.0-2.0 on the core rank 0 let go, F(0, 1) 2.0-3.0 after it)
    assert at[(1, 0)] == pytest.approx((1.2, 2.2))
    assert at[(0, 1)] == pytest.approx((2.4, 3.4))
