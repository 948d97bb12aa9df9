"""Cold compile time, training-step time and peak memory: trex vs eager vs torch.compile (Inductor), side by side.

    python bench/compile_and_step.py [--steps 20] [--dtypes fp32,bf16] [--families deepseek-v4,...]
                                     [--trex-backends inductor,eager] [--regional] [--no-inductor] [--no-compiled-optimizer] [--meta]

For each tiny model family (DeepSeek-V4, DeepSeek-V3, Qwen3-MoE) and dtype, in one process, it builds
one model and gives every variant its own copy: eager PyTorch, `torch.compile` (Inductor, CPU) and
`trex.compile` (its default backends, Inductor then eager, unless --trex-backends says otherwise; with
--regional its Inductor backend compiles each distinct decoder layer once, `InductorBackend(regional=True)`).
A training step is forward + backward + AdamW: torch's `AdamW(fused=True)` for eager and torch.compile (torch's
fastest AdamW step on this CPU, bench/optimizer_step.py), `trex.optim.AdamW` for trex (the optimizer trex gives
its users: the same fused kernel, bit-equal updates, without the per-parameter Python of torch's step), and a
fourth variant, "Inductor+opt", torch.compile's model with torch's compiled-optimizer recipe
(`torch.compile(optimizer.step)` over `AdamW(foreach=True)`), so the peer also runs with torch's own compiled
optimizer path (--no-compiled-optimizer skips it).
Inductor's on-disk caches are off, so both compilers compile cold (after one tiny warm-up compile that
pays Inductor's once-per-process costs for both, see `warm_up_compilers`). The steps of the variants are
interleaved round by round, so load from other processes on the machine hits all variants alike;
the table shows median (min-max) step times over the rounds, the ratios trex/peer per round
(median, min-max), the same ratios in CPU time of the stepping thread (what a step costs when other
processes share the cores), each variant's first call (capture + compile + one step) and the peak memory the
CPU allocator reached during one step above what the step started with (torch.profiler memory
events). With --meta it also times the meta-device capture of the full-size models.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import trex
from trex.models import TINY_FAMILIES, build_model, tiny_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def torch_fused_adamw(parameters) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-4, fused=True)


def trex_adamw(parameters) -> torch.optim.Optimizer:
    return trex.optim.AdamW(parameters, lr=1e-4)


class CompiledAdamW:
    """torch's compiled-optimizer recipe: `AdamW(foreach=True)` with its `step` under torch.compile (Inductor
    fuses the foreach update into generated kernels); compiled at the first step."""

    def __init__(self, parameters):
        self.inner = torch.optim.AdamW(parameters, lr=1e-4, foreach=True)
        self.compiled_step = torch.compile(self.inner.step)

    def step(self) -> None:
        self.compiled_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


class TrainStep:
    """One model with its own optimizer: `step()` runs forward, backward and the optimizer update."""

    def __init__(self, module: torch.nn.Module, parameters, input_ids: torch.Tensor, optimizer=torch_fused_adamw):
        self.module = module
        self.optimizer = optimizer(parameters)
        self.input_ids = input_ids

    def step(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this thread): with one torch thread all of a step's work runs on
        the calling thread, so its CPU time is what the step costs even when other processes take the cores."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        self.module(input_ids=self.input_ids, labels=self.input_ids, use_cache=False).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, time.thread_time() - start_cpu


def peak_step_bytes(step: TrainStep) -> int:
    """The most CPU memory the allocator held during one step, above what it held when the step began."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step.step()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        with open(trace.name) as f:
            events = json.load(f)["traceEvents"]
    totals = [
        e["args"]["Total Allocated"]
        for e in events
        if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})
    ]
    if not totals:
        return 0
    first = events[[i for i, e in enumerate(events) if e.get("name") == "[memory]"][0]]["args"]
    baseline = first["Total Allocated"] - first.get("Bytes", 0)
    return max(totals) - baseline


def warm_up_compilers() -> None:
    """Pay Inductor's once-per-process costs before either compiler is timed: its imports, the C++ compiler
    and vector-ISA probes (small test programs it compiles), the compile worker threads, and the system
    description its graph hashes read (`CacheBase.get_system`, ~0.4-0.8 s here, first reached by a graph with
    a matmul). Without this the variant compiled first (trex) pays them and the one after it (torch.compile)
    does not."""
    x = torch.randn(8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda t, w: (t.view(1, 8) @ w).sin().sum())(x, w).backward()
    torch._dynamo.reset()


