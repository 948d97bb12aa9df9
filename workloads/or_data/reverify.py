"""Re-verifying emitted samples from the files alone (`trex data verify DIR`).

For every record of `sft.jsonl`: the schema holds (`records.validate_sft_record`); `meta.program`
runs in the sandbox to `meta.status` / `meta.objective`; `meta.lp` re-solves to the same outcome
with SCIP and with HiGHS; the assistant's final line states that outcome; and the program or LP
file inside the assistant's answer (when the task has one) reaches it too. Nothing from the run
that made the data is trusted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trex.workloads.or_data.outcome import Outcome, outcome_from_text
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.records import validate_sft_record
from trex.workloads.or_data.solve import solve_lp_text_highs
from trex.workloads.or_eval.extraction import extract_code, extract_lp


@dataclass
class ReverifyReport:
    checked: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict:
        return {"checked": self.checked, "failed": len(self.failures), "failures": self.failures[:50]}


def reverify_record(record: dict[str, Any], runner: ProgramRunner) -> list[str]:
    """What does not hold for one record (empty when everything does)."""
    problems = validate_sft_record(record)
    if problems:
        return problems
    meta = record["meta"]
    truth = Outcome(meta["status"], meta["objective"])
    run = runner.run(meta["program"])
    if run.outcome is None or not run.outcome.matches(truth):
        problems.append(
            f"meta.program reaches {run.outcome.text() if run.outcome else run.failure}, meta says {truth.text()}"
        )
    scip = runner.solve_lp(meta["lp"])
    if scip.outcome is None or not scip.outcome.matches(truth):
        problems.append(
            f"meta.lp re-solves (SCIP) to {scip.outcome.text() if scip.outcome else scip.failure}, meta says {truth.text()}"
        )
    highs = solve_lp_text_highs(meta["lp"])
    if not Outcome(highs.status, highs.objective).matches(truth):
        problems.append(f"meta.lp re-solves (HiGHS) to {highs.status} {highs.objective!r}, meta says {truth.text()}")
    answer = record["messages"][2]["content"]
    stated = outcome_from_text(answer)
    if stated is None or not stated.matches(truth):
        problems.append(f"the answer states {stated.text() if stated else 'nothing'}, meta says {truth.text()}")
    if meta["variant"] == "model":
        lp = extract_lp(answer)
        reached = runner.solve_lp(lp) if lp else None
    else:
        program = extract_code(answer)
        reached = runner.run(program) if program else None
    if reached is None:
        problems.append("the answer holds no program or LP file to re-solve")
    elif reached.outcome is None or not reached.outcome.matches(truth):
        problems.append(
            f"the answer's own {'LP file' if meta['variant'] == 'model' else 'program'} reaches {reached.outcome.text() if reached.outcome else reached.failure}, meta says {truth.text()}"
        )
    return problems


def reverify(records: Iterable[dict[str, Any]], runner: ProgramRunner, *, progress=None) -> ReverifyReport:
    report = ReverifyReport()
    for record in records:
        report.checked += 1
        problems = reverify_record(record, runner)
        if problems:
            meta = record.get("meta", {}) if isinstance(record, dict) else {}
            report.failures.append({"id": meta.get("id"), "problems": problems})
        if progress is not None:
            progress()
    return report
