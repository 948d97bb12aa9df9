"""How late the emulated link hands a collective back to the rank that waits for it, compared to its link model.

    python bench/comm_overlap/link_lateness.py --link "alpha_us=2000,gbps=0.05" --iterations 200

2 gloo ranks over `trex_link`, one compute thread each (both cores busy, as in `overlap.py`). Each iteration issues
a functional all-to-all (`--kib` per rank), computes (small matmuls, the GIL taken and dropped as an eager program
does) for a share of the collective's model time (0.5x, 0.9x, 1.1x or 1.5x in turn: the wait comes before or after
the deadline), then waits for it. Lateness = when wait returned - max(the link's deadline, when wait was called):
what the emulation adds to a step beyond the link model (0 is exact; the deadline is the collective's, from the
link's event record). Also printed: completed - deadline (whoever completed it: before the waiter's own completion
path, a clock thread that had to be given a core and the GIL). Seconds, min / median / max and the sum, per rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHARES = (0.5, 0.9, 1.1, 1.5)  # compute between issue and wait, as a share of the collective's model time


def rank_main(config: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    from trex.runtime import emulated_link

    torch.set_num_threads(1)
    dist.init_process_group(emulated_link.install(config["link"]))
    rank, group = dist.get_rank(), dist.group.WORLD
    x = torch.randn(config["kib"] * 256)
    a = torch.randn(64, 64)
    emulated_link.STATS.recording = True
    late: dict[float, list[float]] = {share: [] for share in SHARES}
    completed_late: list[float] = []
    for i in range(config["iterations"] + 4):
        share = SHARES[i % len(SHARES)]
        dist.barrier()
        emulated_link.STATS.reset()
        started = fc.all_to_all_single(x, None, None, group)
        model = emulated_link.STATS.seconds.get("all_to_all", 0.0)
        until = time.perf_counter() + share * model
        while time.perf_counter() < until:
            a = torch.tanh(a @ a)
        called = time.perf_counter()
        fc.wait_tensor(started)
        returned = time.perf_counter()
        event = emulated_link.STATS.events[-1]
        if i < 4:
            continue  # warm-up
        late[share].append(returned - max(event[3], called))
        if event[4] == event[4]:  # not NaN
            completed_late.append(event[4] - event[3])
    dist.destroy_process_group()
    return {"rank": rank, "late": late, "completed_late": completed_late, "model_s": model}


def spread(values: list[float]) -> str:
    return (
        f"{min(values) * 1e3:.3f} / {statistics.median(values) * 1e3:.3f} / {max(values) * 1e3:.3f} ms, "
        f"sum {sum(values) * 1e3:.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--link", default="alpha_us=2000,gbps=0.05")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--kib", type=int, default=64, help="KiB each rank sends per all-to-all")
    args = parser.parse_args()
    from trex.runtime.launcher import launch_function

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = {"link": args.link, "iterations": args.iterations, "kib": args.kib}
    results = launch_function(rank_main, (config,), 2)
    print(f"link {args.link}; all-to-all of {args.kib} KiB per rank, model {results[0]['model_s'] * 1e3:.3f} ms")
    for rank, result in sorted(results.items()):
        for share, values in result["late"].items():
            print(f"rank {rank}: compute {share:.1f}x model, wait returned after the deadline: {spread(values)}")
        everything = [v for values in result["late"].values() for v in values]
        print(f"rank {rank}: all waits ({len(everything)}): {spread(everything)}")
        if result["completed_late"]:
            print(f"rank {rank}: completed after the deadline (any thread): {spread(result['completed_late'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
