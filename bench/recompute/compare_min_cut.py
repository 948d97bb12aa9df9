"""trex's recompute pass against torch's min-cut partitioner, budget by budget, on the same joint graphs.

    python bench/recompute/compare_min_cut.py                       # tiny DeepSeek-V4 / V3 / Qwen3-MoE
    python bench/recompute/compare_min_cut.py --meta deepseek-v4-flash --target h100   # + full-size layer kinds

Each model is captured once with trex (Dynamo + AOTAutograd + trex's default pipeline); the joint
graph the partitioner receives is recorded. Then, on copies of that same graph, for budgets
0.1..0.9:

* torch:  `min_cut_rematerialization_partition` with `torch._functorch.config.activation_memory_budget = b`;
* trex:   the `recompute` pass at `memory_budget=b` (a fraction of save-everything), then `default_partition`;
* trex@torch: the pass with torch's measured saved bytes as its budget (the equal-memory comparison);
* Megatron-style selective policies (core_attn, moe_act, mla_up_proj, ...) as fixed tag sets.

Every partition is measured the same way: saved bytes = distinct storages among the forward graph's
saved outputs (graph inputs excluded: the caller holds them), recompute = forward ops that appear in
the backward graph, priced by the cost model (`node.meta["cost"]`: seconds and FLOPs). Prints a table,
the per-budget ratios (min/median/max), writes a JSON file and, when matplotlib is installed, a PNG of
the Pareto fronts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch._functorch import config as functorch_config
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import CheckpointPolicy

import trex
import trex.driver as capture_module
from trex.graph_copy import copy_graph_module
from trex.passes.recompute import MemoryBudget, RecomputeBudgetError, choose, problem_for
from trex.passes.recompute.milp import solve
from trex.passes.recompute.problem import forward_node_names, layer_of

BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass
class Point:
    model: str
    method: str  # "torch-min-cut", "trex", "trex@torch-bytes", "megatron:<policy>", "save-everything"
    budget: float | None
    saved_bytes: int
    recompute_seconds: float
    recompute_flops: float
    seconds: float  # partition (+ solve) time
    note: str = ""


@dataclass
class Recorded:
    joint: torch.fx.GraphModule
    joint_inputs: object
    num_fwd_outputs: int
    kwargs: dict


@contextlib.contextmanager
def record_partitions(into: list[Recorded]):
    """Record every joint graph trex hands to `default_partition` (a copy, before partitioning)."""
    names = ("default_partition", "min_cut_rematerialization_partition")  # whichever the backend asks for
    real = {name: getattr(capture_module, name) for name in names}

    def spying(function):
        def spy(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
            into.append(Recorded(copy_graph_module(joint), joint_inputs, num_fwd_outputs, kwargs))
            return function(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

        return spy

    for name in names:
        setattr(capture_module, name, spying(real[name]))
    try:
        yield
    finally:
        for name in names:
            setattr(capture_module, name, real[name])


def capture_tiny(family: str) -> Recorded:
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    model = build_model(config, dtype=torch.float32, seed=1)
    recorded: list[Recorded] = []
    with record_partitions(recorded):
        compiled = trex.compile(model, backend="eager")  # default_partition: the joint graph trex partitions
        ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
        compiled(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return recorded[0]


def capture_meta(name: str) -> list[tuple[str, int, Recorded]]:
    from trex.meta_capture import capture_model

    recorded: list[Recorded] = []
    with record_partitions(recorded):
        capture = capture_model(name, include_ends=False)
    return [(kind.name, kind.count, r) for kind, r in zip(capture.kinds, recorded)]


def partitioning(rec: Recorded):
    """The tracing context AOTAutograd partitions in (its fake mode), so RNG functionalization of
    recomputed seeded ops (SDPA) can build its fake RNG state outside a compile."""
    from torch._guards import TracingContext, detect_fake_mode, tracing

    values = [n.meta.get("val") for n in rec.joint.graph.find_nodes(op="placeholder")]
    return tracing(TracingContext(detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])))


def measure(joint: torch.fx.GraphModule, forward, backward, num_fwd_outputs: int) -> tuple[int, float, float]:
    """(saved bytes, recompute seconds, recompute FLOPs) of one partition of `joint` (annotated)."""
    output = next(iter(forward.graph.find_nodes(op="output")))
    held = {
        StorageWeakRef(n.meta["val"].untyped_storage())
        for n in forward.graph.find_nodes(op="placeholder")
        if isinstance(n.meta.get("val"), torch.Tensor)
    }
    storages: dict = {}
    for node in output.args[0][num_fwd_outputs:]:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            key = StorageWeakRef(value.untyped_storage())
            if key not in held:
                storages[key] = int(value.untyped_storage().nbytes())
    forward_names = forward_node_names(joint)
    by_name = {n.name: n for n in joint.graph.nodes}
    seconds = flops = 0.0
    for node in backward.graph.nodes:
        if node.op == "call_function" and node.name in forward_names:
            cost = by_name[node.name].meta.get("cost")
            if cost is not None:
                seconds += cost.time_s
                flops += cost.flops
    return sum(storages.values()), seconds, flops


def torch_point(model: str, rec: Recorded, budget: float) -> Point:
    joint = copy_graph_module(rec.joint)
    start = time.perf_counter()
    with functorch_config.patch(activation_memory_budget=budget), partitioning(rec):
        forward, backward = min_cut_rematerialization_partition(
            joint, rec.joint_inputs, num_fwd_outputs=rec.num_fwd_outputs, **rec.kwargs
        )
    seconds = time.perf_counter() - start
    return Point(model, "torch-min-cut", budget, *measure(rec.joint, forward, backward, rec.num_fwd_outputs), seconds)


def trex_point(model: str, rec: Recorded, budget: float | MemoryBudget, method: str, target: str) -> Point:
    joint = copy_graph_module(rec.joint)
    start = time.perf_counter()
    parsed = MemoryBudget.parse(budget)
    try:
        problem = problem_for(joint, target)
        solution, _ = choose(problem, parsed)
    except RecomputeBudgetError as error:
        minimum = str(error).split("use memory_budget >= ")[-1].rstrip(")")
        return Point(
            model,
            method,
            parsed.fraction,
            -1,
            float("nan"),
            float("nan"),
            time.perf_counter() - start,
            f"infeasible: min {minimum}",
        )
    from trex.passes.recompute import apply_choice

    apply_choice(joint, problem, solution)
    with partitioning(rec):
        forward, backward = default_partition(
            joint, rec.joint_inputs, num_fwd_outputs=rec.num_fwd_outputs, **rec.kwargs
        )
    seconds = time.perf_counter() - start
    note = f"{solution.status}, solve {solution.seconds:.2f} s"
    return Point(
        model, method, parsed.fraction, *measure(rec.joint, forward, backward, rec.num_fwd_outputs), seconds, note
    )


def policy_nodes(joint: torch.fx.GraphModule, policy: str) -> list[torch.fx.Node]:
    """Forward nodes a Megatron-style selective policy recomputes (by module path and MoE role)."""
    forward = forward_node_names(joint)
    chosen = []
    for node in joint.graph.nodes:
        if node.name not in forward or node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        region = node.meta.get("trex_moe")
        if policy == "core_attn" and path.endswith("self_attn") and layer_of(node) != "outside the decoder layers":
            chosen.append(node)  # the attention core: ops of the attention module itself, not its projections
        elif (
            policy == "moe_act"
            and region is not None
            and region.role == "activation"
            or policy == "mla_up_proj"
            and any(p in path for p in ("q_b_proj", "kv_b_proj", "q_up", "kv_up"))
            or policy == "layernorm"
            and ("norm" in path.rsplit(".", 1)[-1])
        ):
            chosen.append(node)
    return [n for n in chosen if "nondeterministic_seeded" not in str(getattr(n.target, "tags", ""))]


def policy_point(model: str, rec: Recorded, policy: str) -> Point | None:
    joint = copy_graph_module(rec.joint)
    names = set()
    for part in policy.split("+"):
        names |= {n.name for n in policy_nodes(joint, part)}
    if not names:
        return None
    for node in joint.graph.nodes:
        if node.name in names:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    start = time.perf_counter()
    with partitioning(rec):
        forward, backward = default_partition(
            joint, rec.joint_inputs, num_fwd_outputs=rec.num_fwd_outputs, **rec.kwargs
        )
    return Point(
        model,
        f"megatron:{policy}",
        None,
        *measure(rec.joint, forward, backward, rec.num_fwd_outputs),
        time.perf_counter() - start,
    )


def run_model(model: str, rec: Recorded, target: str, budgets=BUDGETS) -> list[Point]:
    problem_for(rec.joint, target, reannotate=True)  # annotate once for the target: every copy carries the costs
    points = []
    forward, backward = default_partition(
        copy_graph_module(rec.joint), rec.joint_inputs, num_fwd_outputs=rec.num_fwd_outputs, **rec.kwargs
    )
    points.append(
        Point(model, "save-everything", 1.0, *measure(rec.joint, forward, backward, rec.num_fwd_outputs), 0.0)
    )
    for budget in budgets:
        t = torch_point(model, rec, budget)
        points.append(t)
        points.append(trex_point(model, rec, budget, "trex", target))
        points.append(trex_point(model, rec, MemoryBudget(bytes=max(1, t.saved_bytes)), "trex@torch-bytes", target))
        points[-1].budget = budget
        print(
            f"  {model} b={budget}: torch {t.saved_bytes} B / {t.recompute_seconds * 1e3:.3f} ms; "
            f"trex {points[-2].saved_bytes} B / {points[-2].recompute_seconds * 1e3:.3f} ms; "
            f"trex@torch {points[-1].saved_bytes} B / {points[-1].recompute_seconds * 1e3:.3f} ms",
            flush=True,
        )
    least = solve(problem_for(rec.joint, target), 0.0, minimize_bytes=True)
    if least.feasible:  # the least memory trex can promise, partitioned and measured like the rest
        points.append(trex_point(model, rec, MemoryBudget(bytes=max(1, least.saved_bytes)), "trex-minimum", target))
        print(f"  {model} trex minimum: {points[-1].saved_bytes} B / {points[-1].recompute_seconds * 1e3:.3f} ms")
    for policy in ("core_attn", "moe_act", "mla_up_proj", "layernorm", "core_attn+moe_act"):
        point = policy_point(model, rec, policy)
        if point is not None:
            points.append(point)
    return points


def table(points: list[Point]) -> str:
    lines = [
        "| model | budget | torch saved (KiB) | torch recompute (ms) | trex saved (KiB) | trex recompute (ms) | "
        "trex@torch-bytes saved (KiB) | trex@torch-bytes recompute (ms) | torch / trex@torch recompute |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by = {(p.model, p.method, p.budget): p for p in points}
    for model in dict.fromkeys(p.model for p in points):
        for budget in BUDGETS:
            t, x, e = (by.get((model, m, budget)) for m in ("torch-min-cut", "trex", "trex@torch-bytes"))
            if t is None:
                continue
            ratio = (
                t.recompute_seconds / e.recompute_seconds
                if e and e.recompute_seconds > 0
                else float("inf")
                if t.recompute_seconds > 0
                else 1.0
            )
            trex_cells = (
                f"{x.saved_bytes / 1024:.1f} | {x.recompute_seconds * 1e3:.3f}"
                if x.saved_bytes >= 0
                else f"- | {x.note}"
            )
            lines.append(
                f"| {model} | {budget} | {t.saved_bytes / 1024:.1f} | {t.recompute_seconds * 1e3:.3f} | {trex_cells} | "
                f"{e.saved_bytes / 1024:.1f} | {e.recompute_seconds * 1e3:.3f} | {ratio:.2f}x |"
            )
    return "\n".join(lines)


def ratios(points: list[Point]) -> str:
    by = {(p.model, p.method, p.budget): p for p in points}
    memory, compute = [], []
    for (model, method, budget), t in by.items():
        if method != "torch-min-cut":
            continue
        e = by[(model, "trex@torch-bytes", budget)]
        if e.saved_bytes >= 0 and t.saved_bytes > 0:
            memory.append(e.saved_bytes / t.saved_bytes)
            if t.recompute_seconds > 0:
                compute.append(e.recompute_seconds / t.recompute_seconds)

    def summary(xs):
        return f"min {min(xs):.3f} / median {statistics.median(xs):.3f} / max {max(xs):.3f}" if xs else "n/a"

    return (
        f"trex@torch-bytes saved / torch saved: {summary(memory)}\n"
        f"trex@torch-bytes recompute / torch recompute (where torch recomputes): {summary(compute)}"
    )


def plot(points: list[Point], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    models = list(dict.fromkeys(p.model for p in points))
    if not models:
        return "no points: no plot"
    figure, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.5), squeeze=False)
    for axis, model in zip(axes[0], models):
        mine = [p for p in points if p.model == model and p.saved_bytes >= 0]
        for method, style in (("torch-min-cut", "o-"), ("trex", "s-"), ("trex@torch-bytes", "^:")):
            front = sorted((p.saved_bytes / 2**20, p.recompute_seconds * 1e3) for p in mine if p.method == method)
            if front:
                axis.plot(*zip(*front), style, label=method, alpha=0.8)
        for p in mine:
            if p.method.startswith("megatron:") or p.method in ("save-everything", "trex-minimum"):
                axis.plot(
                    p.saved_bytes / 2**20,
                    p.recompute_seconds * 1e3,
                    "kx" if p.method == "save-everything" else "d",
                    label=p.method,
                )
        axis.set_title(model)
        axis.set_xlabel("saved activations (MiB)")
        axis.set_ylabel("recompute time (ms, cost model)")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="deepseek-v4,deepseek-v3,qwen3-moe")
    parser.add_argument("--meta", default="", help="full-size models to meta-capture, e.g. deepseek-v4-flash")
    parser.add_argument(
        "--target", default="cpu", help="cost-model target for recompute time (cpu for tiny, h100 for full size)"
    )
    parser.add_argument("--out", default="bench/recompute/results")
    parser.add_argument(
        "--kinds",
        default="",
        help="only the meta-captured kinds whose 'name xCOUNT' contains one of these (';'-separated)",
    )
    parser.add_argument(
        "--budgets", default=",".join(map(str, BUDGETS)), help="activation_memory_budget values to compare at"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    budgets = tuple(float(b) for b in args.budgets.split(","))
    points: list[Point] = []
    for family in [f for f in args.families.split(",") if f]:
        print(f"capturing tiny {family}", flush=True)
        points += run_model(f"tiny {family}", capture_tiny(family), args.target, budgets)
    for name in [m for m in args.meta.split(",") if m]:
        print(f"meta-capturing {name}", flush=True)
        for kind, count, rec in capture_meta(name):
            if args.kinds and not any(k in f"{kind} x{count}" for k in args.kinds.split(";")):
                continue
            points += run_model(f"{name} [{kind}] x{count}", rec, args.target, budgets)
    (out / "points.json").write_text(json.dumps([asdict(p) for p in points], indent=1))
    print(table(points))
    print(ratios(points))
    for p in points:
        if p.method.startswith("megatron:") or p.method in ("save-everything", "trex-minimum"):
            print(
                f"  {p.model} {p.method}: saved {p.saved_bytes / 1024:.1f} KiB, "
                f"recompute {p.recompute_seconds * 1e3:.3f} ms"
            )
    print(plot(points, out / "pareto.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
