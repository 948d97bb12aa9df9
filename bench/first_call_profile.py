"""Where a cold first call goes: trex's own stages against the Inductor compiles, and the graphs each compiler
hands Inductor.

    OMP_NUM_THREADS=1 python bench/first_call_profile.py --family qwen3-moe --dtype fp32 [--top 25] [--no-cprofile]

Same setup as `bench/compile_and_step.py` (tiny model, batch 4 x 32, Inductor's caches off, the same warm-up).
It runs trex's first call (capture + compile + one training step) and then torch.compile's, each with every
`compile_fx_inner` call recorded (seconds, nodes, call_function nodes by op), and prints:

* trex's stages (`CapturedGraph.seconds`: AOT trace, passes, partition, partitioned passes, lowering),
  each pass's own seconds (`PassRecord.seconds`), and the first call's rest (Dynamo, the step itself);
* each compiler's `compile_fx_inner` calls side by side, and the op kinds whose counts differ most;
* with cProfile on (the default; it inflates Python-heavy stages), the functions outside `compile_fx_inner`
  that cost trex's first call most (cumulative seconds), i.e. the candidates for trex's own overhead.

Why a separate script: the bench's first-call figure is one number; cutting it needs to know which part of
it is trex's own work and which is Inductor's, and whether Inductor is given more to compile than it gives itself.
"""

from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import functools
import importlib.util
import pstats
import re
import sys
import time
from pathlib import Path

import torch

import trex


