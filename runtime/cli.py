"""`trex train`: next-token training of a model under a parallel plan, on N local ranks.

    trex train --model tiny-qwen3-moe --plan "dp=2,zero=1" --nproc 2 --steps 3 --seq 16 --gbs 4 --mbs 1 --json

The plan is checked against the model and --nproc before any process starts. trex starts the ranks
itself with torch.distributed's launcher (gloo on CPU, nccl on CUDA, hccl with torch_npu), or runs as
one of them when started by `torchrun ... -m trex train ...`. Every plan of the same model, seed and
batch gives the same losses. With --json one object is printed at the end: losses (global-batch mean
per step), first_step, world_size, plan, step_time_s (median), predicted_step_time_s, measured and
predicted peak memory per rank.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trex.errors import TrexError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model under a parallel plan on N local ranks (gloo on CPU); modes: "
        + ", ".join(sorted(train_modes())),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_training_flags(parser)
    parser.set_defaults(run=run, mode=None)
    modes = parser.add_subparsers(
        dest="mode", metavar="MODE", title="modes (each takes the flags above, after the mode's name)"
    )
    for _, register in sorted(train_modes().items()):
        register(modes, add_training_flags)


def train_modes() -> dict:
    """Training recipes registered by workloads (entry-point group `trex.train_modes`): name -> register
    function `register(modes_subparsers, add_training_flags)`."""
    from importlib.metadata import entry_points

    return {entry.name: entry.load() for entry in entry_points(group="trex.train_modes")}


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every `trex train` mode takes (plain next-token training and the registered modes)."""
    parser.add_argument("--model", help="built-in model name, tiny-<family>, or a transformers config.json (required)")
    parser.add_argument(
        "--plan",
        default="",
        help='parallel plan, e.g. "tp=2,ep=2,zero=1" (dp is derived from --nproc; default: all 1), "auto" (the '
        "planner's fastest plan for --nproc devices of this machine among those the runtime executes; "
        '"auto:pp=2" narrows its search as `trex plan --fix` does), or a plan '
        "file written by `trex plan --out` (its degrees; the batch comes from the flags)",
    )
    parser.add_argument("--nproc", type=int, default=1, help="processes to start (default 1)")
    parser.add_argument("--steps", type=int, default=3, help="train until this step (default 3)")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence (default 32)")
    parser.add_argument("--gbs", type=int, default=4, help="global batch: sequences per step (default 4)")
    parser.add_argument("--mbs", type=int, default=1, help="micro-batch: sequences per forward (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seeds initialization and data order (default 0)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="fp32 (default) or bf16 autocast")
    parser.add_argument(
        "--data", default="synthetic", help="'synthetic' (default) or a .jsonl file with an \"input_ids\" list per line"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--checkpoint-dir", type=Path, help="save DCP checkpoints here")
    parser.add_argument("--save-every", type=int, default=0, help="save every K steps (needs --checkpoint-dir)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir (any plan)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="capture each rank's model with trex.compile (slow to start on CPU)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a collective may wait for a peer before the run fails (default 300)",
    )
    parser.add_argument(
        "--progress-dir",
        type=Path,
        help="each rank keeps rank<R>.json here (pid, current step) for supervisors; default: a temporary directory",
    )
    parser.add_argument(
        "--schedule",
        default="",
        help="pipeline schedule with pp > 1: gpipe, 1f1b (default), interleaved (default with vpp > 1), zbv or "
        "dualpipev (both vpp=2, V placement)",
    )
    parser.add_argument(
        "--stage-split",
        default="",
        help='pipeline chunks as inclusive layer ranges in model order, e.g. "0-1,2-3" (default: the plan\'s split)',
    )
    parser.add_argument(
        "--emulate-link",
        metavar="LINK",
        help="make gloo collectives take a modelled link's time: 'alpha_us=20,gbps=5' (GB/s), 'zero', or a tier of "
        "the hardware catalog (e.g. infiniband-ndr); for measuring overlap on CPU",
    )
    parser.add_argument(
        "--zero3",
        choices=("fsdp2", "graph"),
        default="fsdp2",
        help="how a zero=3 plan runs: FSDP2 hooks (default), or 'graph': its all-gathers and reduce-scatters as "
        "nodes of the captured graph, which reorder_comm schedules with --compile (dp only)",
    )
    parser.add_argument(
        "--ep-chunks",
        default="auto",
        help="micro-chunks per expert-parallel layer (ep > 1): 'auto' (default: the cost model's choice with "
        "--compile, 1 otherwise) or a count; chunk i+1's dispatch travels while chunk i's experts compute",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with the results at the end")


def build_job(args: argparse.Namespace, config=None, **fields):
    """Everything checked before a process starts: model, plan vs model and --nproc, flags, checkpoint dir.

    A training mode passes its model `config` (when it changed it, e.g. the vocabulary for a tokenizer)
    and the extra `TrainJob` fields of its recipe (`source=` replaces --data's token source)."""
    from trex.models import load_config
    from trex.runtime.run_plan import resolve_plan
    from trex.runtime.trainer import TrainJob

    if not args.model:
        raise TrexError("--model is required (a built-in name, tiny-<family>, or a transformers config.json)")
    for name in ("steps", "seq", "gbs", "mbs"):
        if getattr(args, name) < 1:
            raise TrexError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.save_every < 0:
        raise TrexError(f"--save-every must be >= 0, got {args.save_every}")
    if args.save_every and args.checkpoint_dir is None:
        raise TrexError("--save-every needs --checkpoint-dir")
    if args.resume and args.checkpoint_dir is None:
        raise TrexError("--resume needs --checkpoint-dir (the directory an earlier run saved into)")
    emulate_link = getattr(args, "emulate_link", None)
    if emulate_link is not None:
        from trex.runtime.emulated_link import parse_link

        emulate_link = parse_link(emulate_link).spec  # refuse a bad link before any process starts
    config = config if config is not None else load_config(args.model)
    plan = resolve_plan(
        args.plan, config, args.nproc, seq=args.seq, gbs=args.gbs, mbs=args.mbs, precision=args.precision
    )
    zero3, ep_chunks = getattr(args, "zero3", "fsdp2"), getattr(args, "ep_chunks", "auto")
    from trex.runtime.zero3_in_graph import check_compiled_zero3, check_zero3_in_graph

    if zero3 == "graph":
        check_zero3_in_graph(plan, **{"checkpoint_dir": args.checkpoint_dir, **fields})
    check_compiled_zero3(plan, zero3, args.compile)
    from trex.runtime.expert_parallel import parse_ep_chunks

    parse_ep_chunks(ep_chunks)  # refuse a bad count before any process starts
    from trex.runtime.pipeline.limits import check_pipeline_job

    check_pipeline_job(config, plan, args.schedule, args.stage_split, args.compile)
    if plan.pp > 1 and fields.get("source"):
        raise TrexError("pipeline parallelism (pp > 1) runs plain `trex train`; training modes run with pp=1")
    if args.data != "synthetic" and not fields.get("source"):
        from trex.runtime.data import TokenSource

        TokenSource(
            args.data, vocab_size=config.vocab_size, seq=args.seq, gbs=args.gbs, seed=args.seed
        )  # refuse bad data now
    if args.checkpoint_dir is not None:
        latest = args.checkpoint_dir / "latest"
        if args.resume and not latest.exists():
            raise TrexError(
                f"--resume: no checkpoint in {args.checkpoint_dir} (no 'latest' file); run without --resume "
                "first, with --save-every K"
            )
        if not args.resume and latest.exists():
            raise TrexError(
                f"{args.checkpoint_dir} already holds checkpoints; pass --resume to continue that run, or "
                "choose an empty "
                "--checkpoint-dir (nothing is overwritten)"
            )
    job = TrainJob(
        model=args.model,
        plan_text=args.plan,
        plan=plan.to_dict(),
        steps=args.steps,
        seed=args.seed,
        data=args.data,
        lr=args.lr,
        checkpoint_dir=str(args.checkpoint_dir) if args.checkpoint_dir else None,
        save_every=args.save_every,
        resume=args.resume,
        compile=args.compile,
        timeout_s=args.timeout,
        verbose=not args.json,
        progress_dir=str(args.progress_dir) if args.progress_dir else None,
        schedule=args.schedule,
        stage_split=args.stage_split,
        emulate_link=emulate_link,
        zero3=zero3,
        ep_chunks=ep_chunks,
        **fields,
    )
    return job, config, plan


def run(args: argparse.Namespace) -> int:
    from trex.runtime.launcher import launch, started_by_torchrun
    from trex.runtime.prediction import predict
    from trex.runtime.trainer import median

    job, config, plan = build_job(args)
    result = launch(job, args.nproc)
    if started_by_torchrun() and int(__import__("os").environ.get("RANK", "0")) != 0:
        return 0
    predicted = predict(config, plan, args.nproc, compiled=args.compile, optimizer=job.optimizer)
    peak = max(m["total"] for m in result["memory_by_rank"])
    summary = {
        "losses": result["losses"],
        "first_step": result["first_step"],
        "world_size": result["world_size"],
        "plan": plan.label(),
        "step_time_s": median(result["step_times_s"]),
        "predicted_step_time_s": predicted.get("step_time_s"),
        "peak_memory_per_rank_bytes": peak,
        "predicted_memory_per_rank_bytes": predicted.get("memory_per_rank_bytes"),
        "memory_by_rank_bytes": result["memory_by_rank"],
        "predicted_memory_bytes": predicted.get("memory_bytes"),
        "predicted_activation_model": predicted.get("activation_model"),
    }
    if "error" in predicted:
        summary["prediction_error"] = predicted["error"]
    if result.get("pipeline"):  # pp > 1: schedule, split, bubble measured from timestamps and predicted
        summary["bubble_fraction"] = result["pipeline"]["bubble_fraction"]
        summary["pipeline"] = {k: v for k, v in result["pipeline"].items() if k != "bubble_fraction"}
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"trex train: {len(result['losses'])} steps on {result['world_size']} rank(s), plan "
            f"{plan.label()}; final loss "
            f"{result['losses'][-1]:.6f}; median step {summary['step_time_s']:.3f} s; peak memory per rank "
            f"{peak / 2**20:.1f} MiB",
            file=sys.stdout,
        )
    return 0
