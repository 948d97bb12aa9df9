"""Which stage of trex's bf16 compile moves a gradient away from the fp32 run: a bisection tool.

    python bench/numerics/bf16_gradients_vs_fp32.py [--family deepseek-v4] [--layers N] [--hold] VARIANT [VARIANT ...]

It builds the tiny model in bf16 (seed 1, the tokens of `tests/conftest.py`'s `step_matches_eager`), runs eager
bf16 and the same weights in fp32 once, then for each variant compiles a fresh copy with `trex.compile`, runs one
forward+backward and prints the parameters whose gradient is furthest from the fp32 run relative to eager bf16's
distance (the criterion of `step_matches_eager(fp32_reference=True)`: at most 2x). Variants:

    eager      trex with the eager backend (its passes; no Inductor decompositions, default partitioner)
    inductor   trex with Inductor leading (the default)
    emulate    the same with Inductor's `emulate_precision_casts` (its kernels round where eager rounds)
    graph      trex with Inductor leading, but the forward and backward graphs it would hand Inductor are run
               by torch.fx: Inductor's decompositions, the min-cut partition and every pass, no generated code
    fwd / bwd  Inductor compiles only the forward (backward) graph; the other runs by torch.fx
    diff       trex with Inductor leading; the forward graph also runs by torch.fx on the same inputs and the
               outputs that differ are printed in graph order: the first float ones (where the compiled code
               first departs) and every integer one (e.g. a router's top-k experts: a routing decision flipped)
    KIND/PASS  a variant without one pass of the default pipeline, e.g. graph/cpu_gemm_precision

`--hold`: eager bf16, the fp32 run and every variant take the routing eager bf16 chooses on the batch
(tests/held_routing.py; what `step_matches_eager(hold_routing=True)` does), so the figures are those the slow test
judges.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

import trex
from trex.backends.inductor import InductorBackend
from trex.models import build_model, tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # held_routing: the slow test's helper
import held_routing  # noqa: E402


def run_by_fx(gm, example_inputs):
    def run(*args):
        return gm(*args)

    run.trex_region = "fx"
    run.trex_notes = []
    return run


class GraphsByFx(InductorBackend):
    """Inductor's place in the pipeline (decompositions, min-cut), its graphs executed op by op."""

    def lower(self, gm, example_inputs):
        return run_by_fx(gm, example_inputs)


class OneSideCompiled(InductorBackend):
    """Inductor compiles the forward (`side="fwd"`) or the backward graph; the other runs by torch.fx."""

    def __init__(self, side: str):
        super().__init__()
        self.side = side

    def lower(self, gm, example_inputs):
        backward = any(p.name.startswith("tangents") for p in gm.graph.find_nodes(op="placeholder"))
        if backward == (self.side == "bwd"):
            return super().lower(gm, example_inputs)
        return run_by_fx(gm, example_inputs)


class ForwardDiff(InductorBackend):
    """Inductor compiles both graphs; each forward call also runs the forward graph by torch.fx on copies of its
    inputs and prints where the two disagree (graph order), so a gap is traced to the op where it starts."""

    def __init__(self, floats: int = 6):
        super().__init__()
        self.floats = floats

    def lower(self, gm, example_inputs):
        compiled = super().lower(gm, example_inputs)
        if any(p.name.startswith("tangents") for p in gm.graph.find_nodes(op="placeholder")):
            return compiled
        output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        nodes = list(output) if isinstance(output, (tuple, list)) else [output]
        order = {n: i for i, n in enumerate(gm.graph.nodes)}

        def run(*args):
            expected = gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            actual = compiled(*args)
            pairs = zip(nodes, *(v if isinstance(v, (tuple, list)) else [v] for v in (expected, actual)))
            floats = 0
            for node, e, a in sorted(pairs, key=lambda row: order.get(row[0], -1)):
                if not isinstance(e, torch.Tensor) or e.dtype == torch.bool or torch.equal(e, a):
                    continue
                if e.is_floating_point():
                    floats += 1
                    if floats <= self.floats:
                        gap = (e.float() - a.float()).abs().max().item()
                        print(
                            f"   float {node} ({node.target}, {e.dtype}): {int((e != a).sum())}/{e.numel()} "
                            f"differ, max {gap:.3g}",
                            flush=True,
                        )
                    continue
                rows = (e != a).reshape(len(e), -1).any(-1).nonzero().flatten().tolist() if e.dim() else [0]
                first = rows[0]
                print(
                    f"   int {node} ({node.target} {node.args[:2]}): rows {rows[:8]}{' ...' if len(rows) > 8 else ''}"
                    f", row {first}: fx {e[first].tolist()} compiled {a[first].tolist()}",
                    flush=True,
                )
            return actual

        run.trex_region = compiled.trex_region
        run.trex_notes = []
        return run


