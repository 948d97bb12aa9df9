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
| `families/` | 18 problem families (backlog planning, piecewise-linear purchasing, multi-commodity network design and capacitated vehicle routing among them), one module each, registered in `families/__init__.py`; each generates randomized instance data and writes it four independent ways |
| `linear_model` | the flat MILP (`LinearModel`) a family expands into, with LP-identifier names by constraint family |
| `solve` | SCIP in-process; LP files read back by SCIP and by HiGHS |
| `certificates` | checks that do not trust the solver: solution re-evaluation, LP duality, Farkas, improving rays |
| `lp_format`, `math_model`, `program` | the LP file writer; the markdown/LaTeX model and its structure check; the pyscipopt program layout |
| `phrasing`, `variety` | statement building blocks (presentation, money, distractors); measured paraphrase variety |
| `prose`, `prose_check` | agreement-correct English (inflect: plurals, articles, verb forms, proper names); the prose checker that rejects and counts template seams |
| `code_style`, `solver_libraries` | equivalent program styles (import, model name, report) and solver libraries (pyscipopt, PuLP, Pyomo, coptpy: a call-by-call translation of the pyscipopt layout), chosen per instance and verified like the original |
| `wording` | answer framing sentences as small grammars of independent parts (`realize`), so frames do not repeat verbatim |
| `iis`, `explain` | irreducible infeasible subsets by the deletion filter; IIS rows, binding rows and names in words |
| `diversity` | the diversity report: skeletons, masked 5-gram overlap within family, code templates and styles, sizes |
| `program_runner`, `outcome` | programs run in the sandbox (`trex.workloads.sandbox`), LP files solved, outcomes read and compared |
| `verify` | every check of one instance, in order: structure, solve, solution, certificate, LP x2, program |
| `bugs`, `tasks` | buggy programs (translation and modelling mistakes) that demonstrably fail; the four task categories and their reference answers (reasons per constraint, decisions with units, IIS, what-if plans and reasons) |
| `style`, `teachers`, `agreement`, `rewrite`, `judge`, `selection`, `dta` | DTA Phase I (teacher ensemble) and Phase II (rewrite, agreement, reflection judge, signal-aware selection) |
| `records`, `documents`, `cpt_separation` | the `sft.jsonl` record and its schema check; `cpt.jsonl` documents (worked cases and conceptual notes, each about a separate verified instance), dropped when they share an SFT instance or data 13-gram |
| `seeds`, `config`, `pipeline` | deterministic random streams; the run's configuration; index -> result |
| `shards`, `merge`, `decontamination`, `dedup` | resumable shard files; the in-order merge with benchmark n-gram decontamination and exact/near deduplication |
| `synthesis`, `stats`, `reverify` | the whole run with a process pool; the statistics report; re-verification from the files alone |
"""
