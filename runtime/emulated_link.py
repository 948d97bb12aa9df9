"""Emulated links: gloo collectives that take the wall-clock time a modelled slow link would.

On this machine every rank talks over loopback, so communication is nearly free and no schedule can
show that it hides communication under compute. `--emulate-link "alpha_us=20,gbps=5"` (or a tier name
of the hardware catalog, e.g. `infiniband-ndr`) makes the process groups of `trex train` instances of
`EmulatedLinkGroup`: each collective runs the real gloo collective (so the numbers are exact), and its
`Work` completes only once the link model's time has passed after gloo finished:

    done = max(gloo finished, the link's previous transfer done) + collective_time(kind, bytes, link)

`collective_time` is the cost model's own alpha-beta formula (`trex.cost_model.collectives`) on a
one-tier placement of the group, so the cost model predicts exactly what the emulation charges. The
link is serial (a transfer waits for the one before it on the same group), as one NIC is.

Waiting uses no CPU: a collective's Work (`LinkWork`, a Python subclass of c10d's Work) waits for the gloo
works inside c10d and then sleeps until the link's deadline (`time.sleep`, GIL released) in the rank's own
`wait()`, which completes it on waking: the thread that needs the result is the one woken at the deadline, so no
other thread has to be given a core then. One clock thread (sleeping on a condition variable until the earliest
deadline) completes the futures of collectives nobody waits on. The group is a Python `dist.ProcessGroup`
registered with `dist.Backend.register_backend`;
functional collectives (the `_c10d_functional` nodes of captured graphs) reach it through its
overridable methods (`allreduce`, `allgather_into_tensor_coalesced`, `reduce_scatter_tensor_coalesced`,
`alltoall_base`, ...). The gloo backend stays registered underneath for what c10d calls directly.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trex.errors import TrexError

BACKEND_NAME = "trex_link"
ENV_VAR = "TREX_EMULATE_LINK"  # how the launcher's ranks learn the link (set by `trex train --emulate-link`)


@dataclass(frozen=True)
class LinkModel:
    """One link: per-message latency and bandwidth (bytes/s per rank per direction)."""

    name: str
    alpha_s: float
    bandwidth_bps: float  # bytes per second; math.inf for a zero-cost link

    @property
    def spec(self) -> str:
        """The text `parse_link` reads back into this link (what the ranks receive in the environment)."""
        gbps = "inf" if math.isinf(self.bandwidth_bps) else repr(self.bandwidth_bps / 1e9)
        return f"alpha_us={self.alpha_s * 1e6!r},gbps={gbps}"

    def tier(self):
        from trex.cost_model.cluster import Tier

        gbs = 1e12 if math.isinf(self.bandwidth_bps) else self.bandwidth_bps / 1e9
        return Tier(f"emulated:{self.name}", None, gbs, self.alpha_s * 1e6, 1.0, "switch", "trex --emulate-link")

    def placement(self, group_size: int):
        from trex.cost_model.cluster import Level, Placement

        return Placement(group_size, (Level(self.tier(), group_size),) if group_size > 1 else ())

    def collective_seconds(self, kind: str, nbytes: float, group_size: int) -> float:
        """The cost model's time for one collective of `kind` moving `nbytes` over this link."""
        from trex.cost_model.collectives import collective_time

        if group_size <= 1 or (self.alpha_s == 0 and math.isinf(self.bandwidth_bps)):
            return 0.0
        return collective_time(kind, nbytes, self.placement(group_size))

    def cluster(self, base: str = "cpu"):
        """The cluster `base` (its device profile) with this link as its only tier: what the cost model prices
        collectives on when this link is emulated."""
        from dataclasses import replace

        from trex.cost_model.catalog import get_cluster

        return replace(get_cluster(base), tiers=(self.tier(),))


ZERO_LINK = LinkModel("zero", 0.0, math.inf)


