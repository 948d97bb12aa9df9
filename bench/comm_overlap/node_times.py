"""Where the EP program's compute time goes, per op, measured against what `node.meta["cost"]` prices.

    python bench/comm_overlap/node_times.py --scaled-v3 512 --layers 3 --seq 128 --steps 3 --profile DIR

The reorder pass predicts exposed communication from its timeline over the priced nodes; when the nodes' prices
add up to less than the step takes, the timeline has less compute to hide the link under than the rank really
has. This script runs the EP program of `overlap.py` (2 gloo ranks, the pass's program, the zero-cost link),
each rank running a copy of the partitioned graphs whose ops are timed one by one (`Clocked`). Per op, on rank
0: the graph nodes calling it (forward + backward), the priced time per step (the sum of their
`node.meta["cost"]`), the op's CPU and wall time per step in the step (this thread's CPU time: a rank
descheduled on the shared machine or asleep in a collective's wait is not charged, so it reads the same loaded
or idle, up to what other processes do to the caches), and, from one more step in which every call is run
again at once, in-step / hot (how much of the gap is operands out of the cache rather than the model's rates).
Then the step's own CPU time against the ops' sum (what the graphs' Python and autograd add between the ops),
and the reorder timeline's exposed communication on `--link` with the priced node costs and with every compute
node set to what its op measured: a diagnosis of what pricing the compute right would do to the prediction
(it reads this run's times; it is not a prediction and nothing is fitted from it).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

from trex.cost_model.op_formulas import op_name

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class OpClock:
    """Per op the graphs call: calls, wall seconds and this thread's CPU seconds (an op's inner ops count as its
    time). CPU time does not advance while the rank is descheduled (the machine is shared) or sleeps in a
    collective's wait, so it is the op's own work. Filled while `on`, by the clocked copies of the graphs."""

    def __init__(self) -> None:
        self.on = False
        self.replay = False  # also time each call again at once, its operands hot in the cache (`hot`)
        self.hot: Counter = Counter()
        self.in_step: Counter = Counter()  # the same calls' CPU time in the step, for `hot`
        self.calls: Counter = Counter()
        self.wall: Counter = Counter()
        self.cpu: Counter = Counter()
        self.faults: Counter = Counter()  # minor page faults: first touches of memory the allocator got fresh


CLOCK = OpClock()
_TALKS = ("c10d", "ep_exchange", "ep_counts", "wait_tensor")


class Clocked:
    """A graph node's op, timed into CLOCK when it is on."""

    def __init__(self, op) -> None:
        self.op, self.name = op, op_name(op)
        self.__name__ = self.name.replace(".", "_")
        # run again only what has no effect beyond its result: no collective, nothing mutated
        self.replayable = not (op._schema.is_mutable or any(word in self.name for word in _TALKS))

    def __call__(self, *args, **kwargs):
        if not CLOCK.on:
            return self.op(*args, **kwargs)
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        cpu, wall = time.thread_time(), time.perf_counter()
        out = self.op(*args, **kwargs)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if not CLOCK.replay:
            CLOCK.faults[self.name] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
            CLOCK.wall[self.name] += wall
            CLOCK.cpu[self.name] += cpu
            CLOCK.calls[self.name] += 1
        elif self.replayable:
            best = math.inf
            for _ in range(3):
                again = time.thread_time()
                self.op(*args, **kwargs)
                best = min(best, time.thread_time() - again)
            CLOCK.in_step[self.name] += cpu
            CLOCK.hot[self.name] += best
        return out


def clock_graphs() -> None:
    """Make this process's trex compiles run a copy of each partitioned forward / backward graph whose ops are
    `Clocked` (the graphs kept on `compiled.trex.graphs`, which the cost model prices, stay as they are)."""
    from trex.driver import TrexCompiler
    from trex.graph_copy import copy_graph_module

    original = TrexCompiler._lower

    def lower(self, graph, which, gm):
        if which not in ("forward", "backward"):
            return original(self, graph, which, gm)
        clocked = copy_graph_module(gm)
        for node in clocked.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                node.target = Clocked(node.target)
        clocked.recompile()
        return original(self, graph, which, clocked)

    TrexCompiler._lower = lower


def priced_by_op(compiled, link: str) -> tuple[Counter, Counter, Counter]:
    """Per op name, over the partitioned forward and backward graphs as they run: priced seconds (the node costs
    the reorder timeline uses), nodes, and nodes whose cost is unpriced."""
    from trex.cost_model.annotate import annotate
    from trex.cost_model.op_formulas import op_name
    from trex.runtime.emulated_link import parse_link

    seconds: Counter = Counter()
    nodes: Counter = Counter()
    unpriced: Counter = Counter()
    for graph in compiled.trex.graphs:
        for module in (graph.forward, graph.backward):
            if module is None:
                continue
            annotate(module, parse_link(link).cluster())
            for node in module.graph.nodes:
                cost = node.meta.get("cost")
                if node.op != "call_function" or cost is None:
                    continue
                name = op_name(node.target)
                nodes[name] += 1
                if cost.priced:
                    seconds[name] += 0.0 if cost.kind == "collective" else cost.time_s
                else:
                    unpriced[name] += 1
    return seconds, nodes, unpriced


