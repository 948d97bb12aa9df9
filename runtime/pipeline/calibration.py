"""What one pipeline action costs besides its compute, measured on the ranks that run the schedule.

The cost model's pipeline simulation prices each forward and backward; the schedule runtime adds, per
action, its own work (posting and waiting on the activation/gradient sends and receives, bookkeeping
in Python) and, per cross-rank dependency, the transfer over the link. Neither is a constant to fit to
the measured bubble: both are measured here by calibration micro-benchmarks, once per job, on the same
process group, before the prediction is made.

* The link: a point-to-point message of `nbytes` costs `send_recv(nbytes, tier)` of the target's link
  tier (`cost_model.collectives`). On CPU that is the `cpu` target's gloo-loopback tier when `trex
  calibrate` measured it; an uncalibrated tier is replaced by a ping-pong micro-benchmark between two
  pipeline ranks (alpha-beta fit over message sizes around the activation's).
* The runtime: the same schedule class of the engine (`schedules.build_schedule`) runs the same
  action lists over *null* chunks - modules with the real chunks' input and output shapes and almost
  no compute (the activations sent between ranks keep their size) - with the same action timestamps
  as the training run (`timing.TimedPipelineStage`). From those timestamps: the gap between two
  consecutive actions of a rank whose inputs had already arrived (`action_s`, the per-action
  overhead), the time from `step()` to the first action and from the last action to the return
  (`head_s`, `tail_s`), and the delay from a neighbour's send to the dependent action's start when the rank
  was waiting for it (`remote_delay_s`). The simulation prices a message to a waiting rank at
  `delivery_s` = remote_delay_s - action_s (at least the link's p2p): the ping-pong of the link model
  runs between two ranks with nothing else to do, while in the pipeline the waiting rank's wake-up (gloo's
  transport thread, then the rank's thread) competes with the other ranks' compute for the cores - 4 ranks
  on 2 cores: ~0.4-0.8 ms against a 0.15 ms ping-pong (RESULTS 14.6). A neighbour's send is posted where
  the engine's lowered action lists put it (`schedules.send_posts`: DualPipeV's overlapped forward's
  activation leaves after the backward beside it), not always at its action's end.
  Only gaps before actions with no input from another rank count as runtime work: a gap before an
  action whose remote input was sent before the rank got there is the link's handshake (below).
* The late receive: gloo's send is a rendezvous (the payload leaves only once the receiver has posted
  its recv and told the sender so - gloo's tcp transport, `Pair::send` / `NOTIFY_RECV_READY`), and the
  engine posts a receive only shortly before the action that needs it. A message sent before its
  receive was posted therefore arrives a handshake after the receive is posted. `measure_late_recv`
  times exactly that between pairs of pipeline ranks, with the sender computing meanwhile as in a
  pipeline (its transport thread must be woken while its rank's thread holds a core). The delay is bimodal
  (most a few tenths of a ms, some several ms: RESULTS 14.3), so its mean needs many messages: 60 per rank
  pair (with 30, the mean moved 1.2-4.5 ms between the jobs of one bench run, RESULTS 14.5).
  It is measured twice: with the sender computing, and with the sender blocked in its send's wait
  (`late_recv_idle_s`). The engine's 1F1B loop waits on every batch of sends and receives it posts, so there
  a late receive's sender is usually blocked, not computing, and its transport thread answers at once
  (RESULTS 14.9); the simulation prices each late receive by what its sender is doing when it is posted.

* The ready send: posting a send whose receive the other rank has already posted (it waits for the message)
  writes the payload at once, and then the sender's gloo transport thread keeps the sender's core for
  milliseconds while the sender's thread, which computes on after the post, waits in the run queue. Measured on
  2 gloo ranks on this host (RESULTS 14.13): a 4-128 KiB send to a waiting receiver took 2.9-3.9 ms of the
  sender's wall time inside the `isend` call, almost all of it run-queue delay (/proc's schedstat), while
  the sender's transport thread ran 1.9-2.9 ms of CPU per message and the receiver had the payload 0.08 ms
  (median) after the post began; a send posted before its receive costs the sender ~0.07 ms (it is only
  queued; the late receive prices it). `measure_ready_send` times exactly that: the work a sender does right
  after such a post, against the same work without one, twice: with the sender computing on at once (GPipe
  and the lowered runtime post their sends and wait for them at the end) and with the sender first waiting
  for the send to complete (the engine's 1F1B loop waits on each batch it posts, the send included) - which
  of the two its schedule does is what prices it. The simulation holds the sending rank that long
  (`simulate_actions(ready_send=...)`), which also delays a second send posted right after (DualPipeV's SEND_F
  and SEND_B after an overlapped pair).

* The host's slowdowns: a rank's forward or backward does not take the same time every time - on a
  shared CPU host the OS gives its core to another thread for a while (or, with more ranks than cores,
  to another rank), and such a slowdown on one rank is idle time on its neighbours, which a simulation
  with each task's typical time does not see (the zero-bubble schedules, whose compute-only bubble is a
  few percent, feel it most). The null chunks therefore compute: each forward, input-gradient and
  weight-gradient pass burns a fixed amount of work sized to the cost model's time for that task
  (`task_times`), so the calibration's ranks busy and idle the cores in the schedule's own pattern.
  A task's slowdown in a calibration step is its measured time over that nominal time, divided by the
  typical (median) slowdown of the same task over the calibration; the prediction replays each
  calibration step's slowdowns onto the same actions (`slowdowns`, one sample per step; 12 steps, since one
  step's bubble moves by tens of percent with the host: RESULTS 14.5).

* The host's time slices: with more pipeline ranks on the host than cores (4 CPU ranks on 2 cores), the
  kernel does not share a core between runnable ranks at once (processor sharing): it runs one at a time for a
  slice and then switches (Linux's EEVDF scheduler checks for a switch at the scheduler tick: the bench host,
  built with CONFIG_HZ=250, ticks every 4 ms). A rank woken by its message while every core is busy waits in
  the run queue - idle time to its clock - and then computes at full speed. `measure_time_slice` measures the
  slice on the ranks themselves: every rank of the group spins on the clock at once, and the runs between the
  moments it was descheduled are the slices it got (median over the ranks). The simulation hands the cores out in slices of that length
  (`simulate_actions(slice_s=...)`) where the ranks outnumber the cores.

Timestamps of different ranks are compared directly: `time.perf_counter` is the host's monotonic
clock, shared by the processes of one host (the CPU ranks this runs on).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class PipelineOverheads:
    action_s: float  # runtime work per action on a rank, outside the compute (mean over the calibration)
    head_s: float  # step() -> the first action, on the pipeline rank whose first action waits for nothing
    tail_s: float  # the last action -> step() returns (median over ranks)
    p2p_s: float  # the link model's time for one activation message
    late_recv_s: float  # measured: a receive posted after its message was sent -> the message arrives
    remote_delay_s: float  # measured: a neighbour's send -> the dependent action's start (the rank waiting)
    link_latency_us: float
    link_bandwidth_gbs: float
    link_source: str
    activation_bytes: int
    samples: int  # local gaps the action overhead is the mean of
    # per calibration step: {(kind, stage, micro-batch): measured time / nominal time} of every compute action
    slowdowns: tuple[dict, ...] = ()
    # measured: the late receive when the sender is blocked in a wait (not computing) as the receive is posted
    late_recv_idle_s: float | None = None
    # per pipeline rank: the calibration step's time split into compute, message posts, waits, the rest
    # (`timing.comm_split`), to set beside the training run's (`measured["step_split"]`)
    step_split: tuple[dict, ...] = ()
    # measured: the host scheduler's time slice while the group's ranks all run (None: never descheduled)
    slice_s: float | None = None
    # measured: what posting a send costs its rank when the receiver already waits for it (`measure_ready_send`),
    # the sender computing on after the post / first waiting for its send to complete (1F1B's batched waits)
    ready_send_s: float | None = None
    ready_send_waited_s: float | None = None

    @property
    def delivery_s(self) -> float:
        """A message to a rank waiting for it, send posted -> delivered (the rank's own work before the action
        taken out): the measured remote delay less the per-action work, at least the link's p2p time."""
        return max(self.p2p_s, self.remote_delay_s - self.action_s)

    def to_dict(self) -> dict:
        """JSON-friendly: the slowdowns as a summary (their quantiles over every action and step)."""
        out = asdict(self)
        out["delivery_s"] = self.delivery_s
        every = sorted(r for step in self.slowdowns for r in step.values())
        out["slowdowns"] = {
            "steps": len(self.slowdowns),
            "actions": len(every),
            **{f"p{q}": every[int(q / 100 * (len(every) - 1))] if every else None for q in (10, 50, 90, 99)},
        }
        return out