def backends(kind: str) -> list:
    return {
        "eager": ["eager"],
        "inductor": ["inductor", "eager"],
        "emulate": ["inductor", "eager"],
        "graph": [GraphsByFx(), "eager"],
        "fwd": [OneSideCompiled("fwd"), "eager"],
        "bwd": [OneSideCompiled("bwd"), "eager"],
        "diff": [ForwardDiff(), "eager"],
    }[kind]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--family", default="deepseek-v4")
    parser.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    parser.add_argument("--top", type=int, default=6, help="parameters listed per variant")
    parser.add_argument(
        "--inductor-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an Inductor setting for every variant, e.g. cpp.simdlen=256 (a Python literal value)",
    )
    parser.add_argument("--hold", action="store_true", help="every run takes eager bf16's routing on the batch")
    args = parser.parse_args()
    import ast

    import torch._inductor.config as inductor_config

    for setting in args.inductor_config:
        key, _, value = setting.partition("=")
        inductor_config.patch({key: ast.literal_eval(value)}).__enter__()

    config = tiny_config(args.family)
    if args.layers is not None:
        config.num_hidden_layers = args.layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[: args.layers]
    base = build_model(config, dtype=torch.bfloat16, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    reference, exact = copy.deepcopy(base), copy.deepcopy(base).float()
    choices = None
    if args.hold:
        choices = held_routing.record_routing(copy.deepcopy(base), lambda m: m(input_ids=input_ids, use_cache=False))
        for model in (reference, exact):
            held_routing.hold_routing(model, choices)
    losses = []
    for model in (reference, exact):
        loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        losses.append(loss.detach().float())
    eager_loss, exact_loss = losses

    def distance(a: torch.Tensor, b: torch.Tensor) -> float:
        return torch.linalg.vector_norm(a.detach().float() - b.detach().float()).item()

    for variant in args.variants:
        kind, _, removed = variant.partition("/")
        torch._dynamo.reset()
        inductor_config.emulate_precision_casts = kind == "emulate"
        model = copy.deepcopy(base)
        if choices is not None:
            held_routing.hold_routing(model, choices)
        start = time.perf_counter()
        compiled = trex.compile(model, backend=backends(kind), passes=f"-{removed}" if removed else None)
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        print(f"== {variant}: first call {time.perf_counter() - start:.1f} s", flush=True)
        print(
            f"   loss: trex {(loss.detach().float() - exact_loss).abs().item():.3g} from fp32,"
            f" eager bf16 {(eager_loss - exact_loss).abs().item():.3g}",
            flush=True,
        )
        rows = []
        for (name, p), q, r in zip(model.named_parameters(), reference.parameters(), exact.parameters()):
            if p.grad is None:
                continue
            mine, eager = distance(p.grad, r.grad), distance(q.grad, r.grad)
            rounding = distance(r.grad.to(q.dtype), r.grad)
            rows.append((mine / max(eager, rounding, 1e-30), name, mine, eager, r.grad.float().norm().item()))
        for ratio, name, mine, eager, norm in sorted(rows, reverse=True)[: args.top]:
            print(f"   {name:55s} {ratio:5.2f}x  trex {mine:.3g}  eager {eager:.3g}  |grad| {norm:.3g}", flush=True)


if __name__ == "__main__":
    main()