def timeline_as_measured(compiled, link: str, cpu: dict, calls: dict, priced: dict) -> dict[str, float]:
    """The reorder timeline's exposed communication and compute on `link` for the graphs as they run: priced by
    the cost model, and with every compute node's time set to what its op measured in the step (each op's nodes
    scaled by its measured / priced time, an op priced at zero given its measured time per call). A diagnosis of
    what pricing the compute right would do to the prediction, not a prediction: it reads this run's times."""
    from dataclasses import replace

    from trex.cost_model.annotate import annotate
    from trex.passes.reorder_comm import is_collective, is_wait, simulate
    from trex.runtime.emulated_link import parse_link

    out = {"priced_exposed_s": 0.0, "priced_compute_s": 0.0, "measured_exposed_s": 0.0, "measured_compute_s": 0.0}
    for graph in compiled.trex.graphs:
        for module in (graph.forward, graph.backward):
            if module is None:
                continue
            annotate(module, parse_link(link).cluster())
            nodes = [n for n in module.graph.nodes if n.op == "call_function" and n.meta.get("cost") is not None]
            compute = [n for n in nodes if not (is_collective(n) or is_wait(n)) and n.meta["cost"].priced]
            timeline = simulate(module.graph.nodes)
            out["priced_exposed_s"] += timeline.exposed_s
            out["priced_compute_s"] += timeline.step_s - timeline.exposed_s
            for node in compute:
                name, cost = op_name(node.target), node.meta["cost"]
                if name not in cpu:
                    continue
                total = priced.get(name, 0.0)
                seconds = cost.time_s * cpu[name] / total if total > 0 else cpu[name] / max(1.0, calls[name])
                node.meta["cost"] = replace(cost, time_s=seconds)
            timeline = simulate(module.graph.nodes)
            out["measured_exposed_s"] += timeline.exposed_s
            out["measured_compute_s"] += timeline.step_s - timeline.exposed_s
            annotate(module, parse_link(link).cluster())
    return out


