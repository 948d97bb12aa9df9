"""`trex eval`: zero-shot pass@k on OR benchmarks, model-written programs run in a sandbox.

trex eval --bench nl4opt --client openai --base-url http://localhost:8000 --model my-model --out runs/a
trex eval --client replay --predictions ORLM/NL4OPT.executed.jsonl --rule lenient --json
trex eval --bench mamo_complexlp --client transformers --model ./checkpoints/tiny --form pyscipopt
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from trex.errors import TrexError

CLIENTS = ("replay", "openai", "transformers")
ISOLATION_CHOICES = ("auto", "bwrap", "namespaces", "process", "os")
RULES = ("strict", "mamo", "lenient")

# The module a warm sandbox worker preloads for programs of each answer form (ORLM's template is coptpy).
SOLVER_MODULES = {
    "coptpy": ("coptpy",),
    "orlm": ("coptpy",),
    "pyscipopt": ("pyscipopt",),
    "pyomo": ("pyomo.environ",),
    "pulp": ("pulp",),
    "gurobipy": (),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on OR modeling benchmarks (pass@k, programs run in a sandbox)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = parser.add_argument_group("benchmark")
    data.add_argument(
        "--bench",
        metavar="NAME_OR_PATH",
        help="nl4opt, mamo_easylp, mamo_complexlp, optmath_bench, optibench, or a JSON/JSONL file; optional with a replay file that carries questions and answers",
    )
    data.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where benchmark names are looked up (default: $TREX_OR_BENCH_DIR or ../shared/data/or_bench)",
    )
    data.add_argument("--question-field", metavar="FIELD")
    data.add_argument("--answer-field", metavar="FIELD")
    data.add_argument("--id-field", metavar="FIELD")
    data.add_argument("--category-field", metavar="FIELD")
    data.add_argument("--limit", type=int, metavar="N", help="evaluate the first N items only")

    model = parser.add_argument_group("model")
    model.add_argument("--client", choices=CLIENTS, required=True)
    model.add_argument(
        "--predictions", metavar="FILE", help="replay: JSON/JSONL predictions (ORLM's executed.jsonl works as is)"
    )
    model.add_argument(
        "--replay-source",
        choices=("auto", "program", "output"),
        default="auto",
        help="replay: run the stored program (to_run_script) or extract one from the stored output (default: the program when present)",
    )
    model.add_argument("--base-url", metavar="URL", help="openai: server root, e.g. http://localhost:8000")
    model.add_argument(
        "--model", metavar="NAME_OR_DIR", help="openai: the served model name; transformers: a local model directory"
    )
    model.add_argument(
        "--api", choices=("chat", "completions"), default="chat", help="openai: endpoint (default: chat)"
    )
    model.add_argument(
        "--api-key-env",
        metavar="VAR",
        default="OPENAI_API_KEY",
        help="openai: environment variable holding the API key, if any",
    )
    model.add_argument("--concurrency", type=int, default=8, help="openai: requests in flight (default: 8)")
    model.add_argument(
        "--request-timeout", type=float, default=600.0, metavar="S", help="openai: seconds per request (default: 600)"
    )
    model.add_argument("--max-retries", type=int, default=5, help="openai: retries per request (default: 5)")
    model.add_argument("--system-prompt", metavar="TEXT")
    model.add_argument("--temperature", type=float, default=0.0)
    model.add_argument("--top-p", type=float, default=1.0)
    model.add_argument("--max-tokens", type=int, default=4096, metavar="N")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--no-compile", action="store_true", help="transformers: run the model without trex.compile")
    model.add_argument("--compile-target", default="cpu", help="transformers: trex.compile target (default: cpu)")
    model.add_argument("--compile-backend", default="eager", help="transformers: trex.compile backend (default: eager)")
    model.add_argument("--batch-size", type=int, default=4, help="transformers: prompts decoded together")
    model.add_argument("--device", default="cpu", help="transformers: torch device")
    model.add_argument("--dtype", default="float32", help="transformers: torch dtype")

    scoring = parser.add_argument_group("prompting and scoring")
    scoring.add_argument(
        "--form",
        help="answer form: coptpy, pyscipopt, gurobipy, pyomo, pulp, orlm (ORLM's template), lp, answer (default: pyscipopt; replay of an ORLM file: orlm)",
    )
    scoring.add_argument(
        "--samples", type=int, metavar="N", help="samples per item (default: 1; replay: records per item)"
    )
    scoring.add_argument("--k", default="1", metavar="K[,K...]", help="pass@k values to report (default: 1)")
    scoring.add_argument(
        "--rule", choices=RULES, default="strict", help="strict (default), mamo (1e-4 relative) or lenient (ORLM)"
    )

    running = parser.add_argument_group("execution")
    running.add_argument("--workers", type=int, metavar="N", help="programs run at once (default: CPU cores)")
    running.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="wall-clock seconds per program (default: 60)"
    )
    running.add_argument(
        "--cpu-limit", type=float, metavar="S", help="CPU seconds per program (default: the --timeout)"
    )
    running.add_argument("--memory-mb", type=int, default=4096, help="address space per program in MiB (default: 4096)")
    running.add_argument(
        "--isolation",
        choices=ISOLATION_CHOICES,
        default="auto",
        help="sandbox isolation: bwrap (warm workers in bubblewrap + seccomp), namespaces (root; fresh interpreter per program; 'os' is an alias), process (limits + audit hook only); auto picks the first that works here",
    )
    running.add_argument("--out", metavar="DIR", help="store results here as they finish; re-running resumes")
    running.add_argument("--json", action="store_true", help="print the report as one JSON object")
    running.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(run=run)


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise TrexError(f"--k {text!r}: expected positive integers separated by commas") from None
    if not ks or ks[0] < 1:
        raise TrexError(f"--k {text!r}: expected positive integers separated by commas")
    return ks


def _client(args: argparse.Namespace, fields):
    if args.client == "replay":
        from trex.workloads.or_eval.replay_client import ReplayClient

        if not args.predictions:
            raise TrexError("--client replay needs --predictions FILE")
        return ReplayClient(args.predictions, source=args.replay_source, fields=fields)
    if not args.model:
        raise TrexError(f"--client {args.client} needs --model")
    if args.client == "openai":
        from trex.workloads.llm_clients import OpenAIClient

        if not args.base_url:
            raise TrexError("--client openai needs --base-url URL")
        return OpenAIClient(
            args.base_url,
            args.model,
            api=args.api,
            api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
            timeout_s=args.request_timeout,
            max_retries=args.max_retries,
            concurrency=args.concurrency,
            system_prompt=args.system_prompt,
            seed=args.seed,
        )
    from trex.workloads.llm_clients.local import TransformersClient

    return TransformersClient(
        args.model,
        compile=not args.no_compile,
        target=args.compile_target,
        backend=args.compile_backend,
        device=args.device,
        dtype=args.dtype,
        max_new_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        batch_size=args.batch_size,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    from trex.workloads.or_eval import FieldNames, Rule, build_report, evaluate, load_benchmark, write_report
    from trex.workloads.or_eval.prompts import FORMS
    from trex.workloads.sandbox import Limits, Sandbox

    if args.form is not None and args.form not in FORMS:
        raise TrexError(f"unknown --form {args.form!r}; valid: {', '.join(FORMS)}")
    ks = _ks(args.k)
    if args.limit is not None and args.limit < 1:
        raise TrexError(
            f"--limit {args.limit}: evaluates nothing; give a positive number of items (or leave --limit out for all)"
        )
    if args.samples is not None and args.samples < 1:
        raise TrexError(f"--samples {args.samples}: give at least 1 sample per item")
    if args.out:
        from trex.outputs import output_dir

        output_dir(args.out, "--out")
    fields = FieldNames(
        question=args.question_field, answer=args.answer_field, id=args.id_field, category=args.category_field
    )
    client = _client(args, fields)
    form = args.form or (
        "orlm" if getattr(client, "output_field", None) == "en_math_model_coptpy_code" else "pyscipopt"
    )
    notes: list[str] = []
    if args.bench:
        benchmark = load_benchmark(args.bench, data_dir=args.data_dir, fields=fields)
        if args.client == "replay":
            client.match(benchmark)
            if client.unmatched:
                notes.append(
                    f"{len(client.unmatched)} prediction record(s) matched no benchmark item (lines {client.unmatched[:10]}{'...' if len(client.unmatched) > 10 else ''})"
                )
    elif args.client == "replay":
        benchmark = client.as_benchmark()
        notes.append("ground truths are the answers carried in the predictions file")
    else:
        raise TrexError(f"--client {args.client} needs --bench NAME_OR_PATH")
    samples = args.samples or (client.samples_per_item() if args.client == "replay" else 1)
    if not benchmark.items:
        raise TrexError(f"benchmark {benchmark.name} ({benchmark.path}) has no items: nothing to evaluate")
    too_large = [k for k in ks if k > samples]
    if too_large:
        raise TrexError(
            f"--k {args.k}: pass@{too_large[0]} needs at least {too_large[0]} samples per item, and this run has {samples} "
            f"(raise --samples to {max(too_large)}, or drop k > {samples})"
        )

    limits = Limits(
        wall_s=args.timeout,
        cpu_s=args.cpu_limit or args.timeout,
        memory_bytes=args.memory_mb << 20,
    )
    # the program must not read ground truths: hide the folders of the benchmark and prediction
    # files (other versions of a benchmark tend to sit next to it) and the results directory
    hidden = [os.path.dirname(os.path.abspath(benchmark.path))]
    if args.predictions:
        hidden.append(os.path.dirname(os.path.abspath(args.predictions)))
    if args.out:
        hidden.append(args.out)
    preload = SOLVER_MODULES.get(form)  # the form's solver only: every preloaded library slows each fork
    with Sandbox(limits, isolation=args.isolation, hide=hidden, workers=args.workers, preload=preload) as sandbox:
        if sandbox.isolation == "process":
            notes.append(
                "sandbox isolation 'process': limits and an audit-hook guard only, not a boundary against deliberately hostile code"
            )
        result = evaluate(
            benchmark,
            client,
            sandbox,
            form=form,
            samples=samples,
            out_dir=args.out,
            workers=args.workers,
            limit=args.limit,
            progress=not args.no_progress,
        )
        report = build_report(
            result, Rule(args.rule), ks=ks, isolation=sandbox.isolation, cgroup=sandbox.cgroup, notes=notes
        )
    client.close()
    if args.out:
        written = write_report(args.out, report)
        if written.name != "report.json":
            print(
                f"trex eval: {args.out}/report.json holds a report of other settings and is kept; this one is {written}",
                file=sys.stderr,
            )
    if args.json:
        json.dump(report.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(report.to_markdown())
    return 0
