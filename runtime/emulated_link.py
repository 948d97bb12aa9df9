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

Waiting uses no CPU: completion is a `torch.futures.Future` set by one timer thread that sleeps on a
condition variable until the earliest deadline; the rank's `wait()` blocks inside c10d with the GIL
released. The group is a Python `dist.ProcessGroup` registered with `dist.Backend.register_backend`;
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
    seconds at issue, when gloo finished, when the link began it, its deadline, when it completed). The traffic
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
        self.events.append([time.perf_counter(), math.nan, math.nan, math.nan, math.nan])
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
        """A Work that completes `seconds` of link time after the gloo works did; `then` (unpacking a packed
        bucket into its members' outputs) runs when they did, before the Work completes. `received`: the bytes
        this rank receives, when they differ from `nbytes` (an uneven all-to-all), for the trace."""
        from torch._C._distributed_c10d import _create_work_from_future

        seconds = self.link.collective_seconds(kind, nbytes, self.size())
        event = STATS.add(kind, seconds, nbytes, nbytes if received is None else received)
        future = torch.futures.Future()
        pending = [len(works)]
        values: list[Any] = [None]

        def finished(done: torch.futures.Future) -> None:
            try:
                values[0] = done.value()
            except Exception as error:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(error)
                return
            with self._lock:
                pending[0] -= 1
                if pending[0]:
                    return
            if then is not None:
                try:
                    then()
                except Exception as error:  # noqa: BLE001 - handed to whoever waits
                    future.set_exception(error)
                    return
            with self._lock:
                arrived = time.perf_counter()
                start = max(arrived, self._free_at)
                self._free_at = start + seconds
                deadline = self._free_at
            if event is not None:
                event[1:4] = arrived, start, deadline
            if seconds <= 0:
                complete()
            else:
                _clock().at(deadline, complete)

        def complete() -> None:
            if event is not None:
                event[4] = time.perf_counter()
            future.set_result(values[0])

        for work in works:
            try:
                work.get_future().then(finished)
            except RuntimeError:  # gloo's reduce-scatter Work has no future: a waiter thread (blocked, no CPU)
                _waiters().submit(_wait_then, work, finished)
        return _create_work_from_future(future)

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

    def all_gather_out(input, group_size, group_name, *, out):
        group = _resolve_process_group(group_name)
        _register_work(out, group._allgather_base(out, input.contiguous()))
        return out

    def reduce_scatter_out(input, reduce_op, group_size, group_name, *, out):
        group = _resolve_process_group(group_name)
        options = ReduceScatterOptions()
        options.reduceOp = getattr(ReduceOp, reduce_op.upper())
        _register_work(out, group._reduce_scatter_base(out, input.contiguous(), options))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        library.impl("all_gather_into_tensor_out", all_gather_out, "CPU")
        library.impl("reduce_scatter_tensor_out", reduce_scatter_out, "CPU")
    _OUT_VARIANTS.append(library)
