"""Scoring a run under a rule, overall and per category, as JSON and markdown.

A report always names the rule, the benchmark file and its version (SHA-256), the answer form
and the client, because each of them moves the numbers.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trex.workloads.llm_clients.base import sample_key
from trex.workloads.or_eval.benchmarks import Item
from trex.workloads.or_eval.runner import RunResult
from trex.workloads.or_eval.scoring import Rule, is_correct, pass_at_k

WRONG_ANSWER = "wrong_answer"


@dataclass(frozen=True)
class GroupScore:
    """Scores of one group of items (the whole benchmark or one category)."""

    name: str
    n: int  # items with at least one finished sample
    samples: int  # finished samples
    correct: int  # correct samples
    pass_at: dict[str, float]  # "1" -> pass@1, "8" -> pass@8, ...


@dataclass(frozen=True)
class Report:
    benchmark: str
    benchmark_path: str
    benchmark_version: str
    benchmark_sha256: str
    rule: str
    rule_description: str
    form: str
    client: dict
    n: int
    items_total: int
    samples_per_item: int
    complete: bool
    pass_at_1: float
    pass_at: dict[str, float]
    correct: int
    wrong_answer: int
    failures: dict[str, int]
    prediction_sources: dict[str, int]
    categories: list[GroupScore]
    programs_executed: int
    programs_per_s: float | None
    execution_wall_s: float
    isolation: str = ""
    cgroup: str = ""  # the sandbox's cgroup limits: what was enforced, and why the rest was not
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        cell = _cell
        lines = [
            f"# {self.benchmark}: pass@1 {100 * self.pass_at_1:.1f}% ({self.rule})",
            "",
            "| | |",
            "| --- | --- |",
            f"| benchmark | `{cell(self.benchmark_path)}` ({self.benchmark_version}) |",
            f"| rule | {self.rule}: {cell(self.rule_description)} |",
            f"| answer form | {self.form} |",
            f"| client | {cell(_describe(self.client))} |",
            f"| items | {self.n} of {self.items_total}{'' if self.complete else ' (incomplete run)'}, {self.samples_per_item} sample(s) each |",
            f"| correct samples | {self.correct} |",
            f"| wrong answers | {self.wrong_answer} |",
            f"| programs executed | {self.programs_executed} in {self.execution_wall_s:.1f} s"
            + (f" ({self.programs_per_s:.2f} programs/s)" if self.programs_per_s else "")
            + (f", sandbox isolation `{self.isolation}`" if self.isolation else "")
            + " |",
            *([f"| cgroup limits | {cell(self.cgroup)} |"] if self.cgroup else []),
            "",
            "| pass@k | score |",
            "| --- | --- |",
            *[f"| pass@{k} | {100 * v:.1f}% |" for k, v in self.pass_at.items()],
        ]
        if self.failures:
            lines += ["", "| failure | samples |", "| --- | --- |"]
            lines += [f"| {kind} | {count} |" for kind, count in sorted(self.failures.items(), key=lambda kv: -kv[1])]
        if self.prediction_sources:
            lines += ["", "| answer read from | samples |", "| --- | --- |"]
            lines += [f"| {source} | {count} |" for source, count in sorted(self.prediction_sources.items())]
        if len(self.categories) > 1:
            lines += ["", "| category | items | pass@1 |", "| --- | --- | --- |"]
            lines += [f"| {cell(c.name)} | {c.n} | {100 * c.pass_at['1']:.1f}% |" for c in self.categories]
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text that cannot break a markdown table row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _describe(client: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in client.items() if value is not None)


def build_report(
    run: RunResult,
    rule: Rule,
    *,
    ks: tuple[int, ...] = (1,),
    isolation: str = "",
    cgroup: str = "",
    notes: list[str] | None = None,
) -> Report:
    """Score `run` under `rule`; pass@k for each k in `ks` that the sample count allows."""
    per_item: dict[str, tuple[int, int]] = {}
    failures: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    wrong = 0
    for item in run.items:
        finished = correct = 0
        for j in range(run.samples):
            result = run.results.get(sample_key(item.id, j))
            if result is None:
                continue
            finished += 1
            if result.failure is not None:
                failures[result.failure] += 1
            elif result.prediction is not None and is_correct(result.prediction, item.answer, rule):
                correct += 1
                sources[result.prediction.source] += 1
            else:
                wrong += 1
                if result.prediction is not None:
                    sources[result.prediction.source] += 1
        if finished:
            per_item[item.id] = (finished, correct)
    valid_ks = tuple(k for k in sorted(set(ks) | {1}) if k <= run.samples)
    overall = _group("all", run.items, per_item, valid_ks)
    categories: dict[str, list[Item]] = {}
    for item in run.items:
        categories.setdefault(item.category, []).append(item)
    return Report(
        benchmark=run.benchmark.name,
        benchmark_path=run.benchmark.path,
        benchmark_version=run.benchmark.version,
        benchmark_sha256=run.benchmark.sha256,
        rule=rule.value,
        rule_description=rule.description,
        form=run.form,
        client=run.client,
        n=overall.n,
        items_total=len(run.items),
        samples_per_item=run.samples,
        complete=overall.samples == len(run.items) * run.samples,
        pass_at_1=overall.pass_at["1"],
        pass_at=overall.pass_at,
        correct=overall.correct,
        wrong_answer=wrong,
        failures=dict(sorted(failures.items())),
        prediction_sources=dict(sorted(sources.items())),
        categories=[_group(name, members, per_item, valid_ks) for name, members in sorted(categories.items())],
        programs_executed=run.programs_executed,
        programs_per_s=None if run.programs_per_s is None else round(run.programs_per_s, 3),
        execution_wall_s=round(run.execution_wall_s, 3),
        isolation=isolation,
        cgroup=cgroup,
        notes=list(notes or []),
    )


def _group(
    name: str, items: tuple[Item, ...] | list[Item], per_item: dict[str, tuple[int, int]], ks: tuple[int, ...]
) -> GroupScore:
    scored = [per_item[item.id] for item in items if item.id in per_item]
    pass_at = {}
    for k in ks:
        eligible = [(n, c) for n, c in scored if n >= k]
        pass_at[str(k)] = sum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible) if eligible else 0.0
    return GroupScore(
        name=name,
        n=len(scored),
        samples=sum(n for n, _ in scored),
        correct=sum(c for _, c in scored),
        pass_at=pass_at,
    )


# What makes two reports of one output directory the same report (re-running with them rewrites it).
REPORT_SETTINGS = ("benchmark_sha256", "rule", "form", "samples_per_item", "items_total", "pass_at")


def _settings(data: dict) -> dict:
    return {key: (sorted(data[key]) if key == "pass_at" else data.get(key)) for key in REPORT_SETTINGS}


def _slug(report: Report) -> str:
    ks = "-".join(sorted(report.pass_at, key=int))
    return f"{report.rule}.{report.form}.items{report.items_total}.samples{report.samples_per_item}.k{ks}"


def write_report(out_dir: str | os.PathLike, report: Report) -> Path:
    """Write `report.json` and `report.md`; return the JSON's path.

    A report of other settings already there (another rule, item limit, k, form or benchmark) is
    never overwritten: this one is written alongside as `report.<settings>.json/.md`."""
    directory = Path(out_dir)
    name = "report"
    existing = directory / "report.json"
    if existing.exists():
        try:
            previous = json.loads(existing.read_text(encoding="utf-8"))
        except ValueError:
            previous = None
        if not isinstance(previous, dict) or _settings(previous) != _settings(report.to_json()):
            name = f"report.{_slug(report)}"
    (directory / f"{name}.json").write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    (directory / f"{name}.md").write_text(report.to_markdown(), encoding="utf-8")
    return directory / f"{name}.json"
