"""The statistics report of a run: what was made (families, tasks, representations, statuses,
DTA signals, token lengths, the `diversity` report) and what was thrown away (verification
failures, prose-checker rejections by kind, selection drops, contamination, duplicates, prompt
skeletons over their cap).

Token lengths are counted with a local tokenizer when one is given (`--tokenizer DIR`, a
transformers tokenizer directory; nothing is downloaded); otherwise approximately, as word pieces
and punctuation marks (`\\w+|[^\\w\\s]`), which runs 10-30% below typical BPE counts on this text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from trex.workloads.or_data.cpt_separation import Separation, SeparationReport
from trex.workloads.or_data.diversity import diversity_markdown, diversity_report
from trex.workloads.or_data.diversity import prepare as diversity_prepare
from trex.workloads.or_data.merge import Merger
from trex.workloads.or_data.prose_check import KINDS as PROSE_KINDS

VERIFICATION_STAGES = ("structure", "solve", "solution", "certificate", "lp_scip", "lp_highs", "program", "error")
_PIECE = re.compile(r"\w+|[^\w\s]")


def approximate_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def token_counter(tokenizer_dir: str | None) -> tuple[Callable[[str], int], str]:
    if tokenizer_dir is None:
        return approximate_tokens, "approximate (word pieces and punctuation)"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return (lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])), f"tokenizer at {tokenizer_dir}"


def _summary(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(share: float) -> int:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    return {
        "count": len(ordered),
        "mean": round(sum(ordered) / len(ordered), 1),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": ordered[-1],
    }


def prose_rejections(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Instances the prose checker rejected, and its flags by kind (from the rejection details)."""
    details = [result.get("detail", "") for result in results if result.get("stage") == "prose"]
    kinds: Counter = Counter()
    for detail in details:
        kinds.update(kind for kind in re.findall(r"(?:^|; )(\w+): ", detail) if kind in PROSE_KINDS)
    return {
        "rejected": len(details),
        "share": round(len(details) / len(results), 4) if results else 0.0,
        "flags": dict(sorted(kinds.items())),
    }


class Tally:
    """What the report needs from each kept sample, worked out when the merger keeps it (`keep`),
    while the workers make later shards: token counts, the diversity report's per-text n-grams
    (`diversity.prepare`) and, when given a `Separation`, the CPT separation's per-text 13-grams.
    Without it the same work ran serially after the last shard (about a fifth of a 1,000-sample
    run's wall time, bench/RESULTS.md section 6); the figures are the same either way."""

    def __init__(self, count_tokens: Callable[[str], int], separation: Separation | None = None):
        self.count_tokens = count_tokens
        self.separation = separation
        self.prompt: list[int] = []
        self.answer: list[int] = []
        self.sample: list[int] = []
        self.documents: list[int] = []  # every CPT document kept by the merger, before separation
        self._counted: dict[str, int] = {}  # the system messages' counts

    def _constant_tokens(self, text: str) -> int:
        tokens = self._counted.get(text)
        if tokens is None:
            tokens = self._counted[text] = self.count_tokens(text)
        return tokens

    def keep(self, record: dict[str, Any], document: dict[str, Any] | None) -> None:
        count, messages = self.count_tokens, record["messages"]
        prompt, answer = count(messages[1]["content"]), count(messages[2]["content"])
        self.prompt.append(prompt)
        self.answer.append(answer)
        if count is approximate_tokens and len(messages) == 3:
            # `_PIECE` never matches whitespace, so the messages joined by "\n" have exactly the
            # pieces of the messages: their counts add up, and the system message (the same in
            # every sample) is counted once. A tokenizer may merge across the join: counted whole.
            self.sample.append(self._constant_tokens(messages[0]["content"]) + prompt + answer)
        else:
            self.sample.append(count("\n".join(message["content"] for message in messages)))
        diversity_prepare(record)
        if self.separation is not None:
            self.separation.add_sft(record)
        if document is not None:
            self.documents.append(count(document["text"]))
            if self.separation is not None:
                self.separation.add_cpt(document)

    def separate(self) -> tuple[list[dict[str, Any]], SeparationReport]:
        """`cpt_separation.separate` of the kept samples; afterwards `documents` counts the kept
        documents only."""
        assert self.separation is not None, "a Tally made without a Separation"
        kept, report = self.separation.finish()
        dropped = set(report.dropped_instance) | set(report.dropped_text)
        self.documents = [tokens for position, tokens in enumerate(self.documents) if position not in dropped]
        return kept, report