def parse_link(text: str) -> LinkModel:
    """`alpha_us=20,gbps=5` (latency in microseconds, bandwidth in GB/s per rank, as the hardware catalog's
    `bandwidth_gbs`), `zero` (a free link: plain gloo timing through the same machinery), or a tier name of
    the catalog (`infiniband-ndr`, `nvlink4`, ...: its latency and efficiency-scaled bandwidth)."""
    text = (text or "").strip()
    if not text:
        raise TrexError("--emulate-link is empty; give 'alpha_us=20,gbps=5', 'zero' or a tier name")
    if text == "zero":
        return ZERO_LINK
    if "=" not in text:
        tiers = _catalog_tiers()
        if text not in tiers:
            raise TrexError(
                f"--emulate-link {text!r}: not a tier of the hardware catalog (known: {', '.join(sorted(tiers))}); "
                "or give 'alpha_us=20,gbps=5'"
            )
        tier = tiers[text]
        return LinkModel(text, tier.latency_s, tier.bandwidth(1))
    fields: dict[str, float] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in ("alpha_us", "gbps"):
            raise TrexError(f"--emulate-link {text!r}: unknown key {key!r}; use alpha_us=<microseconds>,gbps=<GB/s>")
        try:
            fields[key] = float(value)
        except ValueError:
            raise TrexError(f"--emulate-link {text!r}: {key}={value!r} is not a number") from None
    alpha_us, gbps = fields.get("alpha_us", 0.0), fields.get("gbps", math.inf)
    if alpha_us < 0 or not gbps > 0:
        raise TrexError(f"--emulate-link {text!r}: needs alpha_us >= 0 and gbps > 0")
    return LinkModel(text, alpha_us * 1e-6, gbps * 1e9)


def _catalog_tiers() -> dict[str, Any]:
    from trex.cost_model.catalog import BUILTIN_CLUSTERS

    return {tier.name: tier for cluster in BUILTIN_CLUSTERS.values() for tier in cluster.tiers}


class LinkClock:
    """One thread that completes futures at their deadlines; sleeps on a condition variable in between."""

    def __init__(self):
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="trex-link-clock", daemon=True)
        self._thread.start()

    def at(self, deadline: float, action) -> None:
        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._order), action))
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.perf_counter():
                    self._cv.wait(None if not self._heap else self._heap[0][0] - time.perf_counter())
                _, _, action = heapq.heappop(self._heap)
            action()


def _wait_then(work, finished) -> None:
    done = torch.futures.Future()
    try:
        work.wait()
        done.set_result(None)
    except Exception as error:  # noqa: BLE001 - handed to whoever waits
        done.set_exception(error)
    finished(done)


_WAITERS = None


def _waiters():
    global _WAITERS
    with _CLOCK_LOCK:
        if _WAITERS is None:
            from concurrent.futures import ThreadPoolExecutor

            _WAITERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="trex-link-wait")
        return _WAITERS


_CLOCK: LinkClock | None = None
_CLOCK_LOCK = threading.Lock()


def _clock() -> LinkClock:
    global _CLOCK
    with _CLOCK_LOCK:
        if _CLOCK is None:
            _CLOCK = LinkClock()
        return _CLOCK


@dataclass
class LinkStats:
    """What one process's emulated groups charged: collectives and modelled seconds, by kind; with `recording` on
    (a benchmark's timed step; off by default, a long run would grow the lists), the traffic of every collective
    in issue order (`trace`: kind, bytes sent, bytes received) and when it happened (`events`: perf_counter
    seconds, one column per `EVENT_FIELDS`; a collective nobody waited on keeps NaN in the last two). The traffic
    is what a data-dependent exchange really moved (an expert-parallel all-to-all's rows depend on the routing),
    which a prediction made before the step can only assume (`passes.reorder_comm.traffic_seconds` prices it)."""

    collectives: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    recording: bool = False
    trace: list[tuple[str, int, int]] = field(default_factory=list)
    events: list[list[float]] = field(default_factory=list)

    def add(self, kind: str, seconds: float, sent: int = 0, received: int = 0) -> list[float] | None:
        """Count one collective; when recording, also its traffic, and return its event row (filled in later)."""
        self.collectives[kind] = self.collectives.get(kind, 0) + 1
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        if not self.recording:
            return None
        self.trace.append((kind, int(sent), int(received)))
        self.events.append([time.perf_counter()] + [math.nan] * (len(EVENT_FIELDS) - 1))
        return self.events[-1]

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> None:
        self.collectives.clear()
        self.seconds.clear()
        self.trace.clear()
        self.events.clear()


STATS = LinkStats()

# the columns of `LinkStats.events`: issued, gloo done (the transfer arrived at the link), the link began it, its
# deadline (began + the model's time), completed, the rank's first wait() began, that wait() returned
EVENT_FIELDS = ("issued", "arrived", "began", "deadline", "completed", "wait_called", "wait_returned")


