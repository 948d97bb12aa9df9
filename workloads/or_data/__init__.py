"""OR training data: solver-verified synthetic optimization problems as SFT samples and CPT
documents, with DTA-style teacher selection.

    trex data synth --n 10000 --out runs/ordata --seed 0 --workers 2

    from trex.workloads.or_data.config import SynthConfig
    from trex.workloads.or_data.decontamination import packaged_index
    from trex.workloads.or_data.synthesis import synthesize
    result = synthesize(SynthConfig(seed=0), "runs/ordata", 10_000, workers=2, bench_dir=packaged_index())

Modules, in the order data flows (task categories with examples: `TASKS.md` next to this file):

| module | what it is |
| --- | --- |
| `families/` | 13 problem families, one module each, registered in `families/__init__.py`; each generates randomized instance data and writes it four independent ways |
| `linear_model` | the flat MILP (`LinearModel`) a family expands into, with LP-identifier names by constraint family |
| `solve` | SCIP in-process; LP files read back by SCIP and by HiGHS |
| `certificates` | checks that do not trust the solver: solution re-evaluation, LP duality, Farkas, improving rays |
| `lp_format`, `math_model`, `program` | the LP file writer; the markdown/LaTeX model and its structure check; the pyscipopt program layout |
| `phrasing`, `variety` | statement building blocks (presentation, money, distractors); measured paraphrase variety |
| `program_runner`, `outcome` | programs run in the sandbox (`trex.workloads.sandbox`), LP files solved, outcomes read and compared |
| `verify` | every check of one instance, in order: structure, solve, solution, certificate, LP x2, program |
| `bugs`, `tasks` | buggy programs that demonstrably fail; the four task categories and their reference answers |
| `style`, `teachers`, `agreement`, `rewrite`, `judge`, `selection`, `dta` | DTA Phase I (teacher ensemble) and Phase II (rewrite, agreement, reflection judge, signal-aware selection) |
| `records`, `documents` | the `sft.jsonl` record and its schema check; `cpt.jsonl` documents |
| `seeds`, `config`, `pipeline` | deterministic random streams; the run's configuration; index -> result |
| `shards`, `merge`, `decontamination`, `dedup` | resumable shard files; the in-order merge with benchmark n-gram decontamination and exact/near deduplication |
| `synthesis`, `stats`, `reverify` | the whole run with a process pool; the statistics report; re-verification from the files alone |
"""
