"""Pipeline schedules: how layers split into stages, and how long m micro-batches take through them.

Layers split into pp*vpp chunks; device d holds chunks d, d+pp, ... (Megatron's interleaving).
The default split spreads layers as evenly as possible and gives the shorter chunks to the ends,
which also carry the embedding and the output head (Megatron's account-for-embedding/loss split).

Two ways to get the step's pipeline time from per-chunk forward/backward times:

* `closed_form_makespan` - m * max_d t_d + (pp - 1)/vpp * mean_d t_d, with t_d a device's time per
  micro-batch over all its chunks. Uniform stages give Narayanan et al.'s bubble (p-1)/(v m); a slow
  stage sets the steady-state rate. Microseconds, used by the estimator and the planner.
* `simulate` - list scheduling of Megatron's (interleaved) 1F1B order with its dependencies
  (forward of chunk c after chunk c-1's, backward after chunk c+1's and its own forward, p2p
  latency on every stage boundary). Exact for the model's task times; used for Chrome traces and
  to test the closed form.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from trex.errors import TrexError


def default_layers_per_chunk(num_layers: int, chunks: int) -> tuple[int, ...]:
    """Layers per chunk, as even as possible; the shorter chunks go to the ends first, then inwards.

    Up to two chunks more than layers are allowed: the end chunks then hold only the embedding
    or the output head (Megatron's account-for-embedding/loss split with one layer per chunk).
    """
    if chunks > num_layers + 2:
        raise TrexError(f"{chunks} pipeline chunks exceed the {num_layers} layers (+ embedding and head chunks)")
    base, extra = divmod(num_layers, chunks)
    counts = [base] * chunks
    order = sorted(range(chunks), key=lambda c: -min(c, chunks - 1 - c))  # middle chunks first
    for c in order[:extra]:
        counts[c] += 1
    return tuple(counts)


def device_chunks(device: int, pp: int, vpp: int) -> list[int]:
    return [device + pp * j for j in range(vpp)]


def closed_form_makespan(per_device: Sequence[float], microbatches: int, vpp: int) -> float:
    """Pipeline time of one step from each device's time per micro-batch (all its chunks)."""
    if not per_device:
        return 0.0
    pp = len(per_device)
    slowest = max(per_device)
    if pp == 1:
        return microbatches * slowest
    return microbatches * slowest + (pp - 1) / vpp * (sum(per_device) / pp)


def warmup_forwards(device: int, pp: int, vpp: int, microbatches: int) -> int:
    """Forward chunk-steps a device runs before its first backward (Megatron's schedule)."""
    total = microbatches * vpp
    if vpp == 1:
        return min(pp - device - 1, microbatches)
    return min((pp - device - 1) * 2 + (vpp - 1) * pp, total)


def forward_chunk_order(device: int, pp: int, vpp: int, microbatches: int) -> list[tuple[int, int]]:
    """(local chunk, micro-batch) of each forward step of a device, in Megatron's interleaved order."""
    steps = []
    for k in range(microbatches * vpp):
        group, within = divmod(k, pp * vpp)
        local = within // pp
        mb = group * pp + within % pp
        steps.append((local, mb))
    return steps


def in_flight(device: int, pp: int, vpp: int, microbatches: int) -> list[int]:
    """Peak number of micro-batches whose activations each local chunk holds at once.

    The first `warmup + 1` forward steps run before any backward frees memory; forward step k
    works on local chunk (k mod pp*vpp) // pp (see `forward_chunk_order`).
    """
    steps = warmup_forwards(device, pp, vpp, microbatches) + 1
    cycles, rest = divmod(steps, pp * vpp)
    return [cycles * pp + min(pp, max(0, rest - j * pp)) for j in range(vpp)]


@dataclass(frozen=True)
class Task:
    device: int
    chunk: int  # global chunk index
    microbatch: int
    kind: str  # "F" or "B"
    start: float
    end: float


def simulate(
    forward: Sequence[float], backward: Sequence[float], pp: int, vpp: int, microbatches: int, p2p: float = 0.0
) -> list[Task]:
    """Event simulation of (interleaved) 1F1B. forward[c], backward[c]: one micro-batch through chunk c."""
    chunks = pp * vpp
    if len(forward) != chunks or len(backward) != chunks:
        raise ValueError(f"need {chunks} chunk times, got {len(forward)} forward and {len(backward)} backward")
    if vpp > 1 and microbatches % pp:
        raise TrexError(f"interleaved 1F1B needs micro-batches ({microbatches}) divisible by pp ({pp})")
    programs: list[list[tuple[str, int, int]]] = []
    for d in range(pp):
        fwd = [("F", local * pp + d, mb) for local, mb in forward_chunk_order(d, pp, vpp, microbatches)]
        bwd = [("B", (vpp - 1 - local) * pp + d, mb) for local, mb in forward_chunk_order(d, pp, vpp, microbatches)]
        warm = warmup_forwards(d, pp, vpp, microbatches)
        program = fwd[:warm]
        f_i, b_i = warm, 0
        while f_i < len(fwd) or b_i < len(bwd):
            if f_i < len(fwd):
                program.append(fwd[f_i])
                f_i += 1
            if b_i < len(bwd):
                program.append(bwd[b_i])
                b_i += 1
        programs.append(program)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * pp
    position = [0] * pp
    tasks: list[Task] = []
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = False
        for d in range(pp):
            while position[d] < len(programs[d]):
                kind, chunk, mb = programs[d][position[d]]
                if kind == "F":
                    deps = [("F", chunk - 1, mb)] if chunk > 0 else []
                else:
                    deps = [("F", chunk, mb)] + ([("B", chunk + 1, mb)] if chunk < chunks - 1 else [])
                if any(dep not in done for dep in deps):
                    break
                ready = max(
                    [free[d]] + [done[dep] + (p2p if dep[1] % pp != d or dep[0] != kind else 0.0) for dep in deps]
                )
                duration = forward[chunk] if kind == "F" else backward[chunk]
                end = ready + duration
                done[(kind, chunk, mb)] = end
                free[d] = end
                tasks.append(Task(d, chunk, mb, kind, ready, end))
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (a bug in the schedule order)")
    return tasks


def makespan(tasks: Sequence[Task]) -> float:
    return max((t.end for t in tasks), default=0.0)


# -- bubbles of the schedules the runtime executes --------------------------------------------------------
#
# Bubble fraction = idle share of a stage's step time. With m micro-batches, p stages and v chunks per
# stage, uniform stages and the backward twice the forward:
#   GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): (p-1)/(m+p-1)
#   interleaved 1F1B (Narayanan et al. 2021 §2.2.2): the fill and drain shrink by v: (p-1)/(v*m+p-1)
# Zero-bubble schedules split the backward into the input gradient (I) and the weight gradient (W) and
# fill the fill/drain with W (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; ZB-V is its V-shaped
# schedule with two chunks per stage; DualPipeV is DeepSeek-AI's V-shaped DualPipe, DeepSeek-V3 report
# 2024 §3.2.1). Their idle time depends on the ratios of F, I and W, so it is taken from an event
# simulation of the schedule's own action lists (`simulate_actions`), which also reproduces the closed
# forms above for GPipe, 1F1B and interleaved 1F1B (tests/cost_model/test_pipeline_bubble.py).

CLOSED_FORM_SCHEDULES = ("gpipe", "1f1b", "interleaved")


def closed_form_bubble(schedule: str, pp: int, vpp: int, microbatches: int) -> float:
    """The papers' bubble fraction (see above) for uniform stages; ValueError for schedules without one."""
    if schedule not in CLOSED_FORM_SCHEDULES:
        raise ValueError(
            f"no closed-form bubble for {schedule!r}; use simulate_actions (closed forms: gpipe, 1f1b, interleaved)"
        )
    chunks = vpp if schedule == "interleaved" else 1
    return (pp - 1) / (chunks * microbatches + pp - 1)


@dataclass(frozen=True)
class ActionTask:
    rank: int
    kind: str  # "F" forward, "B" full backward, "I" input-gradient backward, "W" weight-gradient backward
    stage: int  # chunk index (torch.distributed.pipelining's stage index)
    microbatch: int
    start: float
    end: float


def simulate_actions(
    orders: dict[int, Sequence[tuple[str, int, int]]],
    durations: dict[str, Sequence[float]],
    stages: int,
    p2p: float = 0.0,
    overhead: float = 0.0,
    cores: float | None = None,
    late_recv: float | None = None,
    posts: dict[int, dict[tuple[str, int, int], int]] | None = None,
    extra: dict | None = None,
    sends: dict[int, dict[tuple[str, int, int], int]] | None = None,
    late_recv_idle: float | None = None,
    slice_s: float | None = None,
    ready_send: float | None = None,
    hold_on_core: bool = True,
) -> list[ActionTask]:
    """Event simulation of per-rank compute action lists (kind, stage, micro-batch), each rank in its order.

    Dependencies: F(s, mb) after F(s-1, mb); B or I (s, mb) after F(s, mb) and after the backward (B or I)
    of (s+1, mb); W(s, mb) after I(s, mb). `durations[kind][s]`: one micro-batch of kind through stage s.
    A dependency on another rank's action adds `p2p` (the activation or gradient transfer: a wait, no CPU).
    Every action first costs `overhead` on its rank (the schedule runtime's own work per action: posting
    sends and receives, bookkeeping), which is not compute: the returned task starts after it.
    `cores`: when the ranks share fewer cores than there are ranks (CPU ranks on one host), the ranks
    working at a moment (overhead or compute) progress at min(1, cores / working) - processor sharing;
    None: every rank has its own processor.
    `slice_s`: with `cores`, the host's scheduler hands out cores in time slices of `slice_s` instead
    (`time_slice_slots`): at most `cores` ranks run at once, each at full speed; a rank whose input arrives
    while every core is taken waits in the run queue, first come first served, and that wait is not part of its
    action (the action's clock starts when its thread runs: the measured bubble counts it as idle, where
    processor sharing would have started the action at once, slowed, and counted it as busy); a running rank
    whose slice is spent while another waits goes to the back of the queue (its action's clock runs on); a rank
    whose next action is ready when its action ends keeps its core.
    `late_recv`: a rendezvous link (gloo's send waits for the receiver's recv: the payload leaves only after
    the receiver has posted its recv and told the sender so) and a runtime that posts each receive just
    before the action that needs it (torch.distributed.pipelining). A message whose sender finished before
    the receiving rank reached the action is then delivered `late_recv` after the rank posts the recv (the
    handshake's round trip, with the sender's transport thread woken while its rank computes), instead of
    `p2p` after the sender's end; None: every receive is posted in time (p2p only).
    `posts[rank][action]`: where the runtime posts the receive of the action's remote input - the index in
    the rank's order of the action after whose end it is posted (-1: at the step's start); an action not
    listed posts it when the rank reaches it (just in time, as the engine's GPipe and 1F1B loops do).
    `extra`: seconds added to single actions ((kind, stage, micro-batch) -> seconds), e.g. the host's
    preemptions drawn for one sampled step (`preempted_extra`).
    `sends[rank][action]`: where the runtime posts the send of the action's output to another rank - the index
    in the rank's order of the action after whose end it is posted; an action not listed sends at its own end.
    The message leaves then, not when its action ends: torch.distributed.pipelining's DualPipeV runs an
    overlapped forward and backward (OVERLAP_F_B) one after the other on a CPU and posts both sends after the
    pair (`_add_send_recv` puts SEND_F and SEND_B behind the OVERLAP_F_B action), so the forward's activation
    waits for the backward beside it.
    `late_recv_idle`: the late receive's price when the sending rank is not working at the moment the receive is
    posted (blocked in a wait, as the engine's 1F1B loop is after posting each batch of sends and receives:
    it waits on the sends too). Its transport thread then answers the handshake at once, where a computing
    sender's must first be scheduled beside its rank's thread; both are measured by the calibration
    (`calibration.measure_late_recv`). None: `late_recv` whatever the sender does.
    `ready_send`: what posting a send costs its rank when the receiving rank has already posted the matching
    receive (gloo writes the payload at once, and the sender's transport thread then holds the sender's core:
    measured by `calibration.measure_ready_send` as the time the sender's own work after the post loses). The
    rank's next action, and its next send posted at the same moment (DualPipeV posts the sends of an overlapped
    forward and backward one after the other), wait that long; a send whose receive is not posted yet is only
    queued (its price is the receiver's late receive). None: posting costs nothing (the model before RESULTS
    14.13). Under time slices the hold is a phase of the rank's work on the core it holds (the transport thread
    runs there): the core is not handed to a waiting rank meanwhile, a slice spent during it sends the rank to the
    back of the queue as compute does, and the rank's next action, when ready, follows on the same core. The model
    before RESULTS 14.18 let the core go for the hold and queued the rank again after it, so the measured price,
    which already holds the sender's wait for its core, was followed by a second wait (ZB-V at pp=4 on 2 cores:
    the gap after a send-posting action simulated at 4.3 ms median against 2.2 ms measured); `hold_on_core=False`
    is that model, for the bench's side-by-side."""
    owner = {stage: rank for rank, order in orders.items() for kind, stage, _ in order}
    done: dict[tuple[str, int, int], float] = {}
    position = {rank: 0 for rank in orders}
    free = {rank: 0.0 for rank in orders}
    working: dict[int, list] = {}  # rank -> [phase "O"/"C", work left, compute start]
    began: dict[int, float] = {}  # rank -> when its current action's work (overhead, then compute) began
    spans: dict[int, list[tuple[float, float]]] = {rank: [] for rank in orders}  # finished work, per rank
    tasks: list[ActionTask] = []
    remaining = sum(len(order) for order in orders.values())
    released: dict[tuple[str, int, int], float] = {}  # with `ready_send`: when each remote output's send was posted
    receivers = remote_consumers(orders) if ready_send is not None else {}
    index_of = {rank: {action: i for i, action in enumerate(order)} for rank, order in orders.items()}

    def backward_key(stage: int, mb: int) -> tuple[str, int, int]:
        return ("B", stage, mb) if ("B", stage, mb) in done else ("I", stage, mb)

    def sent(key: tuple[str, int, int], rank: int) -> float | None:
        """When the output of action `key` is available to `rank`: its end on its own rank, else when its send is
        posted (`sends`: after a later action of its rank; `ready_send`: after the sends posted before it)."""
        if key not in done:
            return None
        source = owner[key[1]]
        if source != rank and key in released:
            return released[key]
        where = (sends or {}).get(source, {}).get(key) if source != rank else None
        if where is None:
            return done[key]
        return done.get(orders[source][where])

    def earliest(rank: int) -> float | None:
        """When the rank's next action may begin (its inputs arrived), None while an input is missing."""
        kind, stage, mb = orders[rank][position[rank]]
        deps: list[tuple[float | None, int]] = []  # (time, stage it comes from)
        if kind == "F" and stage > 0:
            deps.append((sent(("F", stage - 1, mb), rank), stage - 1))
        elif kind in ("B", "I"):
            deps.append((done.get(("F", stage, mb)), stage))
            if stage < stages - 1:
                deps.append((sent(backward_key(stage + 1, mb), rank), stage + 1))
        elif kind == "W":
            deps.append((done.get(("I", stage, mb)), stage))
        if any(t is None for t, _ in deps):
            return None
        where = (posts or {}).get(rank, {}).get((kind, stage, mb))
        if where is None:  # posted when the rank reaches the action
            posted = free[rank]
        else:  # posted ahead, after an earlier action of the rank (or at the step's start)
            posted = done[orders[rank][where]] if where >= 0 else 0.0

        def arrival(t: float, s: int) -> float:
            if owner.get(s, rank) == rank:
                return t
            if late_recv is not None and t <= posted:
                if late_recv_idle is not None and not working_at(owner[s], posted):
                    return posted + late_recv_idle
                return posted + late_recv
            return t + p2p

        return max([posted, free[rank]] + [arrival(t, s) for t, s in deps])

    def receive_posted(rank: int, action: tuple[str, int, int], t: float) -> bool:
        """Whether `rank` has posted the receive of `action`'s remote input by time `t` (<= the simulation's now)."""
        where = (posts or {}).get(rank, {}).get(action)
        if where is not None:
            at = 0.0 if where < 0 else done.get(orders[rank][where])
            return at is not None and at <= t
        return position[rank] == index_of[rank][action] and rank not in working and free[rank] <= t

    def post_sends(rank: int, index: int, now: float) -> float:
        """Post the sends the rank's engine posts after its action `index` ends at `now` (`ready_send`); returns
        when the rank is free again: each send to a rank that already posted its receive holds it `ready_send`."""
        at = now
        for key in sent_after.get(rank, {}).get(index, ()):
            released[key] = at
            if any(receive_posted(r, action, at) for r, action in receivers.get(key, ())):
                at += ready_send
        return at

    def working_at(rank: int, t: float) -> bool:
        """Whether `rank` was working (runtime overhead or compute) at time `t` (<= the simulation's now)."""
        if rank in working and began[rank] <= t:
            return True
        return any(start <= t < end for start, end in reversed(spans[rank]))

    def work_of(rank: int) -> float:
        kind, stage, mb = orders[rank][position[rank]]
        return durations[kind][stage] + (extra or {}).get((kind, stage, mb), 0.0)

    sent_after: dict[int, dict[int, list[tuple[str, int, int]]]] = {}  # rank -> action index -> sends posted then
    for key in receivers:
        source = owner[key[1]]
        where = (sends or {}).get(source, {}).get(key, index_of[source][key])
        sent_after.setdefault(source, {}).setdefault(where, []).append(key)
    for by_index in sent_after.values():
        for keys in by_index.values():
            keys.sort(key=lambda key: (key[0] != "F", index_of[owner[key[1]]][key]))  # SEND_F before SEND_B

    slots = time_slice_slots(cores, slice_s, len(orders))
    running: dict[int, float] = {}  # time slices: rank holding a core -> the time left of its slice
    queue: deque[int] = deque()  # time slices: runnable ranks waiting for a core, first come first served
    now = 0.0
    while remaining:
        starts = []
        for rank in orders:
            if rank in working or position[rank] >= len(orders[rank]):
                continue
            ready = earliest(rank)
            if ready is None:
                continue
            if ready <= now:
                # compute start: now, or with time slices when the rank first runs (it may wait for a core)
                start = now if slots is None else None
                working[rank] = ["O", overhead, now] if overhead > 0 else ["C", work_of(rank), start]
                began[rank] = now
                if slots is not None and rank not in running:
                    queue.append(rank)  # woken: waits for a core (a rank that just finished keeps its own)
            else:
                starts.append(ready)
        if slots is not None:
            for rank in [r for r in running if r not in working]:
                del running[rank]  # blocked on a message: its core goes to the next runnable rank
            while queue and len(running) < slots:
                running[queue.popleft()] = slice_s
        if not working:
            if not starts:
                stuck = {r: order[position[r]] for r, order in orders.items() if position[r] < len(order)}
                raise RuntimeError(f"pipeline action lists deadlock (waiting: {stuck})")
            now = min(starts)
            continue
        if slots is None:
            rate = 1.0 if cores is None or len(working) <= cores else cores / len(working)
            advancing = list(working)
            step = min(left for _, left, _ in working.values()) / rate
        else:
            rate, advancing = 1.0, list(running)
            for rank in advancing:
                if working[rank][2] is None:
                    working[rank][2] = now
            step = min(working[r][1] for r in advancing)
            if queue:
                step = min(step, min(running.values()))
        if starts:
            step = min(step, min(starts) - now)
        now += step
        for rank in advancing:
            state = working[rank]
            state[1] -= step * rate
            if slots is not None:
                running[rank] -= step
            if state[1] > 1e-12 * max(1.0, now):
                continue
            if state[0] == "S":  # the sends' hold is over (time slices): the rank's next action may begin
                free[rank] = now
                spans[rank].append((began.pop(rank), now))
                del working[rank]
                continue
            kind, stage, mb = orders[rank][position[rank]]
            if state[0] == "O":
                working[rank] = ["C", work_of(rank), now]
                continue
            done[(kind, stage, mb)] = now
            free[rank] = now
            tasks.append(ActionTask(rank, kind, stage, mb, state[2], now))
            spans[rank].append((began.pop(rank), now))
            del working[rank]
            position[rank] += 1
            remaining -= 1
            if receivers:
                free[rank] = post_sends(rank, position[rank] - 1, now)
                if free[rank] > now and slots is not None and hold_on_core:
                    # time slices: the send's transport thread runs on the core its rank holds (a phase of the rank's
                    # work, not a release of the core), and the rank computes on after it without queueing again
                    working[rank] = ["S", free[rank] - now, now]
                    began[rank] = now
                    free[rank] = now
                elif free[rank] > now:  # its core is held by the send's transport thread: working, to a late receive
                    spans[rank].append((now, free[rank]))
        if slots is not None:
            for rank in list(running):
                if running[rank] > 1e-12 * max(1.0, now):
                    continue
                if queue and rank in working:  # its slice is spent and another rank waits: back of the queue
                    del running[rank]
                    queue.append(rank)
                else:
                    running[rank] = slice_s
    return tasks


def remote_consumers(orders: dict[int, Sequence[tuple[str, int, int]]]) -> dict[tuple, list[tuple[int, tuple]]]:
    """Each action whose output another rank needs -> [(that rank, the action that needs it)]: a forward's
    activation goes to the next stage's forward, a backward's (B or I) input gradient to the previous stage's
    backward (the dependencies of `simulate_actions`)."""
    owner = {stage: rank for rank, order in orders.items() for _, stage, _ in order}
    every = {action for order in orders.values() for action in order}
    out: dict[tuple, list[tuple[int, tuple]]] = {}
    for rank, order in orders.items():
        for kind, stage, mb in order:
            if kind == "F" and stage > 0:
                source = ("F", stage - 1, mb)
            elif kind in ("B", "I") and stage + 1 in owner:
                source = ("B", stage + 1, mb) if ("B", stage + 1, mb) in every else ("I", stage + 1, mb)
            else:
                continue
            if owner[source[1]] != rank:
                out.setdefault(source, []).append((rank, (kind, stage, mb)))
    return out


def time_slice_slots(cores: float | None, slice_s: float | None, ranks: int) -> int | None:
    """The cores the time-slice model (`simulate_actions(slice_s=...)`) hands out; None: processor sharing (a
    share of the host's cores that is not a whole number of cores: the pipeline's ranks then share them with
    another pipeline's) or a core per rank."""
    if slice_s is None or cores is None or cores >= ranks:
        return None
    if slice_s <= 0:
        raise ValueError(f"a time slice must be positive, got {slice_s} s")
    return int(cores) if cores >= 1 and cores == int(cores) else None


def simulated_bubble(
    tasks: Sequence[ActionTask], head: float = 0.0, tail: float = 0.0, own_span: bool = False
) -> float:
    """Mean over ranks of the idle share of the step.

    own_span=False: every rank's step is the pipeline's makespan (the papers' definition). own_span=True:
    a rank's step ends with its own last action, plus `tail`, and begins `head` before the simulation's
    time 0 - what a rank's clock around the schedule's `step()` measures (the last stage returns before
    the first stage finishes its drain)."""
    if not tasks:
        return 0.0
    begin = min(0.0, min(t.start for t in tasks))
    makespan = max(t.end for t in tasks)
    fractions = []
    for rank in sorted({t.rank for t in tasks}):
        mine = [t for t in tasks if t.rank == rank]
        end = max(t.end for t in mine) if own_span else makespan
        span = head + (end - begin) + tail
        busy = sum(t.end - t.start for t in mine)
        fractions.append(1.0 - busy / span if span > 0 else 0.0)
    return sum(fractions) / len(fractions)


def slowed_actions(durations: dict[str, Sequence[float]], slowdowns: dict) -> dict[tuple[str, int, int], float]:
    """Extra seconds per action when each action (kind, stage, micro-batch) takes `slowdowns[action]` times
    its duration (a host's measured slowdowns of one step; the `extra` of `simulate_actions`)."""
    return {
        (kind, stage, mb): durations[kind][stage] * (factor - 1.0)
        for (kind, stage, mb), factor in slowdowns.items()
        if kind in durations
    }