def build_stats(merger: Merger, count_tokens: Callable[[str], int], tokenizer_name: str) -> dict[str, Any]:
    """The report of the module docstring. Token counts come from `merger.tally` when the merger
    has one (made with the same counter), else are counted here."""
    metas = [record["meta"] for record in merger.sft]
    rejected = merger.rejected
    failed_verification = sum(rejected[stage] for stage in VERIFICATION_STAGES)
    instances = merger.seen_indices
    inputs, outputs = Counter(), Counter()
    for meta in metas:
        inputs.update(meta["representations"]["input"])
        outputs.update(meta["representations"]["output"])
    tally = merger.tally
    if tally is not None:
        prompts, answers, whole, documents = tally.prompt, tally.answer, tally.sample, tally.documents
    else:
        prompts = [count_tokens(record["messages"][1]["content"]) for record in merger.sft]
        answers = [count_tokens(record["messages"][2]["content"]) for record in merger.sft]
        whole = [count_tokens("\n".join(message["content"] for message in record["messages"])) for record in merger.sft]
        documents = [count_tokens(document["text"]) for document in merger.cpt]
    return {
        "samples": len(merger.sft),
        "cpt_documents": len(merger.cpt),
        "families": dict(sorted(Counter(meta["family"] for meta in metas).items())),
        "tasks": dict(sorted(Counter(meta["task"] for meta in metas).items())),
        "variants": dict(sorted(Counter(f"{meta['task']}/{meta['variant']}" for meta in metas).items())),
        "representations": {"input": dict(sorted(inputs.items())), "output": dict(sorted(outputs.items()))},
        "status": dict(sorted(Counter(meta["status"] for meta in metas).items())),
        "dta_signals": dict(sorted(Counter(meta["dta"]["signal"] for meta in metas).items())),
        "fallbacks": dict(sorted(Counter(meta["fallback"] for meta in metas if meta["fallback"]).items())),
        "bugs": dict(sorted(Counter(meta["bug"]["kind"] for meta in metas if meta["bug"]).items())),
        "verification": {
            "instances": instances,
            "verified": instances - failed_verification,
            "pass_share": round((instances - failed_verification) / instances, 4) if instances else None,
            "failures": {stage: rejected[stage] for stage in VERIFICATION_STAGES if rejected[stage]},
        },
        "selection_drops": rejected["selection"],
        "prose": prose_rejections(merger.results_seen),
        "diversity": diversity_report(merger.sft),
        "removed": dict(sorted(merger.removed.items())),
        "decontamination": merger.contamination.to_json(),
        "tokens": {
            "counted_with": tokenizer_name,
            "prompt": _summary(prompts),
            "answer": _summary(answers),
            "sample": _summary(whole),
            "cpt_document": _summary(documents),
        },
    }


def _counts_table(title: str, counts: dict[str, int]) -> list[str]:
    total = sum(counts.values()) or 1
    lines = [f"| {title} | count | share |", "| --- | --- | --- |"]
    lines += [f"| {name} | {count} | {count / total:.1%} |" for name, count in counts.items()]
    return [*lines, ""]


def stats_markdown(stats: dict[str, Any]) -> str:
    verification = stats["verification"]
    share = verification["pass_share"]
    lines = [
        f"# OR training data: {stats['samples']} SFT samples, {stats['cpt_documents']} CPT documents",
        "",
        f"Instances generated: {verification['instances']}; passed verification: {verification['verified']}"
        + (f" ({share:.2%})" if share is not None else ""),
        f"Verification failures by check: {verification['failures'] or 'none'}",
        f"Dropped by DTA selection: {stats['selection_drops']}; removed after generation: {stats['removed'] or 'none'}",
        f"Decontamination: {stats['decontamination']['flagged']} flagged of {stats['decontamination']['checked']} texts checked"
        + (f" (by file: {stats['decontamination']['by_file']})" if stats["decontamination"]["flagged"] else ""),
        "",
    ]
    prose = stats.get("prose")
    if prose is not None:
        lines += [
            f"Rejected by the prose checker: {prose['rejected']} ({prose['share']:.2%} of instances); flags: {prose['flags'] or 'none'}",
            "",
        ]
    lines += _counts_table("family", stats["families"])
    lines += _counts_table("task", stats["tasks"])
    lines += _counts_table("task/variant", stats["variants"])
    lines += _counts_table("input representation", stats["representations"]["input"])
    lines += _counts_table("output representation", stats["representations"]["output"])
    lines += _counts_table("status", stats["status"])
    lines += _counts_table("DTA signal", stats["dta_signals"])
    if stats["bugs"]:
        lines += _counts_table("repair bug kind", stats["bugs"])
    if stats.get("diversity"):
        lines += diversity_markdown(stats["diversity"])
    tokens = stats["tokens"]
    lines += [
        f"Token lengths ({tokens['counted_with']}):",
        "",
        "| text | mean | p50 | p90 | p99 | max |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("prompt", "answer", "sample", "cpt_document"):
        summary = tokens[name]
        if summary.get("count"):
            lines.append(
                f"| {name} | {summary['mean']} | {summary['p50']} | {summary['p90']} | {summary['p99']} | {summary['max']} |"
            )
    return "\n".join(lines).rstrip() + "\n"
