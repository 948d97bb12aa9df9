"""OR evaluator: zero-shot pass@k of a model on OR modeling benchmarks, its code run in a sandbox.

    from trex.workloads.or_eval import Rule, build_report, evaluate, load_benchmark
    from trex.workloads.llm_clients import OpenAIClient
    from trex.workloads.sandbox import Sandbox

    benchmark = load_benchmark("nl4opt")                         # or any JSON/JSONL path
    client = OpenAIClient("http://localhost:8000", "my-model")
    with Sandbox() as sandbox:
        run = evaluate(benchmark, client, sandbox, form="pyscipopt", out_dir="runs/nl4opt")
    print(build_report(run, Rule.STRICT).to_markdown())

Modules, in the order data flows:
- `benchmarks`: loaders (NL4OPT, MAMO, OptMATH-Bench, OptiBench, any question/answer file),
  each with its file hash as version
- `clients`: `OpenAIClient` (vLLM-style servers), `clients.local.TransformersClient`
  (through `trex.compile`), `ReplayClient` (stored predictions, ORLM's executed.jsonl included)
- `prompts`: zero-shot templates per answer form; `extraction`: code, LP or answer out of text,
  and the objective out of a program's output and solver records
- `execute`: one completion -> one `SampleResult`, via `trex.workloads.sandbox`
- `scoring`: strict / mamo / lenient rules, pass@k; `runner`: the resumable pool;
  `report`: JSON and markdown per benchmark and category
"""

from trex.workloads.or_eval.answers import NoSolution, Objective, Prediction, Quantities
from trex.workloads.or_eval.benchmarks import KNOWN_BENCHMARKS, Benchmark, FieldNames, Item, load_benchmark
from trex.workloads.or_eval.report import Report, build_report, write_report
from trex.workloads.or_eval.runner import RunResult, evaluate
from trex.workloads.or_eval.scoring import Rule, is_correct, pass_at_k, values_match

__all__ = [
    "KNOWN_BENCHMARKS",
    "Benchmark",
    "FieldNames",
    "Item",
    "NoSolution",
    "Objective",
    "Prediction",
    "Quantities",
    "Report",
    "Rule",
    "RunResult",
    "build_report",
    "evaluate",
    "is_correct",
    "load_benchmark",
    "pass_at_k",
    "values_match",
    "write_report",
]