def _bench_module():
    """bench/compile_and_step.py (not a package): its warm-up and training step, so both benches measure alike."""
    path = Path(__file__).with_name("compile_and_step.py")
    spec = importlib.util.spec_from_file_location("compile_and_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class InnerCompileLog:
    """Wraps `compile_fx_inner`: per call, its seconds, node count and call_function op histogram."""

    def __init__(self, inner, dump: Path | None = None, name: str = ""):
        self.inner = inner
        self.calls: list[dict] = []
        self.dump = dump  # where to write each call's graph and generated module (None: nowhere)
        self.name = name

    def __call__(self, gm, example_inputs, *args, **kwargs):
        ops = collections.Counter(
            str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes if n.op == "call_function"
        )
        start = time.perf_counter()
        compiled = self.inner(gm, example_inputs, *args, **kwargs)
        source = getattr(compiled, "source_code", "") or ""  # the generated wrapper (CompiledFxGraph)
        if self.dump is not None:
            self.dump.mkdir(parents=True, exist_ok=True)
            stem = self.dump / f"{self.name}_{len(self.calls)}"
            stem.with_suffix(".graph.txt").write_text(gm.print_readable(print_output=False))
            stem.with_suffix(".code.py").write_text(source)
        self.calls.append(
            {
                "seconds": time.perf_counter() - start,
                "nodes": len(gm.graph.nodes),
                "ops": ops,
                "kernels": source.count("async_compile.cpp_pybinding(") + source.count("async_compile.triton("),
                "externs": len(re.findall(r"extern_kernels\.\w+\(|torch\.ops\.\w+\.\w+\.default\(", source)),
            }
        )
        return compiled


def _first_call(bench, model, input_ids, compile_fn):
    """(seconds of capture + compile + one step, the compiled module, Dynamo's timed phases in that call)."""
    metrics = torch._dynamo.utils.compilation_time_metrics
    before = {key: len(values) for key, values in metrics.items()}
    start = time.perf_counter()
    module = compile_fn(model)
    bench.TrainStep(module, model.parameters(), input_ids).step()
    seconds = time.perf_counter() - start
    phases = {key: sum(values[before.get(key, 0) :]) for key, values in metrics.items()}
    return seconds, module, {key: value for key, value in phases.items() if value > 0.05}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen3-moe")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-cprofile", action="store_true", help="time without the profiler (figures comparable)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile's first call")
    parser.add_argument(
        "--dump", type=Path, help="write each compile_fx_inner call's graph and generated module into this folder"
    )
    args = parser.parse_args()
    import torch._inductor.compile_fx as compile_fx_module

    bench = _bench_module()
    model, input_ids = bench.cold_compile_setup(args.family, args.dtype)
    torch._dynamo.reset()

    original = compile_fx_module.compile_fx_inner
    trex_log = InnerCompileLog(original, args.dump, "trex")
    compile_fx_module.compile_fx_inner = trex_log  # trex's backend imports it at each lowering
    profiler = None if args.no_cprofile else cProfile.Profile()
    try:
        if profiler is not None:
            profiler.enable()
        trex_first, compiled, trex_phases = _first_call(bench, copy.deepcopy(model), input_ids, trex.compile)
        if profiler is not None:
            profiler.disable()
    finally:
        compile_fx_module.compile_fx_inner = original

    print(f"{args.family} {args.dtype}: trex first call {trex_first:.1f} s" + (" (under cProfile)" if profiler else ""))
    inner_total = sum(c["seconds"] for c in trex_log.calls)
    own_total = 0.0
    deferred_total = 0.0
    for graph in compiled.trex.graphs:
        stages = {k: v for k, v in graph.seconds.items() if not k.startswith("lower_")}
        own_total += sum(stages.values())
        lowering_extra = sum(graph.seconds.get(f"lower_{w}", 0.0) for w in graph.lowerings) - inner_total
        own_total += max(lowering_extra, 0.0)
        # backends/inductor/kernel_builds.py: kernels still building when compile_fx_inner returned, waited for
        # at the graph's first call (the backward's lowering ran while the forward's built)
        deferred = {
            which: builds.waited_seconds
            for which, lowering in graph.lowerings.items()
            if (builds := getattr(lowering.module, "trex_kernel_builds", None)) is not None
        }
        deferred_total += sum(deferred.values())
        print(
            f"  graph {graph.graph_id}: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items())
            + f"; lowering outside compile_fx_inner {lowering_extra:.2f} s"
            + "".join(f"; {which}'s kernel wait at its first call {s:.2f} s" for which, s in deferred.items())
        )
        if graph.report is not None:
            passes = sorted((r for r in graph.report.records if r.ran), key=lambda r: -r.seconds)
            print("    passes: " + ", ".join(f"{r.name} {r.seconds:.2f} s" for r in passes))
    print(
        f"  trex's own stages {own_total:.2f} s; compile_fx_inner {inner_total:.2f} s; "
        f"kernel waits deferred to the first calls {deferred_total:.2f} s; "
        f"the rest (Dynamo, the step, glue) {trex_first - own_total - inner_total - deferred_total:.2f} s"
    )

    inductor_log = None
    if not args.no_inductor:
        inductor_log = InnerCompileLog(original, args.dump, "inductor")
        backend = functools.partial(compile_fx_module.compile_fx, inner_compile=inductor_log)
        inductor_first, _, inductor_phases = _first_call(
            bench, copy.deepcopy(model), input_ids, lambda m: torch.compile(m, fullgraph=True, backend=backend)
        )
        print(
            f"torch.compile first call {inductor_first:.1f} s (compile_fx_inner "
            f"{sum(c['seconds'] for c in inductor_log.calls):.2f} s)"
        )

    print("\nDynamo's timed phases (seconds, summed): trex / torch.compile")
    for key in sorted(set(trex_phases) | set(inductor_phases if inductor_log else {})):
        theirs = inductor_phases.get(key, 0.0) if inductor_log else float("nan")
        print(f"  {key:45s} {trex_phases.get(key, 0.0):7.2f} / {theirs:7.2f}")
    print("\ncompile_fx_inner calls: seconds, nodes, call_function nodes")
    for name, log in (("trex", trex_log), ("torch.compile", inductor_log)):
        if log is None:
            continue
        for index, call in enumerate(log.calls):
            which = ("forward", "backward")[index] if len(log.calls) == 2 else f"#{index}"
            print(
                f"  {name:13s} {which:8s} {call['seconds']:6.2f} s  {call['nodes']:5d} nodes  "
                f"{sum(call['ops'].values()):5d} call_function  {call['kernels']:4d} generated kernels  "
                f"{call['externs']:4d} extern calls"
            )
    if inductor_log is not None and len(inductor_log.calls) == len(trex_log.calls):
        for index, (mine, theirs) in enumerate(zip(trex_log.calls, inductor_log.calls)):
            diff = collections.Counter(mine["ops"])
            diff.subtract(theirs["ops"])
            top = sorted(((k, v) for k, v in diff.items() if v), key=lambda kv: -abs(kv[1]))[:12]
            print(f"  graph #{index} ops trex - torch.compile: " + ", ".join(f"{k} {v:+d}" for k, v in top))

    if profiler is not None:
        stats = pstats.Stats(profiler)
        print(f"\ntrex's first call, top {args.top} functions by cumulative seconds (trex's own code):")
        rows = []
        for (filename, line, function), (_, calls, _tt, cumulative, _) in stats.stats.items():
            if any(part in filename for part in ("/trex_compiler/", "/passes/", "/backends/", "/cost_model/")):
                rows.append(
                    (cumulative, calls, f"{Path(filename).parent.name}/{Path(filename).name}:{line} {function}")
                )
        for cumulative, calls, where in sorted(rows, reverse=True)[: args.top]:
            print(f"  {cumulative:7.2f} s  {calls:7d} calls  {where}")
        print(f"\ntop {args.top} by own (tottime) seconds, everything:")
        stats.sort_stats("tottime").print_stats(args.top)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