def cold_compile_setup(family: str, dtype: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The bench's process set-up for a cold first call, for the scripts that dissect it (first_call_profile,
    kernel_build_overlap): seeded, one torch thread, Inductor's caches off, compilers warmed up; the tiny model
    of `family` in `dtype` ("fp32" / "bf16") and its batch of 4 x 32 token ids."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True
    warm_up_compilers()
    config = tiny_config(family)
    model = build_model(config, seed=0).to(DTYPES[dtype])
    input_ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    return model, input_ids


def bench_family(
    family: str,
    dtype: torch.dtype,
    steps: int,
    inductor: bool,
    trex_backends: list[str] | None,
    regional: bool = False,
    compiled_optimizer: bool = True,
) -> dict:
    config = tiny_config(family)
    model = build_model(config, seed=0).to(dtype)
    input_ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    row: dict = {"family": family, "dtype": str(dtype).removeprefix("torch.")}
    variants: dict[str, TrainStep] = {}

    torch._dynamo.reset()  # once: a reset between variants would throw away the compiled ones before them

    def add(name: str, make, optimizer=torch_fused_adamw) -> None:
        base = copy.deepcopy(model)
        start = time.perf_counter()
        module = make(base)
        variants[name] = TrainStep(module, base.parameters(), input_ids, optimizer)
        variants[name].step()
        row[f"{name}_first"] = time.perf_counter() - start

    add("eager", lambda m: m)
    if regional:  # a fresh backend per model: its compile_seconds are this model's
        from trex.backends.inductor import InductorBackend

        names = trex_backends or ["inductor", "eager"]
        trex_backends = [InductorBackend(regional=True) if name == "inductor" else name for name in names]
    add("trex", lambda m: trex.compile(m, backend=trex_backends), trex_adamw)
    session = variants["trex"].module.trex
    row["trex_summary"] = session.summary()
    regional_notes = [  # what regional compilation made of each graph (--regional)
        f"    {which}: {note}"
        for g in session.graphs
        for which, lw in g.lowerings.items()
        for note in lw.notes
        if "regional compilation" in note
    ]
    row["trex_summary"] += "".join("\n" + line for line in regional_notes)
    row["trex_compile_s"] = {
        which: sum(lw.region_seconds.values()) for g in session.graphs for which, lw in g.lowerings.items()
    }
    if inductor:
        timed = torch._dynamo.utils.compilation_time_metrics  # seconds of each compile_fx_inner call, in order
        known = len(timed.get("compile_fx_inner", []))
        add("inductor", lambda m: torch.compile(m, fullgraph=True))
        # torch.compile's own forward and backward graph compiles, to set against trex's (item: cold compile)
        row["inductor_compile_s"] = timed.get("compile_fx_inner", [])[known:]
        if compiled_optimizer:
            add("inductor_opt", lambda m: torch.compile(m, fullgraph=True), CompiledAdamW)

    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(steps):
        for name, variant in variants.items():
            wall, cpu_seconds = variant.step()
            times[name].append(wall)
            cpu[name].append(cpu_seconds)
    row["times"] = times
    row["cpu"] = cpu
    row["peak"] = {name: peak_step_bytes(v) for name, v in variants.items()}
    return row


def _ratio_cell(numerator: list[float], denominator: list[float]) -> str:
    ratios = [d / n for n, d in zip(numerator, denominator)]  # speedup of `numerator`'s variant over the other
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:.1f} ({min(samples) * 1e3:.1f}-{max(samples) * 1e3:.1f})"


PEERS = {"eager": "eager", "inductor": "Inductor", "inductor_opt": "Inductor+opt"}