def rank_main(args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from overlap import build

    from trex.runtime import emulated_link

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group(emulated_link.install(args["link"]))
    emulated_link.set_link("zero")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    clock_graphs()
    model, compiled, _ = build(
        "ep", "deepseek-v3", None, args["layers"], args["rows"] * args["seq"] // 2, 0, args["hidden"]
    )
    ids = torch.randint(
        0, model.config.vocab_size, (args["rows"], args["seq"] + 1), generator=torch.Generator().manual_seed(1)
    )
    mine = ids.chunk(world)[rank]

    def step() -> tuple[float, float]:
        dist.barrier()
        cpu, start = time.thread_time(), time.perf_counter()
        logits = compiled(input_ids=mine[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), mine[:, 1:].flatten(), reduction="sum")
        (loss / ids[:, 1:].numel()).backward()
        elapsed, used = time.perf_counter() - start, time.thread_time() - cpu
        model.zero_grad(set_to_none=True)
        return elapsed, used

    step()  # compile
    plain = [step() for _ in range(args["steps"])]
    CLOCK.on = True
    clocked = [step() for _ in range(args["steps"])]
    CLOCK.replay = True
    step()
    CLOCK.on = CLOCK.replay = False
    clock = CLOCK
    out = {"plain": plain, "clocked": clocked}
    if rank == 0:
        priced, nodes, unpriced = priced_by_op(compiled, args["link"])
        out.update(
            calls=dict(clock.calls),
            wall=dict(clock.wall),
            cpu=dict(clock.cpu),
            faults=dict(clock.faults),
            hot=dict(clock.hot),
            in_step=dict(clock.in_step),
        )
        out.update(priced=dict(priced), nodes=dict(nodes), unpriced=dict(unpriced))
        per_step = {k: v / args["steps"] for k, v in clock.cpu.items()}
        calls = {k: v / args["steps"] for k, v in clock.calls.items()}
        out["timeline"] = timeline_as_measured(compiled, args["link"], per_step, calls, priced)
    dist.destroy_process_group()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scaled-v3", type=int, default=512, metavar="HIDDEN")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--link", default="alpha_us=50,gbps=0.12", help="the link the pass decides on")
    parser.add_argument("--profile", help="a `trex calibrate` output directory to price with (as $TREX_CACHE_DIR)")
    parser.add_argument("--top", type=int, default=25, help="ops to list, by measured time")
    args = parser.parse_args()
    if args.profile:
        if not (Path(args.profile) / "cpu.toml").exists():
            parser.error(f"--profile {args.profile}: no cpu.toml there; run `trex calibrate --out DIR/cpu.toml` first")
        os.environ["TREX_CACHE_DIR"] = str(Path(args.profile).resolve())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from trex.runtime.launcher import launch_function

    config = {
        "link": args.link,
        "hidden": args.scaled_v3,
        "layers": args.layers,
        "seq": args.seq,
        "rows": args.rows,
        "steps": args.steps,
    }
    results = launch_function(rank_main, (config,), 2)
    r0 = results[0]
    steps = args.steps
    calls = {k: v / steps for k, v in r0["calls"].items()}
    wall = {k: v / steps for k, v in r0["wall"].items()}
    cpu = {k: v / steps for k, v in r0["cpu"].items()}
    priced, nodes = r0["priced"], r0["nodes"]

    def walls(rows, i):
        values = [row[i] for row in rows]
        return f"{min(values):.4f} / {statistics.median(values):.4f} / {max(values):.4f}"

    print(
        f"zero-cost link, rank 0, {steps} steps, s (min / median / max): wall {walls(r0['plain'], 0)}, this thread's "
        f"CPU {walls(r0['plain'], 1)}; under the op clock: wall {walls(r0['clocked'], 0)}, CPU "
        f"{walls(r0['clocked'], 1)}; rank 1 wall {walls(results[1]['plain'], 0)}, CPU {walls(results[1]['plain'], 1)}"
    )
    hot, in_step = r0["hot"], r0["in_step"]
    print(
        "| op | graph nodes | calls / step | priced ms / step | CPU ms / step | wall ms / step | CPU / priced | "
        "in step / again at once (operands hot) | page faults / step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    names = sorted(set(cpu) | set(priced), key=lambda n: -max(cpu.get(n, 0.0), priced.get(n, 0.0)))
    for name in names[: args.top]:
        p, c = priced.get(name, 0.0), cpu.get(name, 0.0)
        print(
            f"| {name} | {nodes.get(name, 0)} | {calls.get(name, 0):.0f} | {p * 1e3:.2f} | {c * 1e3:.2f} | "
            f"{wall.get(name, 0.0) * 1e3:.2f} | {c / p if p > 0 else float('nan'):.2f} | "
            f"{in_step[name] / hot[name] if hot.get(name) else float('nan'):.2f} | "
            f"{r0['faults'].get(name, 0) / steps:.0f} |"
        )
    rest = names[args.top :]
    print(
        f"| (the other {len(rest)} ops) | | {sum(calls.get(n, 0) for n in rest):.0f} | "
        f"{sum(priced.get(n, 0.0) for n in rest) * 1e3:.2f} | {sum(cpu.get(n, 0.0) for n in rest) * 1e3:.2f} | "
        f"{sum(wall.get(n, 0.0) for n in rest) * 1e3:.2f} | | | {sum(r0['faults'].get(n, 0) for n in rest) / steps:.0f} |"
    )
    step_cpu = statistics.median(row[1] for row in r0["plain"])
    ops_cpu = sum(cpu.values())
    print(
        f"priced compute {sum(priced.values()) * 1e3:.1f} ms per step; the ops' CPU time {ops_cpu * 1e3:.1f} ms "
        f"({sum(calls.values()):.0f} calls); the step's CPU time without the clock {step_cpu * 1e3:.1f} ms, "
        f"{(step_cpu - ops_cpu) * 1e3:.1f} ms of it between the ops (Python, autograd: "
        f"{(step_cpu - ops_cpu) / max(1.0, sum(calls.values())) * 1e6:.1f} us per call)"
    )
    t = r0["timeline"]
    print(
        f"the reorder timeline on {args.link} (forward + backward graphs): priced compute "
        f"{t['priced_compute_s'] * 1e3:.1f} ms, exposed {t['priced_exposed_s'] * 1e3:.1f} ms; with each op's nodes at "
        f"their measured CPU time: compute {t['measured_compute_s'] * 1e3:.1f} ms, exposed "
        f"{t['measured_exposed_s'] * 1e3:.1f} ms (a diagnosis from this run's times, not a prediction)"
    )
    print(
        f"minor page faults in the graphs' ops: {sum(r0['faults'].values()) / steps:.0f} per step (each a 4 KiB page the "
        "allocator took fresh from the kernel, zeroed and mapped on its first touch)"
    )
    both = [n for n in hot if hot[n] > 0]
    print(
        f"the calls timed again at once: {sum(in_step[n] for n in both) * 1e3:.1f} ms in the step, "
        f"{sum(hot[n] for n in both) * 1e3:.1f} ms with their operands hot; priced "
        f"{sum(priced.get(n, 0.0) for n in both) * 1e3:.1f} ms"
    )
    if r0["unpriced"]:
        print(f"unpriced nodes: {r0['unpriced']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
