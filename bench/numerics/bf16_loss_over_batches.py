"""How far a bf16 loss lands from the fp32 run over many token batches: trex, Inductor and eager bf16 side by side.

    python bench/numerics/bf16_loss_over_batches.py [--family deepseek-v3] [--batches 24] [--hold]

Why: `step_matches_eager(fp32_reference=True)` judges one batch: the compiled loss must be at most twice as far from
the fp32 run as eager bf16's. In an MoE model the loss is a discontinuous function of rounding noise - a token
whose best expert groups (or experts) are closer than bf16's resolution of the router's input changes experts
under any change of summation order - so one batch is one sample of that noise. This script builds the tiny
model in bf16 (seed 1, the test's weights), compiles it once with trex and once with plain `torch.compile`
(same shapes: no recompilation), and for batches of the test's shape (2 x 16 tokens, generator seeds
0..N-1; seed 0 is the test's batch) prints each program's loss distance to the same weights run in fp32, then
the median and mean per program and how often each is more than twice eager's (and eager more than twice it).
Forward only: the loss is all it reads.

`--hold`: every program (eager bf16, fp32, trex, Inductor) takes the routing eager bf16 chooses on each batch
(tests/held_routing.py, what the slow test now does), so the table shows the criterion judging rounding and
accumulation alone, batch by batch.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

import trex
from trex.models import build_model, tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # held_routing: the slow test's helper
import held_routing  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="deepseek-v3")
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--hold", action="store_true", help="every program takes eager bf16's routing")
    args = parser.parse_args()
    config = tiny_config(args.family)
    base = build_model(config, dtype=torch.bfloat16, seed=1)
    eager, exact = copy.deepcopy(base), copy.deepcopy(base).float()
    models = {"trex": copy.deepcopy(base), "inductor": copy.deepcopy(base)}

    def choices(seed: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
        return held_routing.record_routing(copy.deepcopy(base), lambda m: m(input_ids=ids, use_cache=False))

    held = [eager, exact, *models.values()] if args.hold else []
    for model in held:  # before the compiled programs' first call, so they trace the held routers
        held_routing.hold_routing(model, choices(0))
    programs = {"trex": trex.compile(models["trex"]), "inductor": torch.compile(models["inductor"])}
    distances: dict[str, list[float]] = {"eager bf16": [], **{name: [] for name in programs}}
    for seed in range(args.batches):
        ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
        if held:
            chosen = choices(seed)
            for model in held:
                held_routing.set_held_routing(model, chosen)
        reference = exact(input_ids=ids, labels=ids, use_cache=False).loss.detach()
        runs = {"eager bf16": eager, **programs}
        for name, model in runs.items():
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss.detach().float()
            distances[name].append((loss - reference).abs().item())
        print(f"batch {seed:2d}: " + "  ".join(f"{n} {d[-1]:.3g}" for n, d in distances.items()), flush=True)
    eager = distances["eager bf16"]
    for name, values in distances.items():
        line = f"{name:10s} median {statistics.median(values):.3g}  mean {statistics.mean(values):.3g}"
        if name != "eager bf16":
            worse = sum(v > 2 * e for v, e in zip(values, eager))
            better = sum(e > 2 * v for v, e in zip(values, eager))
            line += f"  > 2x eager's in {worse}/{len(values)}, eager's > 2x it in {better}/{len(values)}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
