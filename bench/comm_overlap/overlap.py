"""Exposed communication with and without `reorder_comm`, on 2 gloo ranks over an emulated slow link.

    python bench/comm_overlap/overlap.py --link "alpha_us=1000,gbps=0.2" --steps 5

Two plans of a tiny DeepSeek-V3 (random init, seed 0) on 2 CPU ranks, each rank training on half of a
global batch:

  ep     experts sharded over the 2 ranks (runtime/expert_parallel.py, the split dispatch / experts /
         combine nodes); the timed region is forward + backward (the captured program the pass schedules;
         the replicated weights' gradient all-reduce runs outside it and is not timed)
  zero3  ZeRO-3 inside the graph (runtime/data_parallel.shard_parameters_in_graph): every parameter
         all-gathered in the forward, its gradient reduce-scattered in the backward; timed region
         forward + backward (the AdamW step on the shards has no communication)

Each plan is compiled three times with trex.compile (eager backend): the default pipeline (`pass`; for EP
the layers also take the micro-chunk count the cost model picks, `plan_ep_chunks`), the same with
`-reorder_comm` (`no_pass`, one chunk), and `-reorder_comm` with Inductor's overlap scheduler run on the
partitioned forward and backward graphs (`inductor`; `--no-inductor` skips it). Every timed step runs once with the slow link and once with the `zero` link (same
compiled program, `emulated_link.set_link`), back to back, the pair's order alternating; exposed communication
of a step is the pair's difference, and a program's is the median over the pairs, printed with its 95%
distribution-free interval and quartiles (`exposure_summary`) and the predicted / measured ratio over that
interval. The prediction is the pass's own timeline (cost model + the link model) over the graphs as they
run; a second one prices what the step's collectives really moved (an EP exchange's rows depend on the routing)
and simulates both ranks together (`predicted_with_traffic`).
Losses of the two compilations must be identical (printed). Ratios: min / median / max over the steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


PEER_RESULTS: list[str] = []  # what Inductor's scheduler did on each graph it was given (this process)


def inductor_overlap(gm, target: str):
    """The peer: Inductor's FX overlap scheduler (`torch/_inductor/fx_passes/overlap_scheduling.py`,
    `schedule_overlap_bucketing`) on a partitioned forward or backward graph (where Inductor runs it: a post-grad
    pass, after the partitioner; on the joint graph its FSDP pre-bucketing makes a graph the partitioner rejects),
    given the same per-node times as reorder_comm (trex's cost model on the emulated link) through its
    `custom_runtime_estimation` hook and, for compute nodes, in place of its CUDA-only roofline."""
    from torch._inductor.fx_passes.overlap_scheduling import schedule_overlap_bucketing

    from trex.cost_model.annotate import annotate
    from trex.graph_copy import copy_graph_module
    from trex.passes.reorder_comm import cost_cluster

    annotate(gm, cost_cluster(target))

    def milliseconds(node, _override):
        cost = node.meta.get("cost")
        return cost.time_s * 1e3 if cost is not None and cost.priced else None

    trial = copy_graph_module(gm)
    try:
        with trex_roofline(milliseconds):
            result = schedule_overlap_bucketing(
                trial,
                custom_runtime_estimation=milliseconds,
                compute_estimator="analytical",
                collective_estimator="analytical",
                collective_bucketing=True,
            )
        result.graph.lint()
    except Exception as error:  # noqa: BLE001 - the peer's failure is a result: reported, graph left as it was
        PEER_RESULTS.append(f"failed: {type(error).__name__}: {error}"[:300])
        return gm
    gm.graph = result.graph
    gm.recompile()
    PEER_RESULTS.append("Inductor's overlap scheduler ran")
    return gm


def peer_on_partitioned_graphs():
    """Make this process's trex compiles hand each partitioned forward / backward graph to `inductor_overlap`
    before lowering it (the bench compiles the peer's program with `-reorder_comm`)."""
    from trex.driver import TrexCompiler

    original = TrexCompiler._lower

    def lower(self, graph, which, gm):
        if which in ("forward", "backward"):
            gm = inductor_overlap(gm, self.options.target.name)
            setattr(graph, which, gm)
        return original(self, graph, which, gm)

    TrexCompiler._lower = lower
    return original


@contextlib.contextmanager
def trex_roofline(milliseconds):
    """Inductor's overlap scheduler prices every compute node with its own roofline
    (`overlap_scheduling.estimate_roofline_runtime_ms`) before it asks `custom_runtime_estimation`; that roofline
    reads the GPU's DRAM bandwidth from Triton's active driver, which a CPU-only machine does not have
    (`RuntimeError: 0 active drivers`). While the peer runs, its roofline is trex's cost-model time for the node:
    both schedulers then see the same per-node times (0 for nodes the cost model leaves unpriced)."""
    from torch._inductor.fx_passes import overlap_scheduling

    original = overlap_scheduling.estimate_roofline_runtime_ms
    overlap_scheduling.estimate_roofline_runtime_ms = lambda node: milliseconds(node, None) or 0.0
    try:
        yield
    finally:
        overlap_scheduling.estimate_roofline_runtime_ms = original


SCALED_V3_EXPERTS = 32  # routed experts of the scaled shape: 16 per rank, 64 rows each at 256 tokens, top-8


def scaled_v3_config(hidden: int, layers: int):
    """DeepSeek-V3's shape scaled to `hidden`: the compute of an EP layer split as in V3 (routed experts, shared
    expert, attention projections, dense MLP in the same proportions), with GEMMs that take real time on a CPU rank.

    Every width that sets a GEMM's size scales with hidden / 7168 (transformers' DeepseekV3Config defaults are the
    671B model): the routed and shared experts' intermediate size (2048 -> 144 at hidden 512, rounded to a multiple
    of 16), the dense layers' (18432 -> 1312), the q / kv LoRA ranks and the head count (128 -> 9); the head dims
    (128 / 64 / 128), top-8 routing, one shared expert and node-limited routing (8 groups, 4 chosen) stay V3's.
    Then the attention projections do ~0.5 of the routed experts' FLOP per token and the shared expert 1/8, as in
    V3. Not scaled: 32 routed experts instead of 256 (each of the 16 per rank still gets ~64 rows at 256 tokens
    per rank), the vocabulary (1024: a 2-4 layer model's head would otherwise dwarf its layers, unlike V3's 61),
    first_k_dense_replace (1). The exchange / compute ratio is the link's: choose one where communication is a
    real share of the step (DeepSeek-V3's cross-node EP runs at ~1:1 computation to communication,
    arXiv:2412.19437 section 3.2.1)."""
    from transformers import DeepseekV3Config

    v3 = DeepseekV3Config()
    scale = hidden / v3.hidden_size

    def scaled(width: int) -> int:
        return max(16, int(round(width * scale / 16)) * 16)

    return DeepseekV3Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=scaled(v3.intermediate_size),
        moe_intermediate_size=scaled(v3.moe_intermediate_size),
        num_hidden_layers=layers or 3,
        num_attention_heads=max(1, round(v3.num_attention_heads * scale)),
        num_key_value_heads=max(1, round(v3.num_key_value_heads * scale)),
        n_routed_experts=SCALED_V3_EXPERTS,
        num_experts_per_tok=v3.num_experts_per_tok,
        n_shared_experts=v3.n_shared_experts,
        n_group=v3.n_group,
        topk_group=v3.topk_group,
        first_k_dense_replace=1,
        q_lora_rank=scaled(v3.q_lora_rank),
        kv_lora_rank=scaled(v3.kv_lora_rank),
        qk_nope_head_dim=v3.qk_nope_head_dim,
        qk_rope_head_dim=v3.qk_rope_head_dim,
        v_head_dim=v3.v_head_dim,
        routed_scaling_factor=v3.routed_scaling_factor,
    )


def pipeline(label: str):
    return None if label == "pass" else "-reorder_comm"


def build(
    plan: str, model_name: str, passes, layers: int = 0, tokens: int = 0, moe_intermediate: int = 0, hidden: int = 0
):
    """The plan's model and its trex compile. With reorder_comm in the pipeline (`passes` None) the EP plan's
    layers take the micro-chunk count the cost model chooses for `tokens` tokens per rank (plan_ep_chunks);
    without the pass they stay one chunk (the split is part of what the pass stands for)."""
    import torch.distributed as dist

    import trex
    from trex.models import build_model, tiny_config
    from trex.runtime.data_parallel import shard_parameters_in_graph
    from trex.runtime.expert_parallel import plan_ep_chunks, route_through_ep, shard_experts

    config = scaled_v3_config(hidden, layers) if hidden else tiny_config(model_name)
    if layers:
        config.num_hidden_layers = layers
    if moe_intermediate:
        config.moe_intermediate_size = moe_intermediate
    model = build_model(config, seed=0)
    chunking = []
    if plan == "ep":
        shard_experts(model, dist.group.WORLD)
        if passes is None and tokens:
            chunking = plan_ep_chunks(model, tokens)
    else:
        shard_parameters_in_graph(model, dist.group.WORLD)
    compiled = trex.compile(model, backend="eager", passes=passes)
    if plan == "ep":
        route_through_ep(model)
    return model, compiled, chunking


def predicted(compiled, link: str) -> float:
    """Exposed communication the pass's timeline (cost model + link model) predicts for the graphs as they run:
    the partitioned forward and backward graphs (each waits for its own collectives), or the inference graph."""
    return model_figures(compiled, link)["exposed_s"]


def model_figures(compiled, link: str) -> dict[str, float]:
    """On the graphs as they run, priced by the cost model with the current cpu profile: the exposed communication
    the timeline predicts (`exposed_s`), the least any schedule keeping the collective order could expose
    (`bound_s`, `reorder_comm.exposure_bound`), and the compute alone (`compute_s`: the zero-link step the
    profile predicts, to set against the measured one), each also per forward / backward graph."""
    from trex.cost_model.annotate import annotate
    from trex.passes.reorder_comm import exposure_bound, simulate
    from trex.runtime.emulated_link import parse_link

    out = {"exposed_s": 0.0, "bound_s": 0.0, "compute_s": 0.0}
    for graph in compiled.trex.graphs:
        modules = [("forward", graph.forward), ("backward", graph.backward)]
        if graph.backward is None:
            modules = [("forward", graph.joint or graph.forward)]
        for which, module in modules:
            annotate(module, parse_link(link).cluster())
            timeline = simulate(module.graph.nodes)
            figures = {
                "exposed_s": timeline.exposed_s,
                "bound_s": exposure_bound(module.graph, joint=False).exposed_s,
                "compute_s": timeline.step_s - timeline.exposed_s,
            }
            for key, value in figures.items():
                out[key] += value
                out[f"{which}_{key}"] = out.get(f"{which}_{key}", 0.0) + value
    return out


def profile_in_use() -> str:
    """One line naming the cpu profile the cost model prices with now: its description, calibrated or not, its
    fp32 GEMM rate per compute unit (what a one-thread rank's GEMMs run at) and compute units, and whether it
    describes this machine (calibrated, on this CPU model, with the threads a rank runs)."""
    import torch

    from trex.cost_model.devices import get_device

    profile = get_device("cpu")
    per_unit = profile.peak_flops("fp32") * profile.gemm.ceiling("fp32") / profile.gemm.compute_units / 1e9
    model = cpu_fields().get("model name", "?").strip()
    threads = torch.get_num_threads()
    if not profile.calibrated:
        verdict = "not this machine's (not measured)"
    elif model not in profile.description or profile.gemm.compute_units != threads:
        verdict = f"not this machine's (measured on another CPU or thread count than {model}, {threads} threads)"
    else:
        verdict = f"this machine's ({model}, {threads} thread per rank)"
    return (
        f"{'calibrated' if profile.calibrated else 'NOT calibrated'}: {profile.description}; fp32 GEMM "
        f"{per_unit:.1f} GFLOP/s per compute unit, {profile.gemm.compute_units} units: {verdict}"
    )


def predicted_with_traffic(compiled, link: str, traces: list[list]) -> list[float] | None:
    """Exposed communication per rank predicted by the same timeline with the sizes of the step that ran: every
    rank's collectives and local experts priced on the rows they really moved (`traffic_seconds` on each rank's
    recorded traffic), the ranks simulated together (`simulate_ranks`: a collective begins when the last rank
    has issued it). The balanced-routing prediction (`predicted`) assumes every rank receives as many rows as it
    sends; a random-init router does not route evenly. None when the traffic does not match the graphs."""
    from trex.cost_model.annotate import annotate
    from trex.passes.reorder_comm import is_collective, simulate_ranks, traffic_seconds
    from trex.runtime.emulated_link import parse_link

    cluster = parse_link(link).cluster()
    graphs = compiled.trex.graphs
    modules = [g.forward for g in graphs] + [g.backward for g in reversed(graphs) if g.backward is not None]
    if any(g.backward is None for g in graphs):
        modules = [g.joint or g.forward for g in graphs]
    counts = [sum(1 for n in m.graph.nodes if is_collective(n)) for m in modules]
    if any(len(trace) != sum(counts) for trace in traces):
        return None
    exposed = [0.0] * len(traces)
    offset = 0
    SPANS.clear()
    for module, count in zip(modules, counts):
        annotate(module, cluster)
        per_rank = [traffic_seconds(module.graph, trace[offset : offset + count], cluster) for trace in traces]
        timelines = simulate_ranks(module.graph.nodes, per_rank)
        for r, timeline in enumerate(timelines):
            exposed[r] += timeline.exposed_s
        SPANS.append({"spans": timelines[0].spans, "step_s": timelines[0].step_s})
        offset += count
    return exposed


def other_profile_prediction(compiled, args: dict) -> dict | None:
    """`model_figures` (and `profile_in_use`) with the cpu profile saved in `--compare-profile` (a `trex calibrate`
    output directory, as $TREX_CACHE_DIR) instead of the one the run prices with: the same program, another
    device profile."""
    if not args.get("compare_profile"):
        return None
    saved = os.environ.get("TREX_CACHE_DIR")
    os.environ["TREX_CACHE_DIR"] = args["compare_profile"]
    try:
        return {**model_figures(compiled, args["link"]), "profile": profile_in_use()}
    finally:
        if saved is None:
            os.environ.pop("TREX_CACHE_DIR")
        else:
            os.environ["TREX_CACHE_DIR"] = saved


SPANS: list = []  # rank 0's simulated collectives (name, issued, begun, done) per graph, of the last prediction


def rank_main(args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from trex.runtime import emulated_link

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group(emulated_link.install(args["link"]))  # the pass prices on this link
    emulated_link.STATS.recording = True  # each step's traffic and collective events (reset before every step)
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"rank": rank, "plans": {}}
    for plan in args["plans"]:
        for label in args["labels"]:
            torch._dynamo.reset()
            PEER_RESULTS.clear()
            restore = peer_on_partitioned_graphs() if label == "inductor" else None
            model, compiled, chunking = build(
                plan,
                args["model"],
                pipeline(label),
                args["layers"],
                args["rows"] * args["seq"] // 2,
                args["moe_intermediate"],
                args["hidden"],
            )
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
            vocab = model.config.vocab_size
            ids = torch.randint(0, vocab, (args["rows"], args["seq"] + 1), generator=torch.Generator().manual_seed(1))
            mine = ids.chunk(world)[rank]
            losses, slow, zero, link_s, slow_forward, zero_forward = [], [], [], [], [], []
            for step in range(args["steps"] + 1):
                # a pair of steps, slow link and zero link, back to back; the order alternates (slow first on even
                # steps, zero first on odd ones) so a drift of the machine within a pair (a neighbour's load, the
                # cache or allocator state one step leaves the next) falls on both sides equally often
                for which in ("slow", "zero") if step % 2 == 0 else ("zero", "slow"):
                    emulated_link.set_link(args["link"] if which == "slow" else "zero")
                    dist.barrier()
                    emulated_link.STATS.reset()
                    start = time.perf_counter()
                    logits = compiled(input_ids=mine[:, :-1], use_cache=False).logits
                    loss = F.cross_entropy(logits.float().flatten(0, 1), mine[:, 1:].flatten(), reduction="sum")
                    loss = loss / ids[:, 1:].numel()
                    forward_s = time.perf_counter() - start
                    loss.backward()
                    elapsed = time.perf_counter() - start
                    charged = emulated_link.STATS.total_seconds
                    if which == "slow":
                        trace = list(emulated_link.STATS.trace)  # what each collective moved (one step)
                        events = [[t - start for t in row] for row in emulated_link.STATS.events]
                    if which == "slow":
                        by_kind = {
                            kind: (count, emulated_link.STATS.seconds[kind])
                            for kind, count in emulated_link.STATS.collectives.items()
                        }
                    optimizer.zero_grad(set_to_none=True)  # timing steps do not update (same program, same data)
                    if step == 0:
                        continue  # compile
                    (slow if which == "slow" else zero).append(elapsed)
                    (slow_forward if which == "slow" else zero_forward).append(forward_s)
                    if which == "slow":
                        link_s.append(charged)
                        total = loss.detach().clone()
                        emulated_link.set_link("zero")
                        dist.all_reduce(total)
                        losses.append(float(total))
            emulated_link.set_link("zero")
            traces = [None] * world
            dist.all_gather_object(traces, trace)
            figures = model_figures(compiled, args["link"])
            out["plans"][f"{plan}/{label}"] = {
                "slow": slow,
                "zero": zero,
                "slow_forward": slow_forward,
                "zero_forward": zero_forward,
                "link_s": link_s,
                "losses": losses,
                "predicted_exposed_s": figures["exposed_s"],
                "model": figures,
                "profile": profile_in_use(),
                "predicted_routed_s": predicted_with_traffic(compiled, args["link"], traces),
                "predicted_other_profile_s": other_profile_prediction(compiled, args),
                "model_spans": list(SPANS),
                "peer": list(PEER_RESULTS),
                "chunking": [f"{name}: {chunks} chunk(s): {reason}" for name, chunks, reason in chunking],
                "link_by_kind": by_kind,  # the last slow step: kind -> (collectives, modelled seconds)
                # the last slow step's collectives: seconds after the step began, columns emulated_link.EVENT_FIELDS
                "events": events,
            }
            if restore is not None:
                from trex.driver import TrexCompiler

                TrexCompiler._lower = restore
            del model, compiled, optimizer
    dist.destroy_process_group()
    return out


def waiter_lateness(event: list[float]) -> float:
    from trex.runtime.emulated_link import waiter_lateness

    return waiter_lateness(event)


def cpu_fields() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    return {key.strip(): value for key, value in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


# fp32 lanes of the widest FMA vector, by the flag that announces it
VECTOR_LANES = (("avx512f", 16), ("avx2", 8))
# FMA pipes per core: two 512-bit FMA units on Intel's AMX-capable Xeon Scalable cores (4th gen and later), two
# 256-bit FMA units on AVX2 cores since Haswell (Intel 64 and IA-32 Architectures Optimization Reference Manual)
FMA_PIPES = 2


def machine() -> str:
    """This machine's CPU as the kernel reports it (model name, vector extensions) and the documented fp32 peak of
    one core that follows: lanes x 2 FLOP per FMA x FMA pipes x the clock /proc/cpuinfo reports."""
    fields = cpu_fields()
    if not fields:
        return "unknown (no /proc/cpuinfo)"
    flags = set(fields.get("flags", "").split())
    vector = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2", "fma") if f in flags]
    lanes = next((n for flag, n in VECTOR_LANES if flag in flags), 4)
    ghz = float(fields.get("cpu MHz", "0") or 0) / 1e3
    peak = f"{lanes} lanes x 2 x {FMA_PIPES} FMA pipes x {ghz:.2f} GHz = {lanes * 2 * FMA_PIPES * ghz:.0f} GFLOP/s fp32"
    return f"{fields.get('model name', '?').strip()}, {os.cpu_count()} cores, {' '.join(vector) or 'no AVX'}; one core's documented peak {peak}"


def spread(values: list[float]) -> str:
    return f"{min(values):.4f} / {statistics.median(values):.4f} / {max(values):.4f}"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of `values` (independent pairs' differences):
    the order statistics x(j) <= median <= x(n+1-j), j the largest rank with P(Binomial(n, 1/2) < j) <= (1 -
    confidence) / 2 (the sign test's interval; Conover, Practical Nonparametric Statistics, 3rd ed., section
    3.2). With too few values for that confidence (n < 6 at 95%) it is the range."""
    ordered = sorted(values)
    n = len(ordered)
    tail, below, j = (1 - confidence) / 2, 0.0, 0
    while j < n and below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    j = max(j, 1)
    return ordered[j - 1], ordered[n - j]


def exposure_summary(diffs: list[float]) -> str:
    """The measured exposed communication of a program: the median of its paired (slow - zero) step
    differences, its 95% interval (`median_interval`) and the quartiles, so the criterion is read against a
    number whose spread is printed."""
    low, high = median_interval(diffs)
    quartiles = statistics.quantiles(diffs, n=4) if len(diffs) >= 2 else [diffs[0]] * 3
    return (
        f"median {statistics.median(diffs):.4f} s (95% interval {low:.4f} - {high:.4f}; quartiles "
        f"{quartiles[0]:.4f} / {quartiles[2]:.4f}; {len(diffs)} pairs)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--link", default="alpha_us=1000,gbps=0.2")
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--plans", default="ep,zero3")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (default: the tiny config's)")
    parser.add_argument(
        "--moe-intermediate", type=int, default=0, help="experts' intermediate size (default: the tiny config's)"
    )
    parser.add_argument(
        "--scaled-v3",
        type=int,
        default=0,
        metavar="HIDDEN",
        help="DeepSeek-V3's shape scaled to this hidden size (scaled_v3_config) instead of the tiny config",
    )
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the raw per-rank numbers here")
    parser.add_argument("--no-inductor", action="store_true", help="skip the Inductor overlap-scheduler runs")
    parser.add_argument(
        "--compare-profile",
        help="also print the prediction with the cpu profile `trex calibrate` saved in this directory",
    )
    parser.add_argument(
        "--profile",
        help="price everything (the chunk choice, the pass's decisions, 'predicted exposed') with the cpu profile "
        "`trex calibrate` saved in this directory (as $TREX_CACHE_DIR), e.g. bench/comm_overlap/calibration",
    )
    args = parser.parse_args()
    from trex.runtime.launcher import launch_function

    if args.profile:
        if not (Path(args.profile) / "cpu.toml").exists():
            parser.error(f"--profile {args.profile}: no cpu.toml there; run `trex calibrate --out DIR/cpu.toml` first")
        os.environ["TREX_CACHE_DIR"] = str(Path(args.profile).resolve())  # the spawned ranks inherit it

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = {
        "link": args.link,
        "model": args.model,
        "plans": args.plans.split(","),
        "steps": args.steps,
        "layers": args.layers,
        "moe_intermediate": args.moe_intermediate,
        "hidden": args.scaled_v3,
        "seq": args.seq,
        "rows": args.rows,
        "labels": ["pass", "no_pass"] + ([] if args.no_inductor else ["inductor"]),
        "compare_profile": str(Path(args.compare_profile).resolve()) if args.compare_profile else None,
    }
    results = launch_function(rank_main, (config,), 2)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    r0 = results[0]["plans"]
    print(f"link {args.link}; {args.steps} timed steps; seconds min / median / max (rank 0)")
    for plan in config["plans"]:
        for line in r0[f"{plan}/pass"]["chunking"]:
            print(f"{plan} micro-chunks (cost model): {line}")
    first = r0[f"{config['plans'][0]}/no_pass"]
    print(f"cpu profile of the run (the pass's decisions, 'predicted exposed'): {first['profile']}")
    if first.get("predicted_other_profile_s"):
        print(f"cpu profile of --compare-profile: {first['predicted_other_profile_s']['profile']}")
    print(f"this machine: {machine()}")
    print(
        "| plan | pass | step, slow link | step, zero link | exposed comm (slow - zero) | comm charged / step | "
        "comm share of step | predicted exposed | losses |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for plan in config["plans"]:
        exposed = {}
        for label in ["no_pass", "pass"] + config["labels"][2:]:
            row = r0[f"{plan}/{label}"]
            diffs = [s - z for s, z in zip(row["slow"], row["zero"])]
            exposed[label] = diffs
            share = statistics.median(row["link_s"]) / statistics.median(row["slow"])
            print(
                f"| {plan} | {label} | {spread(row['slow'])} | {spread(row['zero'])} | {spread(diffs)} | "
                f"{statistics.median(row['link_s']):.4f} | {share:.0%} | {row['predicted_exposed_s']:.4f} | "
                f"{', '.join(f'{x:.6f}' for x in row['losses'][:3])} |"
            )
        same = r0[f"{plan}/pass"]["losses"] == r0[f"{plan}/no_pass"]["losses"]
        ratio = [p / n for p, n in zip(sorted(exposed["pass"]), sorted(exposed["no_pass"])) if n > 0]
        gain = [n / p for p, n in zip(sorted(r0[f"{plan}/pass"]["slow"]), sorted(r0[f"{plan}/no_pass"]["slow"]))]
        reduction = 1 - statistics.median(exposed["pass"]) / statistics.median(exposed["no_pass"])
        print(
            f"{plan}: exposed comm with / without the pass (sorted pairs) {spread(ratio) if ratio else 'n/a'}; "
            f"median exposed reduced by {reduction:.0%}; step time without / with the pass {spread(gain)}; "
            f"losses identical: {same}"
        )
        if "inductor" in config["labels"]:
            peer = r0[f"{plan}/inductor"]
            ratio = [t / p for t, p in zip(sorted(r0[f"{plan}/pass"]["slow"]), sorted(peer["slow"]))]
            print(
                f"{plan}: step time trex / Inductor overlap scheduler {spread(ratio)}; Inductor's pass: "
                f"{'; '.join(sorted(set(peer['peer']))) or 'did not run'}; losses identical to no pass: "
                f"{peer['losses'] == r0[f'{plan}/no_pass']['losses']}"
            )
        print(
            f"{plan}: which profile prices this machine (compute alone = the zero-link step, forward / backward; "
            "the exposure bound is the least any schedule keeping the collective order could expose on that "
            "profile's model):"
        )
        for label in config["labels"]:
            row = r0[f"{plan}/{label}"]
            zero_fwd = statistics.median(row["zero_forward"])
            zero_bwd = statistics.median([z - f for z, f in zip(row["zero"], row["zero_forward"])])
            exposed_fwd = statistics.median([s - z for s, z in zip(row["slow_forward"], row["zero_forward"])])
            exposed_bwd = statistics.median(
                [
                    (s - sf) - (z - zf)
                    for s, sf, z, zf in zip(row["slow"], row["slow_forward"], row["zero"], row["zero_forward"])
                ]
            )
            print(
                f"  {label}: measured zero-link step {zero_fwd:.4f} + {zero_bwd:.4f} s, exposed {exposed_fwd:.4f} + "
                f"{exposed_bwd:.4f} s (forward + backward, medians); "
                + "; ".join(
                    f"{name} profile: compute {m['forward_compute_s']:.4f} + {m['backward_compute_s']:.4f} s "
                    f"({(m['compute_s']) / (zero_fwd + zero_bwd):.2f}x measured), predicted exposed "
                    f"{m['forward_exposed_s']:.4f} + {m['backward_exposed_s']:.4f} s, bound "
                    f"{m['forward_bound_s']:.4f} + {m['backward_bound_s']:.4f} s"
                    for name, m in (
                        ("run's", row["model"]),
                        ("--compare-profile", row.get("predicted_other_profile_s")),
                    )
                    if m
                )
            )
        for label in config["labels"]:
            row = r0[f"{plan}/{label}"]
            diffs = [s - z for s, z in zip(row["slow"], row["zero"])]
            measured = statistics.median(diffs)
            low, high = median_interval(diffs)
            routed = row["predicted_routed_s"]
            within = (
                f"{row['predicted_exposed_s'] / high:.2f} - {row['predicted_exposed_s'] / low:.2f}"
                if low > 0
                else "n/a (the interval reaches 0)"
            )
            print(
                f"  {label}: predicted exposed {row['predicted_exposed_s']:.4f} s, measured {exposure_summary(diffs)}, "
                f"predicted / measured {row['predicted_exposed_s'] / measured if measured > 0 else float('nan'):.2f} "
                f"(over the measured median's 95% interval {within}); "
                + (
                    f"with the step's routing (ranks {', '.join(f'{x:.4f}' for x in routed)} s) "
                    f"{routed[0] / measured if measured > 0 else float('nan'):.2f}; "
                    if routed
                    else "no traffic prediction; "
                )
                + (
                    f"with the --compare-profile cpu profile {row['predicted_other_profile_s']['exposed_s']:.4f} s "
                    f"({row['predicted_other_profile_s']['exposed_s'] / measured if measured > 0 else float('nan'):.2f}); "
                    if row.get("predicted_other_profile_s") is not None
                    else ""
                )
                + "link per step: "
                + ", ".join(f"{kind} {n} x, {t:.4f} s" for kind, (n, t) in sorted(row["link_by_kind"].items()))
                + "; in the last slow step the rank's waits returned "
                f"{sum(waiter_lateness(e) for e in row['events']):.4f} s later than max(deadline, wait called) in all "
                "(the emulation's own lateness; completions after the deadlines "
                f"{sum(e[4] - e[3] for e in row['events']):.4f} s), "
                "and the collectives began "
                f"{sum(e[1] - e[0] for e in row['events']):.4f} s after this rank issued them in all (the other rank "
                "not there yet, and gloo)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
