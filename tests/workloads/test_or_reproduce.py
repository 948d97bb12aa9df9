"""Re-executing ORLM-LLaMA-3-8B's released programs reproduces its published scores.

The programs (`to_run_script` in ORLM's executed.jsonl files) are run again in the sandbox with
coptpy; ORLM's recorded execution results are only used as the reference they must match.
Published (../shared/reference/or_benchmarks.md): NL4OPT 85.7% / 77.6%, MAMO ComplexLP
37.4% / 33.2% (lenient / strict). CI runs every 8th record; `-m slow` runs the full files.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from workload_helpers import ORLM_DIR, requires_data

from trex.workloads.or_eval import NoSolution, Objective, Rule, build_report, evaluate
from trex.workloads.or_eval.benchmarks import benchmark_from_records
from trex.workloads.or_eval.replay_client import ReplayClient
from trex.workloads.or_eval.scoring import values_match
from trex.workloads.sandbox import Limits, Sandbox

pytestmark = [
    requires_data,
    pytest.mark.skipif(
        importlib.util.find_spec("coptpy") is None, reason="ORLM's programs need coptpy (pip install coptpy==8.0.7)"
    ),
]

PUBLISHED = {  # file -> {rule: pass@1 in percent}
    "NL4OPT.executed.jsonl": {Rule.LENIENT: 85.7, Rule.MAMO: 77.6, Rule.STRICT: 77.6},
    "MAMO.ComplexLP.executed.jsonl": {Rule.LENIENT: 37.4, Rule.MAMO: 33.2, Rule.STRICT: 33.2},
}
LIMITS = Limits(wall_s=120, cpu_s=120)


def subset_file(tmp_path, name: str, every: int) -> str:
    lines = (ORLM_DIR / name).read_text(encoding="utf-8").splitlines()
    path = tmp_path / name
    path.write_text("\n".join(lines[::every]) + "\n", encoding="utf-8")
    return str(path)


def recorded_score(path: str, rule: Rule) -> float:
    """ORLM's own recorded results, scored by our rules (the reference)."""
    with open(path, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines]
    benchmark = benchmark_from_records("ref", path, enumerate(records, start=1))
    correct = 0
    for item, record in zip(benchmark.items, records, strict=True):
        recorded = record["execution_best_solution"]
        if isinstance(item.answer, NoSolution):
            correct += recorded == "No Best Solution"
        elif recorded not in (None, "No Best Solution"):
            correct += values_match(float(recorded), item.answer.value, rule)
    return 100 * correct / len(records)


def rerun(path: str, workers: int = 2):
    client = ReplayClient(path)
    with Sandbox(LIMITS, hide=[ORLM_DIR]) as sandbox:
        return evaluate(client.as_benchmark(), client, sandbox, form="orlm", workers=workers, progress=False)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_rerun_programs_agree_with_orlms_recorded_results_item_by_item(tmp_path, name):
    path = subset_file(tmp_path, name, every=8)
    run = rerun(path)
    with open(path, encoding="utf-8") as lines:
        recorded = [json.loads(line)["execution_best_solution"] for line in lines]
    agree = 0
    for index, reference in enumerate(recorded):
        result = run.results[f"{index}#0"]
        prediction = result.prediction
        if reference is None:
            agree += result.failure is not None
        elif reference == "No Best Solution":
            agree += prediction is not None and prediction.no_solution
        else:
            agree += (
                prediction is not None
                and prediction.objective is not None
                and values_match(prediction.objective, float(reference), Rule.STRICT)
            )
    assert agree >= 0.95 * len(recorded), f"{agree} of {len(recorded)} programs reproduce ORLM's recorded result"
    for rule in Rule:
        assert build_report(run, rule).pass_at_1 * 100 == pytest.approx(
            recorded_score(path, rule), abs=100 / len(recorded) + 1e-9
        )


def test_orlm_answers_are_objectives():
    """The two files hold objective answers (NL4OPT's also "No Best Solution"), as the rules assume."""
    client = ReplayClient(ORLM_DIR / "NL4OPT.executed.jsonl")
    kinds = {type(item.answer) for item in client.as_benchmark().items}
    assert kinds == {Objective, NoSolution}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_rerun_reproduces_the_published_scores(name):
    run = rerun(str(ORLM_DIR / name))
    for rule, published in PUBLISHED[name].items():
        assert build_report(run, rule).pass_at_1 * 100 == pytest.approx(published, abs=1.5), rule