# -- the link ---------------------------------------------------------------------------------------------


def measure_p2p_tier(group, nbytes: int, repeats: int = 20):
    """Alpha-beta of gloo send/recv between pipeline ranks 0 and 1 of `group` (a ping-pong; half the round
    trip per message), fitted over sizes around `nbytes`. Every rank of the group must call it."""
    from trex.cost_model.calibrate import fit_line
    from trex.cost_model.cluster import Tier

    me = dist.get_rank(group)
    peer = {0: 1, 1: 0}.get(me)
    points = []
    for size in sorted({max(256, nbytes // 16), max(1024, nbytes), 4 * max(1024, nbytes)}):
        buffer = torch.zeros(size // 4)
        times = []
        for i in range(repeats + 2):
            dist.barrier(group=group)
            if peer is None:
                continue
            other = dist.get_global_rank(group, peer)
            start = time.perf_counter()
            if me == 0:
                dist.send(buffer, other, group=group)
                dist.recv(buffer, other, group=group)
            else:
                dist.recv(buffer, other, group=group)
                dist.send(buffer, other, group=group)
            if i >= 2:
                times.append((time.perf_counter() - start) / 2)
        if peer is not None:
            points.append((float(size), statistics.median(times)))
    shared: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(shared, points, group=group)
    latency, slope = fit_line(shared[0])
    return Tier(
        "gloo-p2p",
        None,
        bandwidth_gbs=(1.0 / slope) / 1e9 if slope > 0 else 1e3,
        latency_us=latency * 1e6,
        efficiency=1.0,
        topology="switch",
        source="measured: gloo send/recv ping-pong between two pipeline ranks (runtime.pipeline.calibration)",
    )


def link_tier(group, nbytes: int):
    """The `cpu` target's link tier when `trex calibrate` measured it, else the ping-pong micro-benchmark's."""
    from trex.cost_model.catalog import get_cluster

    tier = get_cluster("cpu", dist.get_world_size()).tiers[0]
    if tier.source.startswith("measured"):
        return tier
    return measure_p2p_tier(group, nbytes)


def busy_compute(seconds: float, work: torch.Tensor) -> None:
    """Keep this rank's thread computing (small matmuls, as a chunk's kernels would) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work = torch.mm(work, work)
        work = work / work.norm()


def measure_late_recv(
    group, nbytes: int, repeats: int = 60, sender_busy_s: float = 0.02, sender_waits: bool = False
) -> float:
    """Mean time from posting a receive to its arrival when the message was sent before the receive was
    posted (see the module docstring), measured between pipeline ranks (0, 1), (2, 3), ... of `group` at
    once: the sender posts its send, then computes for `sender_busy_s` (`sender_waits`: blocks in the send's
    wait instead, as the engine's 1F1B loop waits on each batch of sends and receives it posts); the receiver
    computes for a quarter of `sender_busy_s`, then posts its recv and waits. Every rank of the group must
    call it."""
    me = dist.get_rank(group)
    size = dist.get_world_size(group)
    partner = me + 1 if me % 2 == 0 else me - 1
    active = partner < size
    buffer = torch.zeros(max(1, nbytes // 4))
    work = torch.randn(48, 48, generator=torch.Generator().manual_seed(me))
    delays = []
    for i in range(repeats + 2):
        dist.barrier(group=group)
        if not active:
            continue
        other = dist.get_global_rank(group, partner)
        if me % 2 == 0:
            request = dist.isend(buffer, other, group=group)
            if not sender_waits:
                busy_compute(sender_busy_s, work)
            request.wait()
        else:
            busy_compute(sender_busy_s / 4, work)
            start = time.perf_counter()
            dist.recv(buffer, other, group=group)
            if i >= 2:
                delays.append(time.perf_counter() - start)
    shared: list = [None] * size
    dist.all_gather_object(shared, delays, group=group)
    every = [d for part in shared for d in part]
    return statistics.fmean(every) if every else 0.0


def measure_ready_send(
    group, nbytes: int, repeats: int = 40, work_s: float = 0.008, sender_waits: bool = False
) -> float:
    """What posting a send costs its rank when the receiver has already posted the matching receive and waits, the
    sender computing on after the post (see the module docstring): the time a fixed amount of work (`burn`,
    about `work_s`) right after the post takes, less the same work's time without a post, mean over `repeats`
    rounds of each, interleaved; between pipeline ranks (0, 1), (2, 3), ... of `group` at once. `sender_waits`:
    the sender first waits for its send to complete, then computes (the engine's 1F1B loop waits on each batch
    it posts, the send included; GPipe and the lowered runtime wait for their sends at the end). Every rank of
    the group must call it."""
    me = dist.get_rank(group)
    size = dist.get_world_size(group)
    partner = me + 1 if me % 2 == 0 else me - 1
    active = partner < size
    buffer = torch.zeros(max(1, nbytes // 4))
    iterations = max(1, round(work_s / burn_seconds_per_iteration()))
    with_post, without = [], []
    for i in range(2 * repeats + 2):
        post = i % 2 == 0
        dist.barrier(group=group)
        if not active:
            continue
        other = dist.get_global_rank(group, partner)
        if me % 2 == 0:
            burn(iterations // 4)  # the receiver posts its receive meanwhile
            start = time.perf_counter()
            request = dist.isend(buffer, other, group=group) if post else None
            if request is not None and sender_waits:
                request.wait()  # (a gloo send's work is waited once: a second wait does not return)
                request = None
            burn(iterations)
            (with_post if post else without).append(time.perf_counter() - start)
            if request is not None:
                request.wait()
        elif post:
            dist.recv(buffer, other, group=group)
    shared: list = [None] * size
    dist.all_gather_object(shared, (with_post[2:], without[2:]), group=group)
    posted = [t for part, _ in shared for t in part]
    plain = [t for _, part in shared for t in part]
    return max(0.0, statistics.fmean(posted) - statistics.fmean(plain)) if posted and plain else 0.0


def spin_runs(seconds: float, gap_s: float = 1e-4) -> list[float]:
    """Spin on the clock for `seconds`; the lengths of the runs between the moments this thread was off its core
    (a jump of the clock over `gap_s`), the first run (begun before the spin, not at a slice's start) left out."""
    runs: list[float] = []
    last = segment = time.perf_counter()
    end = last + seconds
    while last < end:
        now = time.perf_counter()
        if now - last > gap_s:
            runs.append(last - segment)
            segment = now
        last = now
    return runs[1:]


def time_slice(runs: list[float], least: int = 8) -> float | None:
    """The scheduler's time slice from the runs of spinning threads (`spin_runs`): their median; None with fewer
    than `least` runs (the threads were hardly descheduled: a core each)."""
    return statistics.median(runs) if len(runs) >= least else None


def measure_time_slice(group, seconds: float = 0.25) -> float | None:
    """The host's time slice while every rank of `group` runs at once (see the module docstring): each rank
    spins for `seconds` after a barrier; the median run over the ranks. Every rank of the group must call it."""
    dist.barrier(group=group)
    runs = spin_runs(seconds)
    shared: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(shared, runs, group=group)
    return time_slice([r for part in shared for r in part])


# -- the schedule runtime ---------------------------------------------------------------------------------


_BURN = torch.randn(48, 48, generator=torch.Generator().manual_seed(0))


def burn(iterations: int) -> None:
    """A fixed amount of CPU work (small matmuls, as a chunk's kernels): the null chunks' stand-in compute."""
    work = _BURN
    with torch.no_grad():
        for _ in range(iterations):
            work = torch.mm(work, work)
            work = work / work.norm()


def burn_seconds_per_iteration() -> float:
    """One `burn` iteration's time on this rank, unloaded as far as can be told (the fastest of a few trials)."""
    trials = []
    for _ in range(5):
        start = time.perf_counter()
        burn(40)
        trials.append((time.perf_counter() - start) / 40)
    return min(trials)


class _Burn(torch.autograd.Function):
    """Identity that burns `forward_iterations` when run and `backward_iterations` when differentiated."""

    @staticmethod
    def forward(ctx, x, forward_iterations: int, backward_iterations: int):
        burn(forward_iterations)
        ctx.backward_iterations = backward_iterations
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        burn(ctx.backward_iterations)
        return grad, None, None


class NullChunk(nn.Module):
    """A chunk with the real one's input and output shapes and a fixed amount of stand-in compute: token ids ->
    hidden states on the first chunk, hidden -> hidden in the middle, hidden -> logits on the last. Each holds
    a parameter, so the zero-bubble schedules' weight-gradient actions have something to compute. `burns`:
    iterations of `burn` in the forward, the input-gradient and the weight-gradient pass (a full backward
    runs both); zero: almost no compute."""

    def __init__(self, first: bool, last: bool, hidden: int, vocab: int, burns: tuple[int, int, int] = (0, 0, 0)):
        super().__init__()
        self.first, self.last, self.hidden = first, last, hidden
        self.burns = burns
        self.scale = nn.Parameter(torch.ones(hidden))
        self.head = nn.Parameter(torch.ones(vocab)) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = x.unsqueeze(-1).float().expand(*x.shape, self.hidden)
        forward, inputs, weights = self.burns
        scale = _Burn.apply(self.scale, 0, weights) if weights else self.scale
        x = x * scale
        if forward or inputs:
            x = _Burn.apply(x, forward, inputs)
        if self.last:
            x = x[..., :1] * self.head
        return x


def gaps(records_by_rank: list, stages: int, released: dict | None = None) -> dict:
    """Split one run's non-compute time by cause. `records_by_rank`: per rank (pipeline rank,
    [(step seconds, intervals, step start), ...]). The loss interval is merged into its forward.
    local: gaps before an action with no input from another rank (the runtime's own work); remote: a
    remote input's send -> the action's start, when the rank was waiting for it. The send is posted at the end
    of the input's action, or of the action `released[(kind, stage, micro-batch)]` names (the action of the
    same rank after which the engine posts it: `schedules.send_posts`)."""
    released = released or {}
    local, remote, heads, tails = [], [], [], []
    ends, owner = {}, {}
    for rank, records in records_by_rank:
        for step, (_, intervals, _) in enumerate(records):
            for i in intervals:
                if i.kind != "L":
                    ends[(step, i.kind, i.stage, i.microbatch)] = i.end
                    owner[i.stage] = rank
    for rank, records in records_by_rank:
        for step, (seconds, intervals, started) in enumerate(records):
            actions = _merge_losses(sorted(intervals, key=lambda i: i.start))
            if not actions:
                continue
            if rank == 0:
                heads.append(actions[0][3] - started)
            tails.append(started + seconds - actions[-1][4])
            previous = None
            for kind, stage, mb, start, end in actions:
                incoming = [
                    ends.get((step,) + released.get(dep, dep))
                    for dep in _dependencies(kind, stage, mb, stages, ends, step)
                    if owner.get(dep[1]) != rank
                ]
                incoming = [t for t in incoming if t is not None]
                if previous is not None and not incoming:
                    local.append(start - previous)
                elif incoming and (previous is None or max(incoming) > previous):
                    remote.append(start - max(incoming))
                previous = end
    return {"local": local, "remote": remote, "head": heads, "tail": tails}


def _merge_losses(intervals: list) -> list[tuple[str, int, int, float, float]]:
    out: list[list] = []
    for i in intervals:
        if i.kind == "L" and out and out[-1][0] == "F":
            out[-1][4] = i.end
        elif i.kind != "L":
            out.append([i.kind, i.stage, i.microbatch, i.start, i.end])
    return [tuple(a) for a in out]


def _dependencies(kind: str, stage: int, mb: int, stages: int, ends: dict, step: int) -> list[tuple]:
    if kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    if kind in ("B", "I"):
        deps = [("F", stage, mb)]
        if stage < stages - 1:
            deps.append(("B", stage + 1, mb) if (step, "B", stage + 1, mb) in ends else ("I", stage + 1, mb))
        return deps
    return [("I", stage, mb)]


def measure_overheads(
    schedule: str,
    split,
    microbatches: int,
    activation: tuple[int, int, int],
    vocab: int,
    group,
    device: torch.device,
    steps: int = 12,
    task_times: dict[str, list[float]] | None = None,
) -> PipelineOverheads:
    """Run `schedule` over null chunks on this rank's pipeline group (every rank of the group calls it) and
    measure the per-action overhead, the step's head and tail, and the link (see the module docstring).
    `activation`: (micro-batch rows, sequence, hidden) of the activation a chunk sends; `task_times`: the
    cost model's seconds per task kind ("F", "I", "W") and chunk, which the null chunks burn (None: no
    compute, no slowdowns measured)."""
    from trex.cost_model.collectives import send_recv
    from trex.runtime.pipeline.schedules import build_schedule, compute_actions, send_posts
    from trex.runtime.pipeline.timing import StageClock, collector_paused, comm_split, p2p_timed, timed_stage

    rows, seq, hidden = activation
    nbytes = rows * seq * hidden * 4
    tier = link_tier(group, nbytes)
    late_recv = measure_late_recv(group, nbytes)
    late_recv_idle = measure_late_recv(group, nbytes, sender_waits=True)
    ready_send = measure_ready_send(group, nbytes)
    ready_send_waited = measure_ready_send(group, nbytes, sender_waits=True)
    slice_s = measure_time_slice(group)
    me = dist.get_rank(group)
    clock = StageClock()
    mine = split.chunks_of(me)
    per_iteration = burn_seconds_per_iteration()
    burns = {
        c.index: tuple(round(task_times[k][c.index] / per_iteration) if task_times else 0 for k in ("F", "I", "W"))
        for c in mine
    }
    stages = [
        timed_stage(
            clock,
            NullChunk(c.first, c.last, hidden, vocab, burns[c.index]),
            c.index,
            len(split.chunks),
            device,
            group=group,
        )
        for c in mine
    ]

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with clock.busy("L", split.chunks[-1].index, -1):
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")

    pipe = build_schedule(schedule, stages, microbatches, loss_fn)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows * microbatches, seq), generator=generator)
    holds_first = any(c.first for c in mine)
    records, comms = [], []
    for step in range(steps + 1):
        dist.barrier(group=group)
        clock.take()
        started = time.perf_counter()
        log: list = []
        with collector_paused(), p2p_timed(log):  # as the training step runs
            pipe.step(*((ids,) if holds_first else ()), target=ids, losses=[])
        seconds = time.perf_counter() - started
        intervals = clock.take()
        if step:  # the first step infers shapes
            records.append((seconds, intervals, started))
            comms.append((seconds, intervals, log))
    slowed = [task_slowdowns(intervals, burns, per_iteration) for _, intervals, _ in records] if task_times else []
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (me, records, slowed), group=group)
    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, (me, comm_split(comms)), group=group)
    orders = compute_actions(pipe)
    released = {
        key: orders[rank][at] for rank, posted in send_posts(pipe, orders).items() for key, at in posted.items()
    }
    found = gaps([(rank, recs) for rank, recs, _ in everyone], len(split.chunks), released)
    slowdowns = around_typical(
        [{k: v for _, _, steps_ in everyone for k, v in steps_[i].items()} for i in range(len(slowed))]
    )
    median = statistics.median
    return PipelineOverheads(
        action_s=statistics.fmean(found["local"]) if found["local"] else 0.0,
        head_s=median(found["head"]) if found["head"] else 0.0,
        tail_s=median(found["tail"]) if found["tail"] else 0.0,
        p2p_s=send_recv(nbytes, tier),
        late_recv_s=late_recv,
        remote_delay_s=statistics.fmean(found["remote"]) if found["remote"] else 0.0,
        link_latency_us=tier.latency_us,
        link_bandwidth_gbs=tier.bandwidth_gbs,
        link_source=tier.source,
        activation_bytes=nbytes,
        samples=len(found["local"]),
        slowdowns=slowdowns,
        late_recv_idle_s=late_recv_idle,
        step_split=tuple(part for _, part in sorted(dict(parts).items())),
        slice_s=slice_s,
        ready_send_s=ready_send,
        ready_send_waited_s=ready_send_waited,
    )


def around_typical(steps: list[dict]) -> tuple[dict, ...]:
    """Each action's slowdown over the typical one of its task (kind, stage: the median over the calibration's
    steps and micro-batches): the host's *variation*. Its typical level (the machine's load, ranks sharing
    cores) is the task times' and the simulation's processor sharing's business, not the replay's."""
    by_task: dict[tuple[str, int], list[float]] = {}
    for step in steps:
        for (kind, stage, _), ratio in step.items():
            by_task.setdefault((kind, stage), []).append(ratio)
    typical = {task: statistics.median(values) for task, values in by_task.items()}
    return tuple({k: round(v / typical[k[:2]], 4) for k, v in step.items()} for step in steps)


def task_slowdowns(intervals: list, burns: dict, per_iteration: float, shortest: float = 2e-4) -> dict:
    """{(kind, stage, micro-batch): measured time / nominal time} of one calibration step's compute actions on
    this rank; nominal = the burned iterations x `per_iteration` (a full backward burns the input- and the
    weight-gradient pass). Actions with a nominal time under `shortest` are left out (nothing to slow)."""
    out = {}
    for i in intervals:
        if i.kind not in ("F", "B", "I", "W") or i.stage not in burns:
            continue
        forward, inputs, weights = burns[i.stage]
        iterations = {"F": forward, "I": inputs, "W": weights, "B": inputs + weights}[i.kind]
        if i.stage == 0 and i.kind == "W":
            iterations = inputs + weights  # the first chunk's weight pass runs its whole backward (no input grad)
        nominal = iterations * per_iteration
        if nominal >= shortest:
            out[(i.kind, i.stage, i.microbatch)] = round((i.end - i.start) / nominal, 4)
    return out
