"""How much of a CPU core each of several co-located instances gets: the contention the simulator prices.

Local CPU workers (one intra-op thread each) share their host's cores with each other and with
whatever else runs there. A step that needs `t` seconds of CPU takes `t / share(k)` seconds of wall
clock when `k` of the instances are busy, where `share(k)` is the fraction of a core each busy one
gets. On an idle host of `C` cores the scheduler splits the cores evenly: share(k) = min(1, C / k).
On a shared host the other processes take their part too - how much depends on how many of them
run, and on their nice values against the workers' - so the shares are measured, not assumed:
`measure_cpu_shares` starts `k` spinning probe processes (at the caller's nice level, as the workers
run) for k = 1..n and times the CPU each gets per second of wall clock. Measured right before a run,
the table is the physics of that host at that time; a host whose load changes during the run is not
what was measured, and `CpuShares.from_counters` (the workers' own CPU and busy time over the run)
says afterwards what the run actually got.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from trex.workloads.serving.errors import ServingError

# A probe: wait for the common start, spin `seconds` of wall clock, print CPU seconds / wall seconds.
_PROBE = """
import sys, time
start, seconds = float(sys.argv[1]), float(sys.argv[2])
while time.time() < start:
    time.sleep(0.002)
wall0, cpu0 = time.perf_counter(), time.process_time()
x = 0
while time.perf_counter() - wall0 < seconds:
    for _ in range(2000):
        x += 1
print((time.process_time() - cpu0) / (time.perf_counter() - wall0))
"""


@dataclass(frozen=True)
class CpuShares:
    """`shares[k - 1]`: the fraction of a core each of `k` busy instances gets (k = 1..len)."""

    shares: tuple[float, ...]
    source: str = ""

    def __post_init__(self):
        if not self.shares or any(not 0 < s <= 1.0 for s in self.shares):
            raise ServingError(f"CPU shares must be fractions of a core in (0, 1] (got {self.shares})")

    def share(self, busy: int) -> float:
        """Each busy instance's share of a core with `busy` instances busy (past the table: the same CPU
        split further, share(n) * n / busy)."""
        n = len(self.shares)
        if busy <= n:
            return self.shares[max(busy, 1) - 1]
        return self.shares[-1] * n / busy

    def slowdown(self, busy: int) -> float:
        return 1.0 / self.share(busy)

    @staticmethod
    def from_cores(cores: int, instances: int) -> CpuShares:
        """An otherwise idle host of `cores` cores: the busy instances split them evenly, at most one each."""
        if cores < 1 or instances < 1:
            raise ServingError(f"cores and instances must be at least 1 (got {cores}, {instances})")
        return CpuShares(tuple(min(1.0, cores / k) for k in range(1, instances + 1)), f"{cores} idle cores")

    @staticmethod
    def from_counters(cpu_s: list[float], busy_s: list[float]) -> float:
        """The mean share the instances actually got over a run: their step CPU time over step wall time."""
        wall = sum(busy_s)
        if wall <= 0:
            raise ServingError("no busy time to compute a CPU share from")
        return sum(cpu_s) / wall

    def to_dict(self) -> dict:
        return {"shares": list(self.shares), "source": self.source}


def _probe_round(k: int, seconds: float) -> list[float]:
    start = time.time() + 0.5 + 0.25 * k  # room for the k interpreters to start before the common start
    probes = [
        subprocess.Popen([sys.executable, "-c", _PROBE, repr(start), repr(seconds)], stdout=subprocess.PIPE, text=True)
        for _ in range(k)
    ]
    values = []
    for probe in probes:
        out, _ = probe.communicate(timeout=60 + seconds)
        if probe.returncode != 0:
            raise ServingError(f"a CPU-share probe failed (exit {probe.returncode})")
        values.append(json.loads(out))
    return values


def measure_cpu_shares(instances: int, seconds: float = 2.0, rounds: int = 2) -> CpuShares:
    """Spin k probe processes together for k = 1..`instances`, `rounds` times interleaved; each k's share is
    the median over its probes and rounds. Takes about rounds * instances * (seconds + 1) seconds."""
    if instances < 1 or seconds <= 0 or rounds < 1:
        raise ServingError(f"need instances >= 1, seconds > 0, rounds >= 1 (got {instances}, {seconds}, {rounds})")
    measured: dict[int, list[float]] = {k: [] for k in range(1, instances + 1)}
    for _ in range(rounds):
        for k in measured:
            measured[k].extend(_probe_round(k, seconds))
    shares = tuple(min(1.0, max(statistics.median(values), 1e-3)) for values in measured.values())
    return CpuShares(shares, f"measured: {instances} probe sets x {rounds} rounds of {seconds:g} s")
