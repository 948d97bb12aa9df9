"""`trex data`: solver-verified OR training data (SFT samples and CPT documents).

    trex data synth --n 10000 --out runs/ordata --seed 0 --workers 2
    trex data synth --n 200 --out runs/dta --teacher-openai http://localhost:8000 my-model --keep-unanimous 0.3
    trex data stats runs/ordata
    trex data verify runs/ordata --limit 500

`synth` resumes a run in DIR when it is started again with the same settings (after a kill, or
with a larger --n); its output is the same for a seed whatever --workers is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from trex.errors import TrexError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data",
        help="synthesize solver-verified OR training data (SFT samples, CPT documents)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    synth = commands.add_parser(
        "synth",
        help="generate, verify, select and write samples (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run = synth.add_argument_group("run")
    run.add_argument("--n", type=int, required=True, help="SFT samples to write (CPT documents: as many)")
    run.add_argument("--out", required=True, metavar="DIR", help="output directory; an existing run there is resumed")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--workers", type=int, default=1, metavar="K", help="worker processes (default: 1)")
    run.add_argument(
        "--shard-size", type=int, default=25, metavar="N", help="indices per shard, the unit of resuming (default: 25)"
    )
    run.add_argument(
        "--families", metavar="A,B", help="problem families to use (default: all; see `trex data families`)"
    )
    run.add_argument(
        "--infeasible-share", type=float, default=0.06, help="share of infeasible instances (default: 0.06)"
    )
    run.add_argument("--unbounded-share", type=float, default=0.03, help="share of unbounded instances (default: 0.03)")
    run.add_argument(
        "--isolation",
        choices=("auto", "bwrap", "namespaces", "process", "os"),
        default="auto",
        help="sandbox isolation for programs",
    )
    run.add_argument(
        "--cpt-instances",
        choices=("separate", "same", "none"),
        default="separate",
        help="what each CPT document is about: an instance of its own, verified like an SFT one (default; the CPT "
        "set never shows an SFT problem), the SFT sample's own instance (about 30%% less work per sample), or none",
    )
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--max-shards", type=int, metavar="N", help="stop after making N shards (resumable)")

    clean = synth.add_argument_group("decontamination and deduplication")
    clean.add_argument(
        "--bench-dir",
        default=None,
        metavar="DIR",
        help="benchmark files to decontaminate against (default: $TREX_OR_BENCH_DIR, else the index of the five OR benchmarks "
        "shipped with trex, the same from any directory)",
    )
    clean.add_argument(
        "--no-decontaminate", action="store_true", help="skip the benchmark n-gram check (the stats say so)"
    )
    clean.add_argument("--ngram", type=int, default=13, help="decontamination n-gram length in words (default: 13)")
    clean.add_argument(
        "--near-duplicate",
        type=float,
        default=0.8,
        help="estimated Jaccard similarity of prompts counted as near duplicates (default: 0.8)",
    )

    dta = synth.add_argument_group("DTA teachers, judge and selection")
    dta.add_argument(
        "--teacher-openai",
        nargs=2,
        action="append",
        default=[],
        metavar=("URL", "MODEL"),
        help="add a teacher served by an OpenAI-compatible endpoint (repeatable)",
    )
    dta.add_argument(
        "--teacher-transformers",
        action="append",
        default=[],
        metavar="DIR",
        help="add a local transformers model as a teacher (repeatable; run through trex.compile)",
    )
    dta.add_argument(
        "--no-programmatic",
        action="store_true",
        help="leave the programmatic (ground-truth) teacher out of the ensemble",
    )
    dta.add_argument(
        "--judge-openai",
        nargs=2,
        metavar=("URL", "MODEL"),
        help="add a reflection judge served by an OpenAI-compatible endpoint",
    )
    dta.add_argument("--judge-transformers", metavar="DIR", help="add a local transformers model as reflection judge")
    dta.add_argument(
        "--keep-unanimous",
        type=float,
        default=1.0,
        help="probability of keeping a task all teachers got right (default: 1)",
    )
    dta.add_argument(
        "--prefer", metavar="NAMES", default="", help="teacher names whose answers are emitted first, comma-separated"
    )
    dta.add_argument("--temperature", type=float, default=0.0, help="model teachers' sampling temperature")
    dta.add_argument("--max-tokens", type=int, default=2048, help="model teachers' output limit")
    dta.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable with the endpoint's API key, if any",
    )
    dta.add_argument("--no-compile", action="store_true", help="transformers teachers run without trex.compile")

    report = synth.add_argument_group("report")
    report.add_argument(
        "--tokenizer", metavar="DIR", help="local tokenizer for token-length statistics (default: approximate count)"
    )
    report.add_argument("--json", action="store_true", help="print the statistics as JSON")
    synth.set_defaults(run=run_synth)

    stats = commands.add_parser("stats", help="print the statistics of a run (finished or not)")
    stats.add_argument("dir", metavar="DIR")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(run=run_stats)

    verify = commands.add_parser("verify", help="re-verify the samples of a run from its files")
    verify.add_argument("dir", metavar="DIR")
    verify.add_argument("--limit", type=int, metavar="N", help="check the first N samples only")
    verify.add_argument("--isolation", choices=("auto", "bwrap", "namespaces", "process", "os"), default="auto")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(run=run_verify)

    families = commands.add_parser("families", help="list the problem families")
    families.set_defaults(run=run_families)


def _bench_dir(args: argparse.Namespace) -> str | None:
    if args.no_decontaminate:
        return None
    directory = args.bench_dir or os.environ.get("TREX_OR_BENCH_DIR")
    if directory is None:
        from trex.workloads.or_data.decontamination import DEFAULT_NGRAM, packaged_index

        if args.ngram != DEFAULT_NGRAM:
            raise TrexError(
                f"--ngram {args.ngram}: the benchmark index shipped with trex holds {DEFAULT_NGRAM}-grams; for another n pass the "
                "benchmark files themselves with --bench-dir DIR"
            )
        return str(packaged_index())
    option = "--bench-dir" if args.bench_dir else "$TREX_OR_BENCH_DIR"
    if not Path(directory).is_dir():
        raise TrexError(
            f"{option} {directory}: no such directory; pass the OR benchmark files' directory, leave it out to use the index "
            "shipped with trex, or --no-decontaminate"
        )
    return directory


def _config(args: argparse.Namespace):
    from trex.workloads.or_data.config import PROGRAMMATIC_TEACHER, SynthConfig, TeacherSpec
    from trex.workloads.or_data.families import FAMILIES
    from trex.workloads.or_data.selection import SelectionPolicy

    families = (
        tuple(name.strip() for name in args.families.split(",") if name.strip())
        if args.families is not None
        else tuple(FAMILIES)
    )
    if not families:
        raise TrexError(
            f"--families {args.families!r} selects no family; name some (see `trex data families`) or leave it out for all"
        )
    teachers = [] if args.no_programmatic else [PROGRAMMATIC_TEACHER]
    key_variable = {"api_key_env": args.api_key_env} if args.api_key_env else {}
    for number, (url, model) in enumerate(args.teacher_openai, start=1):
        options = {
            "base_url": url,
            "model": model,
            "temperature": args.temperature,
            "max_tokens": args.max_tokens,
            "seed": args.seed,
            **key_variable,
        }
        teachers.append(TeacherSpec("openai", f"openai-{number}", options))
    for number, path in enumerate(args.teacher_transformers, start=1):
        options = {
            "model_path": path,
            "compile": not args.no_compile,
            "temperature": args.temperature,
            "max_new_tokens": args.max_tokens,
            "seed": args.seed,
        }
        teachers.append(TeacherSpec("transformers", f"transformers-{number}", options))
    if not teachers:
        raise TrexError("--no-programmatic leaves no teacher; add --teacher-openai or --teacher-transformers")
    reflection = None
    if args.judge_openai and args.judge_transformers:
        raise TrexError("give one reflection judge: --judge-openai or --judge-transformers")
    if args.judge_openai:
        reflection = TeacherSpec(
            "openai",
            "reflection",
            {"base_url": args.judge_openai[0], "model": args.judge_openai[1], "max_tokens": 512, **key_variable},
        )
    elif args.judge_transformers:
        reflection = TeacherSpec(
            "transformers",
            "reflection",
            {"model_path": args.judge_transformers, "compile": not args.no_compile, "max_new_tokens": 256},
        )
    try:
        policy = SelectionPolicy(
            keep_unanimous=args.keep_unanimous, prefer=tuple(name for name in args.prefer.split(",") if name)
        )
    except ValueError as error:
        raise TrexError(str(error)) from None
    return SynthConfig(
        seed=args.seed,
        families=families,
        infeasible_share=args.infeasible_share,
        unbounded_share=args.unbounded_share,
        shard_size=args.shard_size,
        teachers=tuple(teachers),
        reflection=reflection,
        policy=policy,
        isolation=args.isolation,
        ngram=args.ngram,
        near_duplicate=args.near_duplicate,
        cpt_instances=args.cpt_instances,
    )


def run_synth(args: argparse.Namespace) -> int:
    from trex.workloads.or_data.stats import stats_markdown
    from trex.workloads.or_data.synthesis import synthesize

    if args.n < 1:
        raise TrexError(f"--n must be at least 1, got {args.n}")
    if args.workers < 1:
        raise TrexError(f"--workers must be at least 1, got {args.workers}")
    for option in ("infeasible_share", "unbounded_share"):
        value = getattr(args, option)
        if not 0.0 <= value <= 1.0:
            raise TrexError(f"--{option.replace('_', '-')} {value}: a share lies between 0 and 1")
    if args.infeasible_share + args.unbounded_share > 1.0:
        raise TrexError(
            f"--infeasible-share {args.infeasible_share} + --unbounded-share {args.unbounded_share} exceed 1: "
            "no room is left for instances with an optimum"
        )
    from trex.outputs import output_dir

    output_dir(args.out, "--out")
    config = _config(args)
    result = synthesize(
        config,
        args.out,
        args.n,
        workers=args.workers,
        bench_dir=_bench_dir(args),
        tokenizer_dir=args.tokenizer,
        progress=not args.no_progress,
        max_shards=args.max_shards,
    )
    finished = result.stats["samples"] >= args.n
    if args.json:
        json.dump(
            {
                **result.stats,
                "finished": finished,
                "shards_made": result.shards_made,
                "shards_reused": result.shards_reused,
                "wall_s": round(result.wall_s, 2),
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        sys.stdout.write(stats_markdown(result.stats))
        state = "finished" if finished else f"stopped after {result.shards_made} new shards; run again to resume"
        print(
            f"\n{state}: {result.shards_made} shards made, {result.shards_reused} reused, {result.wall_s:.1f} s; outputs in {args.out}"
        )
    return 0


def run_stats(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    stats_path = root / "stats.json"
    if stats_path.is_file():
        from trex.workloads.or_data.stats import stats_markdown

        stats = json.loads(stats_path.read_text(encoding="utf-8"))
        if "diversity" not in stats and (root / "sft.jsonl").is_file():  # a run made before the diversity report
            from trex.workloads.or_data.diversity import diversity_report

            with open(root / "sft.jsonl", encoding="utf-8") as file:
                stats["diversity"] = diversity_report(json.loads(line) for line in file if line.strip())
        if args.json:
            json.dump(stats, sys.stdout)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(stats_markdown(stats))
        return 0
    shards = sorted((root / "shards").glob("shard-*.jsonl")) if (root / "shards").is_dir() else []
    if not shards:
        raise TrexError(
            f"{root} holds no run (no stats.json and no shards); start one with `trex data synth --out {root}`"
        )
    from collections import Counter

    outcome: Counter = Counter()
    for path in shards:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                result = json.loads(line)
                outcome["emitted" if result["result"] == "emitted" else f"rejected:{result['stage']}"] += 1
    summary = {
        "finished": False,
        "shards": len(shards),
        "indices": sum(outcome.values()),
        "results": dict(sorted(outcome.items())),
    }
    if args.json:
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"{root}: unfinished run, {len(shards)} shards, {summary['indices']} indices: {summary['results']}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from trex.workloads.or_data.program_runner import ProgramRunner
    from trex.workloads.or_data.reverify import reverify

    if args.limit is not None and args.limit < 1:
        raise TrexError(
            f"--limit {args.limit}: checks nothing; give a positive number of samples (or leave --limit out for all)"
        )
    path = Path(args.dir) / "sft.jsonl"
    if not path.is_file():
        raise TrexError(f"{path} does not exist; finish the run first (`trex data synth` again resumes it)")
    records = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if args.limit is not None and len(records) >= args.limit:
                break
            try:
                records.append(json.loads(line))
            except ValueError:
                raise TrexError(f"{path}:{number} is not valid JSON") from None
    if not records:
        raise TrexError(f"{path} holds no samples: nothing to verify")
    with ProgramRunner(isolation=args.isolation, hide=(str(Path(args.dir).resolve()),)) as runner:
        report = reverify(records, runner)
    if args.json:
        json.dump(report.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"checked {report.checked} samples: {len(report.failures)} failed")
        for failure in report.failures[:20]:
            print(f"- {failure['id']}: {'; '.join(failure['problems'])}")
    return 0 if report.ok else 1


def run_families(args: argparse.Namespace) -> int:
    from trex.workloads.or_data.families import FAMILIES

    for name, family in FAMILIES.items():
        statuses = ", ".join(("optimal", *family.statuses))
        print(f"{name:22} {family.title} ({statuses})")
    return 0
