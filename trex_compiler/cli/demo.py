"""`trex demo`: compile a tiny DeepSeek-V4 on the CPU, train it, and show what trex did.

The model is built locally from a tiny random-init configuration (every V4 feature: hash-MoE and
routed-MoE layers, compressed sparse and heavily compressed attention, mHC streams). trex captures
one joint forward+backward graph, runs its pass pipeline, trains 20 AdamW steps on one small batch
(the loss falls as the batch is memorized), and writes the dump directory.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from trex.errors import TrexError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="compile a tiny DeepSeek-V4 on the CPU and train it for 20 steps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument(
        "--family", default="deepseek-v4", help="tiny model family: deepseek-v4 (default), deepseek-v3, qwen3-moe"
    )
    parser.add_argument("--batch", type=int, default=4, help="sequences per batch (default 4)")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence (default 32)")
    parser.add_argument(
        "--dump",
        metavar="DIR",
        type=Path,
        default=Path("trex_dump") / "demo",
        help="dump directory (default ./trex_dump/demo)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr while the model is built and compiled"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import trex
    from trex.cli.progress import progress_printer
    from trex.models import TINY_FAMILIES, build_model, tiny_config
    from trex.outputs import output_dir

    for option in ("steps", "batch", "seq"):
        if getattr(args, option) <= 0:
            raise TrexError(f"--{option} must be positive, got {getattr(args, option)}")
    if args.family not in TINY_FAMILIES:
        raise trex.UnknownNameError("model family", args.family, TINY_FAMILIES)
    output_dir(args.dump, "--dump")
    say = progress_printer("demo", args.quiet)
    say(f"building a tiny random-init {args.family}")
    config = tiny_config(args.family)
    model = build_model(config, seed=args.seed)
    total = sum(p.numel() for p in model.parameters())
    print(
        f"trex demo: tiny {args.family} ({config.num_hidden_layers} layers, {getattr(config, 'n_routed_experts', getattr(config, 'num_experts', '?'))} experts, top-{config.num_experts_per_tok}, {total / 1e6:.2f}M parameters), CPU"
    )

    start = time.perf_counter()
    compiled = trex.compile(model, dump_dir=args.dump, progress=say)
    say(
        "first step: Dynamo capture, AOTAutograd joint trace, passes, partition and lowering (with the default Inductor backend "
        "20-60 s cold on 2 cores: it compiles C++ for the forward and the backward)"
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=generator)

    step_seconds = []
    for step in range(1, args.steps + 1):
        step_start = time.perf_counter()
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_seconds.append(time.perf_counter() - step_start)
        note = f"  (first step includes capture and compile: {step_seconds[0]:.1f} s)" if step == 1 else ""
        print(f"step {step:3d}  loss {loss.item():.4f}{note}", flush=True)

    session = compiled.trex
    steady = sorted(step_seconds[1:])[len(step_seconds[1:]) // 2] if len(step_seconds) > 1 else step_seconds[0]
    print()
    print(session.summary())
    for graph in session.graphs:
        print(graph.report.summary())
    print(f"median step after compile: {steady * 1e3:.1f} ms; total {time.perf_counter() - start:.1f} s")
    dump = args.dump.resolve()
    files = sorted(p.relative_to(dump) for p in dump.rglob("*") if p.is_file() and not p.name.startswith("."))
    print(f"dump directory: {dump} ({len(files)} files), e.g.")
    for path in files[:6]:
        print(f"  {path}")
    if session.compiler.foreign_dump_files:
        print(f"  (left {len(session.compiler.foreign_dump_files)} files there that trex did not write untouched)")
    return 0
