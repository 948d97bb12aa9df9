"""Which stage of trex's bf16 compile moves a gradient away from the fp32 run: a bisection tool.

    python bench/numerics/bf16_gradients_vs_fp32.py [--family deepseek-v4] [--layers N] VARIANT [VARIANT ...]

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
    KIND/PASS  a variant without one pass of the default pipeline, e.g. graph/cpu_gemm_precision
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import trex
from trex.backends.inductor import InductorBackend
from trex.models import build_model, tiny_config


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


def backends(kind: str) -> list:
    return {
        "eager": ["eager"],
        "inductor": ["inductor", "eager"],
        "emulate": ["inductor", "eager"],
        "graph": [GraphsByFx(), "eager"],
        "fwd": [OneSideCompiled("fwd"), "eager"],
        "bwd": [OneSideCompiled("bwd"), "eager"],
    }[kind]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--family", default="deepseek-v4")
    parser.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    parser.add_argument("--top", type=int, default=6, help="parameters listed per variant")
    args = parser.parse_args()
    import torch._inductor.config as inductor_config

    config = tiny_config(args.family)
    if args.layers is not None:
        config.num_hidden_layers = args.layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[: args.layers]
    base = build_model(config, dtype=torch.bfloat16, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    reference, exact = copy.deepcopy(base), copy.deepcopy(base).float()
    for model in (reference, exact):
        model(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()

    def distance(a: torch.Tensor, b: torch.Tensor) -> float:
        return torch.linalg.vector_norm(a.detach().float() - b.detach().float()).item()

    for variant in args.variants:
        kind, _, removed = variant.partition("/")
        torch._dynamo.reset()
        inductor_config.emulate_precision_casts = kind == "emulate"
        model = copy.deepcopy(base)
        start = time.perf_counter()
        compiled = trex.compile(model, backend=backends(kind), passes=f"-{removed}" if removed else None)
        compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()
        print(f"== {variant}: first call {time.perf_counter() - start:.1f} s", flush=True)
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
