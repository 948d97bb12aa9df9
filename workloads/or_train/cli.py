"""`trex train sft` and `trex train cpt`: supervised fine-tuning on chat samples and continued
pretraining on documents, compiled and distributed by trex's runtime.

    trex train cpt --model tiny-deepseek-v4 --data runs/data --out runs/or --steps 60 --seq 256 --gbs 8
    trex train sft --model tiny-deepseek-v4 --data runs/data --out runs/or --init runs/or/cpt/hf --plan ep=2 --nproc 2
    trex train sft --model deepseek-v4-flash --cluster cloudmatrix384 --devices 256 --dry-run

They take every flag of `trex train` (plan, ranks, batch, precision, checkpoints, --resume, --json).
`--data` is the directory `trex data synth` wrote (sft.jsonl / cpt.jsonl) or any JSONL file (chat
`messages` for sft, `text` for cpt). `--out RUN` keeps checkpoints in RUN/<mode>/checkpoints, the lines
not trained on in RUN/<mode>/rejected.jsonl (counted by reason, never dropped silently), the report in
RUN/<mode>/report.json and the final model with its tokenizer in RUN/<mode>/hf (what
`trex eval --client transformers --model RUN/<mode>/hf` reads).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from trex.errors import TrexError

MODES = {
    "sft": "supervised fine-tuning on chat samples (loss on the assistant turns only)",
    "cpt": "continued pretraining on documents (every token trained)",
}


def register_sft(modes: argparse._SubParsersAction, add_training_flags) -> None:
    _register(modes, add_training_flags, "sft")


def register_cpt(modes: argparse._SubParsersAction, add_training_flags) -> None:
    _register(modes, add_training_flags, "cpt")


def _register(modes: argparse._SubParsersAction, add_training_flags, kind: str) -> None:
    parser = modes.add_parser(
        kind, help=MODES[kind], description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_training_flags(parser)
    add_recipe_flags(parser)
    parser.set_defaults(run=lambda args: run_mode(args, kind), mode=kind)


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    recipe = parser.add_argument_group("post-training recipe")
    recipe.add_argument("--out", type=Path, help="run directory: checkpoints, rejected lines, report, exported model")
    recipe.add_argument(
        "--tokenizer", default="byte", help="a local transformers tokenizer directory, or 'byte' (built-in; default)"
    )
    recipe.add_argument(
        "--overlength",
        choices=("drop", "truncate"),
        default="drop",
        help="a sample longer than --seq + 1 tokens: drop it (default) or keep its first tokens; counted either way",
    )
    recipe.add_argument(
        "--packing",
        choices=("auto", "on", "off"),
        default="auto",
        help="several samples per row (document-isolated); auto: on when the model is checked to keep packed "
        "documents apart (default)",
    )
    recipe.add_argument("--epochs", type=float, help="train this many passes over the data (sets --steps)")
    recipe.add_argument(
        "--warmup", type=int, default=0, help="learning-rate warmup steps, then cosine decay (default 0)"
    )
    recipe.add_argument(
        "--min-lr-ratio", type=float, default=0.1, help="the cosine ends at this fraction of --lr (default 0.1)"
    )
    recipe.add_argument(
        "--optimizer",
        choices=("adamw", "muon"),
        default="adamw",
        help="adamw (default), or muon for the weight matrices with AdamW for the rest (needs tp=1, zero=0)",
    )
    recipe.add_argument(
        "--clip", type=float, default=1.0, help="clip the global gradient norm to this (0: off; default 1)"
    )
    recipe.add_argument(
        "--init", type=Path, help="start from these weights (a save_pretrained directory, e.g. RUN/cpt/hf)"
    )
    recipe.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="run the model eagerly (default: each rank's model goes through trex.compile)",
    )
    parser.set_defaults(compile=True, plan="auto")  # the planner's plan for --nproc devices unless --plan is given
    recipe.add_argument("--dry-run", action="store_true", help="print the plan and predictions only; no weights")
    recipe.add_argument("--cluster", help="--dry-run: the cluster to plan for (e.g. cloudmatrix384)")
    recipe.add_argument("--devices", type=int, help="--dry-run: devices of the cluster")
    recipe.add_argument(
        "--samples",
        type=int,
        default=10_000,
        help="--dry-run: samples per epoch to price (default 10,000, T-Rex's SFT set)",
    )
    recipe.add_argument("--tokens-per-sample", type=int, help="--dry-run: mean tokens per sample (packed rows)")


def run_mode(args: argparse.Namespace, kind: str) -> int:
    if args.dry_run:
        from trex.workloads.or_train.dry_run import dry_run

        return dry_run(args, kind)
    summary = train(args, kind)
    if args.json:
        print(json.dumps(summary))
    else:
        print(describe(summary), file=sys.stdout)
    return 0


def describe(summary: dict[str, Any]) -> str:
    losses = summary["losses"]
    lines = [
        f"trex train {summary['mode']}: steps {summary['first_step']}..{summary['first_step'] + len(losses) - 1} on "
        f"{summary['world_size']} rank(s), plan {summary['plan']}; loss {losses[0]:.4f} -> {losses[-1]:.4f}",
        f"  samples seen {summary['samples_seen']} (epoch {summary['epoch']:.2f}), {summary['tokens_per_s']:.0f} tokens/s, "
        f"packing {summary['packing']} ({summary['packing_reason']})",
        f"  data: {summary['samples']} samples, rejected {summary['rejected_summary']}, truncated {summary['truncated']}",
    ]
    if summary.get("export_dir"):
        lines.append(f"  model and tokenizer: {summary['export_dir']}")
    return "\n".join(lines)


def _model_config(args: argparse.Namespace, tokenizer: Any) -> tuple[Any, dict[str, Any], list[str]]:
    """The model's config, with the vocabulary widened to the tokenizer for tiny random models."""
    from trex.models import TINY_PREFIX, load_config

    config = load_config(args.model)
    size = len(tokenizer)
    notes = []
    overrides: dict[str, Any] = {}
    if size > config.vocab_size:
        if not str(args.model).startswith(TINY_PREFIX):
            raise TrexError(
                f"the tokenizer has {size} tokens but {args.model} a vocabulary of {config.vocab_size}; pass the model's "
                "own tokenizer (--tokenizer DIR)"
            )
        overrides["vocab_size"] = size
        notes.append(f"{args.model}: vocabulary widened from {config.vocab_size} to the tokenizer's {size} tokens")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, key)
        if value is not None and getattr(config, key, None) != value:
            overrides[key] = value
    for key, value in overrides.items():
        setattr(config, key, value)
    return config, overrides, notes