def print_table(rows: list[dict], inductor: bool, file=None) -> None:
    """One line per row: step times, trex's speedups per round over each peer (wall and thread CPU), first calls
    (trex / Inductor) and peak step memory of every variant measured ("Inductor+opt": with torch's compiled
    AdamW step)."""
    names = [n for n in ["eager", "trex", "inductor", "inductor_opt"] if all(n in r["times"] for r in rows)]
    peers = [n for n in names if n != "trex"]
    label = lambda n: "trex" if n == "trex" else PEERS[n]
    header = "| model | dtype | " + " | ".join(f"{label(n)} step ms" for n in names) + " |"
    header += " " + " | ".join(f"trex speedup vs {PEERS[n]}" for n in peers) + " |"
    header += " CPU ms per step: " + " / ".join(label(n) for n in names) + " |"
    header += " trex speedup in CPU time vs " + " / vs ".join(PEERS[n] for n in peers) + " |"
    header += " first call s: trex" + (" / Inductor" if inductor else "") + " |"
    header += " peak step MiB: " + " / ".join(label(n) for n in names) + " |"
    print(header, file=file)
    print("|" + "---|" * (header.count("|") - 1), file=file)
    for r in rows:
        t, c = r["times"], r["cpu"]
        line = f"| tiny {r['family']} | {r['dtype']} | " + " | ".join(_ms(t[n]) for n in names) + " |"
        line += " " + " | ".join(_ratio_cell(t["trex"], t[n]) for n in peers) + " |"
        line += " " + " / ".join(f"{statistics.median(c[n]) * 1e3:.1f}" for n in names) + " |"
        line += " " + " / ".join(_ratio_cell(c["trex"], c[n]) for n in peers) + " |"
        line += f" {r['trex_first']:.1f}" + (f" / {r['inductor_first']:.1f}" if inductor else "") + " |"
        # 0.01 MiB: the memory item compares them
        line += " " + " / ".join(f"{r['peak'][n] / 2**20:.2f}" for n in names) + " |"
        print(line, file=file, flush=True)


def bench_meta(names: list[str]) -> list[tuple[str, float, int, int]]:
    from trex.meta_capture import capture_model

    rows = []
    for name in names:
        torch._dynamo.reset()
        capture = capture_model(name)
        rows.append((name, capture.seconds["total"], len(capture.kinds) - 1, capture.num_layers))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--families", default=",".join(TINY_FAMILIES))
    parser.add_argument(
        "--trex-backends", default=None, help="trex's backend list, e.g. 'eager' (default: trex's default)"
    )
    parser.add_argument(
        "--regional",
        action="store_true",
        help="trex's Inductor backend compiles each distinct decoder layer once (InductorBackend(regional=True))",
    )
    parser.add_argument(
        "--no-inductor", action="store_true", help="skip torch.compile with Inductor (slow cold compile)"
    )
    parser.add_argument(
        "--no-compiled-optimizer",
        action="store_true",
        help="skip the Inductor+opt variant (torch.compile's model with torch.compile(optimizer.step))",
    )
    parser.add_argument("--meta", action="store_true", help="also time meta-device capture of the full-size models")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared 2-core machine two OpenMP threads time the scheduler)",
    )
    parser.add_argument("--summaries", action="store_true", help="print trex's compile summary for every model")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True  # cold compiles for trex's Inductor regions and for torch.compile alike
    warm_up_compilers()
    backends = args.trex_backends.split(",") if args.trex_backends else None
    inductor = not args.no_inductor
    rows = []
    for family in args.families.split(","):
        for dtype in args.dtypes.split(","):
            rows.append(
                bench_family(
                    family,
                    DTYPES[dtype],
                    args.steps,
                    inductor,
                    backends,
                    args.regional,
                    compiled_optimizer=not args.no_compiled_optimizer,
                )
            )
            print(f"done {family} {dtype}", file=sys.stderr, flush=True)
            print_table(
                rows[-1:], inductor, file=sys.stderr
            )  # each row as soon as it is measured (a long run may be cut short)
    load = os.getloadavg()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); batch 4 x 32 tokens; "
        "forward+backward+AdamW (eager, Inductor: torch's fused=True; trex: trex.optim.AdamW; "
        "Inductor+opt: torch.compile(step) of foreach=True); "
        f"median (min-max) of {args.steps} interleaved rounds; "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n"
    )
    print_table(rows, inductor)
    if args.summaries:
        for r in rows:
            print(f"\n{r['family']} {r['dtype']}:\n{r['trex_summary']}")
            if r.get("inductor_compile_s"):
                seconds = " + ".join(f"{s:.1f}" for s in r["inductor_compile_s"])
                print(
                    f"torch.compile: Inductor compiled its graphs (forward, backward) in {seconds} s (compile_fx_inner)"
                )
    if args.meta:
        print("\n| full-size model (meta device) | capture time (s) | layer kinds | decoder layers |")
        print("|---|---|---|---|")
        for name, seconds, kinds, layers in bench_meta(
            ["deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3", "qwen3-235b-a22b"]
        ):
            print(f"| {name} | {seconds:.1f} | {kinds} | {layers} |")


if __name__ == "__main__":
    main()