def waiter_lateness(event: list[float]) -> float:
    """How much later than the link model a rank's wait() returned: wait returned - max(deadline, wait called);
    0 for a collective nobody waited on. The part of the emulation's own overhead a step can pay."""
    deadline, called, returned = event[3], event[5], event[6]
    if math.isnan(returned):
        return 0.0
    return max(0.0, returned - max(deadline, called))


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class EmulatedLinkGroup(dist.ProcessGroup):
    """A process group whose collectives run on gloo and complete after the link model's time."""

    def __init__(self, inner: dist.ProcessGroup, rank: int, size: int, link: LinkModel):
        super().__init__(rank, size)
        self.inner, self.link = inner, link
        self._free_at = 0.0  # when the link finishes its last transfer
        self._lock = threading.Lock()

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return BACKEND_NAME

    # -- completion -------------------------------------------------------------------------------
    def _delayed(self, works: list, kind: str, nbytes: int, then=None, received: int | None = None):
        """A Work that completes the link model's time after the gloo works did (`LinkTransfer`); `then`
        (unpacking a packed bucket into its members' outputs) runs when they did, before the Work completes.
        `received`: the bytes this rank receives, when they differ from `nbytes` (an uneven all-to-all), for the
        trace."""
        seconds = self.link.collective_seconds(kind, nbytes, self.size())
        event = STATS.add(kind, seconds, nbytes, nbytes if received is None else received)
        return LinkWork(LinkTransfer(self, works, seconds, then, event))

    # -- the collectives c10d and the functional collectives call -----------------------------------
    def allreduce(self, tensors, opts=None):
        work = self.inner.allreduce(tensors, *(() if opts is None else (opts,)))
        return self._delayed([work], "all_reduce", _nbytes(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        work = self.inner.allreduce_coalesced(tensors, *(() if opts is None else (opts,)))
        return self._delayed([work], "all_reduce", _nbytes(tensors))

    def allgather(self, output_lists, inputs, opts=None):
        work = self.inner.allgather(output_lists, inputs, *(() if opts is None else (opts,)))
        return self._delayed([work], "all_gather", _nbytes(inputs) * self.size())

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """A bucket of all-gathers: its members packed into one flat buffer and gathered by one gloo call (a
        bucket is one message on a real link, and one call here costs the host what one collective does),
        unpacked into the members' outputs when it lands."""
        if len(inputs) < 2 or len({t.dtype for t in inputs}) > 1:
            works = [self.inner._allgather_base(o, i) for o, i in zip(outputs, inputs)]
            return self._delayed(works, "all_gather", _nbytes(outputs))
        world, sizes = self.size(), [t.numel() for t in inputs]
        packed = torch.cat([t.reshape(-1) for t in inputs])
        gathered = packed.new_empty(world * packed.numel())

        def unpack():  # rank r's block of `gathered` is its members back to back; a member's output is [world, n]
            for out, part in zip(outputs, gathered.view(world, -1).split(sizes, dim=1)):
                out.view(world, -1).copy_(part)

        work = self.inner._allgather_base(gathered, packed)
        return self._delayed([work], "all_gather", _nbytes(outputs), then=unpack)

    def _allgather_base(self, output, input, opts=None):
        return self._delayed([self.inner._allgather_base(output, input)], "all_gather", _nbytes([output]))

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        work = self.inner.reduce_scatter(outputs, input_lists, *(() if opts is None else (opts,)))
        return self._delayed([work], "reduce_scatter", _nbytes(outputs) * self.size())

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """A bucket of reduce-scatters as one gloo call on a packed buffer (see allgather_into_tensor_coalesced):
        rank r's block of the packed input is every member's r-th block, back to back."""
        extra = () if opts is None else (opts,)
        if len(inputs) < 2 or len({t.dtype for t in inputs}) > 1:
            works = [self.inner._reduce_scatter_base(o, i, *extra) for o, i in zip(outputs, inputs)]
            return self._delayed(works, "reduce_scatter", _nbytes(inputs))
        world, sizes = self.size(), [t.numel() for t in outputs]
        packed = torch.cat([t.reshape(world, -1) for t in inputs], dim=1).reshape(-1)
        reduced = packed.new_empty(packed.numel() // world)

        def unpack():
            for out, part in zip(outputs, reduced.split(sizes)):
                out.view(-1).copy_(part)

        work = self.inner._reduce_scatter_base(reduced, packed, *extra)
        return self._delayed([work], "reduce_scatter", _nbytes(inputs), then=unpack)

    def _reduce_scatter_base(self, output, input, opts=None):
        work = self.inner._reduce_scatter_base(output, input, *(() if opts is None else (opts,)))
        return self._delayed([work], "reduce_scatter", _nbytes([input]))

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        work = self.inner.alltoall_base(output, input, output_splits, input_splits, *(() if opts is None else (opts,)))
        return self._delayed([work], "all_to_all", _nbytes([input]), received=_nbytes([output]))

    def alltoall(self, outputs, inputs, opts=None):
        work = self.inner.alltoall(outputs, inputs, *(() if opts is None else (opts,)))
        return self._delayed([work], "all_to_all", _nbytes(inputs))

    def broadcast(self, tensors, opts=None):
        work = self.inner.broadcast(tensors, *(() if opts is None else (opts,)))
        return self._delayed([work], "send_recv", _nbytes(tensors))

    def barrier(self, opts=None):
        return self.inner.barrier(*(() if opts is None else (opts,)))

    def send(self, tensors, dst, tag=0):
        return self._delayed([self.inner.send(tensors, dst, tag)], "send_recv", _nbytes(tensors))

    def recv(self, tensors, src, tag=0):
        return self._delayed([self.inner.recv(tensors, src, tag)], "send_recv", _nbytes(tensors))

    def gather(self, outputs, inputs, opts=None):
        return self.inner.gather(outputs, inputs, *(() if opts is None else (opts,)))

    def scatter(self, outputs, inputs, opts=None):
        return self.inner.scatter(outputs, inputs, *(() if opts is None else (opts,)))


class LinkTransfer:
    """One collective on an emulated link: the gloo works that move the data, then the link's time.

    It *arrives* when the gloo works are done (their future callback, or the rank's `wait()` if that comes
    first): the link starts it when it is free (a serial link) and sets its deadline, `seconds` later. It
    *completes* at the deadline, by whichever comes first: the rank's `wait()`, which sleeps until the deadline
    itself (`time.sleep`: no CPU, the GIL released) and completes it on waking, or the clock thread (for anyone
    who holds only the future). Before, only the clock thread completed it: a waiting rank then woke after the
    clock thread had been given a core and the GIL at the deadline, which on 2 busy cores came 1-2 ms late per
    collective (RESULTS 15.9); now the thread that needs the result is the one that wakes."""

    def __init__(self, group: EmulatedLinkGroup, works: list, seconds: float, then, event: list[float] | None):
        self.group, self.seconds, self.event = group, seconds, event
        self.future = torch.futures.Future()
        self.deadline: float | None = None
        self._works, self._then = list(works), then
        self._pending = len(works)
        self._value: Any = None
        self._lock = threading.Lock()
        self._done = False
        for work in works:
            try:
                work.get_future().then(self._finished)
            except RuntimeError:  # gloo's reduce-scatter Work has no future: a waiter thread (blocked, no CPU)
                _waiters().submit(_wait_then, work, self._finished)

    def _finished(self, done: torch.futures.Future) -> None:
        try:
            value = done.value()
        except Exception as error:  # noqa: BLE001 - handed to whoever waits
            self._fail(error)
            return
        with self._lock:
            self._value = value
            self._pending -= 1
            if self._pending:
                return
        self._arrive()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.future.set_exception(error)

    def _arrive(self) -> float | None:
        """Start the link's part once (the gloo works are done); returns the deadline (None if it failed)."""
        with self._lock:
            if self.deadline is not None or self._done:
                return self.deadline
            if self._then is not None:
                try:
                    self._then()
                except Exception as error:  # noqa: BLE001 - handed to whoever waits
                    self._done = True
                    self.future.set_exception(error)
                    return None
            self._works, self._then = [], None  # the gloo works and packed buffers are no longer needed
            with self.group._lock:
                arrived = time.perf_counter()
                start = max(arrived, self.group._free_at)
                self.group._free_at = start + self.seconds
                self.deadline = self.group._free_at
            if self.event is not None:
                self.event[1:4] = arrived, start, self.deadline
        if self.seconds <= 0:
            self._complete()
        else:
            _clock().at(self.deadline, self._complete)
        return self.deadline

    def _complete(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            if self.event is not None:
                self.event[4] = time.perf_counter()
        self.future.set_result(self._value)

    def wait(self) -> None:
        """Block until the collective completed, using no CPU: wait for the gloo works (blocking in c10d), then
        sleep until the link's deadline and complete it here."""
        called = time.perf_counter()
        works = self._works
        if self.deadline is None and not self._done:
            for work in works:
                work.wait()  # blocks in c10d with the GIL released; raises gloo's error
            if self._arrive() is None:
                self.future.wait()  # raises the stored error
        while self.deadline is not None and not self._done:
            remaining = self.deadline - time.perf_counter()
            if remaining <= 0:
                self._complete()
                break
            time.sleep(remaining)
        self.future.wait()  # done by now (or by the clock a moment ago); raises a stored error
        if self.event is not None and math.isnan(self.event[5]):
            self.event[5:7] = called, time.perf_counter()


_ALIVE: set = set()  # works handed to C++ without a holder (`_register_work`), kept until they were waited on


class LinkWork(dist.Work):
    """The Work of a `LinkTransfer`: `wait()` is the transfer's (the rank sleeps until the link's deadline),
    `get_future()` its future. A Python subclass of c10d's Work (its trampoline calls these)."""

    def __init__(self, transfer: LinkTransfer):
        super().__init__()
        self.transfer = transfer
        self._kept = False

    def keep_until_waited(self) -> None:
        """Keep this Python object alive until `wait()` returned: c10d's registry (`_register_work`) holds the C++
        Work only, and without its Python object c10d's Work.wait would wait for a completion that never comes."""
        self._kept = True
        _ALIVE.add(self)

    def wait(self, timeout=None) -> bool:
        self.transfer.wait()
        if self._kept:
            self._kept = False
            _ALIVE.discard(self)
        return True

    def get_future(self) -> torch.futures.Future:
        return self.transfer.future


def _create_group(store, rank: int, size: int, timeout) -> EmulatedLinkGroup:
    link = current_link()
    if link is None:
        raise TrexError(f"the {BACKEND_NAME!r} backend needs a link: set {ENV_VAR} (trex train --emulate-link)")
    inner = dist.ProcessGroupGloo(store, rank, size, timeout)
    group = EmulatedLinkGroup(inner, rank, size, link)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, inner)
    GROUPS.append(group)
    return group


GROUPS: list[EmulatedLinkGroup] = []  # this process's emulated groups


def set_link(link: LinkModel | str) -> None:
    """Switch every emulated group of this process to `link` (a benchmark compares links on one compiled
    program: the step with a slow link minus the same step with `zero` is the exposed communication)."""
    link = parse_link(link) if isinstance(link, str) else link
    for group in GROUPS:
        group.link = link


def current_link() -> LinkModel | None:
    """The link this process emulates (from `TREX_EMULATE_LINK`), or None."""
    text = os.environ.get(ENV_VAR, "").strip()
    return parse_link(text) if text else None


def install(link: LinkModel | str | None = None) -> str:
    """Make the `trex_link` backend available (and, given `link`, the link it emulates); returns the backend name
    to pass to `init_process_group`."""
    if link is not None:
        link = parse_link(link) if isinstance(link, str) else link
        os.environ[ENV_VAR] = link.spec
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create_group, devices=["cpu"])
    _route_out_variants()
    return BACKEND_NAME


_OUT_VARIANTS: list = []  # the torch.library registration below, once per process


def _route_out_variants() -> None:
    """Make the `_out` functional collectives reach the group's Python methods, so the link charges them.

    `_c10d_functional.all_gather_into_tensor_out` / `reduce_scatter_tensor_out` (what Inductor's bucketing emits)
    call the C++ `ProcessGroup::all_gather_single` / `reduce_scatter_single`, which a Python ProcessGroup cannot
    override (torch's trampoline has no hook for them): they went to the gloo backend underneath and cost no link
    time. Their CPU kernels are replaced by the same steps in Python (resolve the group, start the collective
    through its `_allgather_base` / `_reduce_scatter_base`, register the Work on `out` for `wait_tensor`); for
    any other group these are the C++ kernels' own calls."""
    if _OUT_VARIANTS:
        return
    from torch._C._distributed_c10d import ReduceOp, ReduceScatterOptions, _register_work
    from torch.distributed.distributed_c10d import _resolve_process_group

    library = torch.library.Library("_c10d_functional", "IMPL")

    def registered(out, work):  # c10d keeps the Work, not its Python object: keep that until it is waited on
        if isinstance(work, LinkWork):
            work.keep_until_waited()
        _register_work(out, work)
        return out

    def all_gather_out(input, group_size, group_name, *, out):
        group = _resolve_process_group(group_name)
        return registered(out, group._allgather_base(out, input.contiguous()))

    def reduce_scatter_out(input, reduce_op, group_size, group_name, *, out):
        group = _resolve_process_group(group_name)
        options = ReduceScatterOptions()
        options.reduceOp = getattr(ReduceOp, reduce_op.upper())
        return registered(out, group._reduce_scatter_base(out, input.contiguous(), options))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        library.impl("all_gather_into_tensor_out", all_gather_out, "CPU")
        library.impl("reduce_scatter_tensor_out", reduce_scatter_out, "CPU")
    _OUT_VARIANTS.append(library)