def decide_packing(choice: str, config: Any, seq: int, seed: int) -> tuple[bool, str]:
    if choice == "on":
        return True, "--packing on"
    if choice == "off":
        return False, "--packing off"
    from trex.models import build_model
    from trex.workloads.or_train.packing import isolates_documents

    parameters = sum(p.numel() for p in build_model(config, device="meta").parameters())
    if parameters > 500_000_000:
        raise TrexError(
            f"--packing auto checks the model on the CPU, and this one has {parameters / 1e9:.1f}B parameters; "
            "choose --packing on (attention isolates documents by position ids) or off (one sample per row)"
        )
    model = build_model(config, seed=seed)
    isolated, change = isolates_documents(model, config.vocab_size, min(seq, 64), seed=seed)
    if isolated:
        return True, "checked: a packed document's logits do not depend on the one before it"
    return False, (
        f"checked: the model's attention reads across packed documents (logits moved by {change:.2g}); one sample per row"
    )


def train(args: argparse.Namespace, kind: str, *, out: Path | None = None) -> dict[str, Any]:
    """Run one phase; returns the summary (also written to OUT/report.json)."""
    from trex.outputs import output_dir
    from trex.runtime.cli import build_job
    from trex.runtime.launcher import launch, started_by_torchrun
    from trex.runtime.prediction import predict
    from trex.runtime.trainer import median
    from trex.workloads.or_train.packing import PackedSource
    from trex.workloads.or_train.samples import data_file
    from trex.workloads.or_train.source import FACTORY, load, source_args

    if args.data == "synthetic":
        raise TrexError(
            f"trex train {kind} needs --data: the directory `trex data synth` wrote, or a JSONL file "
            f"({'chat messages' if kind == 'sft' else 'text documents'})"
        )
    if args.epochs is not None and args.epochs <= 0:
        raise TrexError(f"--epochs {args.epochs}: give a positive number of passes")
    if args.clip < 0 or args.warmup < 0 or not 0 <= args.min_lr_ratio <= 1:
        raise TrexError("--clip and --warmup must be >= 0 and --min-lr-ratio within [0, 1]")
    out = out if out is not None else (args.out / kind if args.out else None)
    if out is not None:
        output_dir(out, "--out")
        if args.checkpoint_dir is None:
            args.checkpoint_dir = out / "checkpoints"
        if not args.resume and (out / "hf").exists():
            raise TrexError(f"{out} already holds a finished {kind} run ({out / 'hf'}); pass --resume or a fresh --out")
        if not args.save_every:
            args.save_every = max(1, args.steps // 10) if args.epochs is None else 0
    path = data_file(args.data, kind)
    recipe = source_args(kind, path, args.tokenizer, args.overlength, False)
    tokenizer, dataset = load(recipe, args.seq)
    config, overrides, notes = _model_config(args, tokenizer)
    pack, reason = decide_packing(args.packing, config, args.seq, args.seed)
    recipe["pack"] = pack
    source = PackedSource(
        dataset.samples, seq=args.seq, gbs=args.gbs, seed=args.seed, pad_id=tokenizer.pad_token_id, pack=pack
    )
    if args.epochs is not None:
        args.steps = max(1, math.ceil(args.epochs * source.rows_per_epoch() / args.gbs))
        if out is not None and not args.save_every:
            args.save_every = max(1, args.steps // 10)
    if out is not None:
        dataset.rejected.write(out / "rejected.jsonl")
    job, config, plan = build_job(
        args,
        config,
        source=FACTORY,
        source_args=recipe,
        config_overrides=overrides,
        warmup_steps=args.warmup,
        decay_steps=args.steps,
        min_lr_ratio=args.min_lr_ratio,
        clip_grad_norm=args.clip,
        export_dir=str(out / "hf") if out is not None else None,
        init_dir=str(args.init) if args.init else None,
        optimizer=args.optimizer,
    )
    if args.optimizer == "muon":
        from trex.runtime.muon import check_muon_plan

        check_muon_plan(plan.tp, plan.zero, plan.data_parallel)
    result = launch(job, args.nproc)
    if started_by_torchrun() and int(__import__("os").environ.get("RANK", "0")) != 0:
        return {}
    first, count = result["first_step"], len(result["losses"])
    real_tokens = sum(
        sum(1 for d in row.documents[:-1] if d >= 0)
        for step in range(first, first + count)
        for row in source.rows_of_step(step)
    )
    elapsed = sum(result["step_times_s"])
    predicted = predict(config, plan, args.nproc)
    summary = {
        "mode": kind,
        "losses": result["losses"],
        "first_step": first,
        "samples_seen": source.samples_before(first + count),
        "epoch": source.epoch_of(first + count - 1) + 1 / max(1, source.rows_per_epoch() / args.gbs),
        "tokens_per_s": real_tokens / elapsed if elapsed else 0.0,
        "trained_tokens": result["tokens_trained"],
        "grad_norms": result["grad_norms"],
        "learning_rates": result["learning_rates"],
        "world_size": result["world_size"],
        "plan": plan.label(),
        "step_time_s": median(result["step_times_s"]),
        "predicted_step_time_s": predicted.get("step_time_s"),
        "samples": len(dataset.samples),
        "rejected": dict(dataset.rejected.counts),
        "rejected_summary": dataset.rejected.summary(),
        "truncated": dataset.truncated,
        "packing": "on" if pack else "off",
        "packing_reason": reason,
        "rows_per_epoch": source.rows_per_epoch(),
        "notes": notes,
        "export_dir": None,
    }
    if out is not None:
        tokenizer.save_pretrained(str(out / "hf"))
        summary["export_dir"] = str(out / "hf")
        (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    for note in notes:
        print(f"trex train {kind}: {note}", file=sys.stderr)
    if dataset.rejected.counts:
        where = f" (lines in {out / 'rejected.jsonl'})" if out is not None else ""
        print(f"trex train {kind}: not trained on: {dataset.rejected.summary()}{where}", file=sys.stderr)
    return summary
