"""Merging shard results into the outputs, in index order: decontaminate, deduplicate, stop at n.

The merger sees every emitted sample in index order and keeps it unless
- its SFT text (prompt and answer) or its CPT document shares an n-gram with a benchmark
  (`decontamination`),
- its SFT text or CPT document is an exact duplicate of a kept one, or
- its prompt (the problem as asked) or its CPT document is a near duplicate of a kept one
  (`dedup`), or
- its prompt skeleton (`diversity.skeleton`: first and last sentence, masked) has been used
  more than `skeleton_share` of its family's kept samples (at least 3 uses are always allowed),
  so no template frame dominates a family.
It stops after `n` kept samples. Order and rules fix the output completely, whichever worker
finished which shard first.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trex.workloads.or_data.decontamination import BenchmarkIndex, ContaminationReport
from trex.workloads.or_data.dedup import NearDuplicateIndex, exact_key, minhash
from trex.workloads.or_data.diversity import skeleton


@dataclass
class Merger:
    n: int
    benchmarks: BenchmarkIndex | None
    near_threshold: float = 0.8
    skeleton_share: float = 0.1
    sft: list[dict[str, Any]] = field(default_factory=list)
    cpt: list[dict[str, Any]] = field(default_factory=list)
    seen_indices: int = 0
    generated: int = 0  # emitted by the pipeline (before decontamination and dedup)
    removed: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)  # pipeline rejections by stage
    contamination: ContaminationReport = field(default_factory=ContaminationReport)
    results_seen: list[dict[str, Any]] = field(default_factory=list)
    # `stats.Tally`: told of every kept sample, so the report's per-text work is done during the run
    tally: Any = None

    def __post_init__(self) -> None:
        self._exact: set[str] = set()
        self._near_prompt = NearDuplicateIndex(self.near_threshold)
        self._near_cpt = NearDuplicateIndex(self.near_threshold)
        self._skeletons: Counter = Counter()
        self._family_kept: Counter = Counter()

    @property
    def full(self) -> bool:
        return len(self.sft) >= self.n

    def feed(self, results: list[dict[str, Any]]) -> None:
        """Consume one shard's results (shards must come in order)."""
        for result in results:
            if self.full:
                return
            self.seen_indices += 1
            self.results_seen.append({key: value for key, value in result.items() if key not in ("sft", "cpt")})
            if result["result"] != "emitted":
                self.rejected[result["stage"]] += 1
                continue
            self.generated += 1
            reason = self._reason_to_remove(result)
            if reason:
                self.removed[reason] += 1
                self.results_seen[-1]["removed"] = reason
                continue
            self.sft.append(result["sft"])
            if result["cpt"] is not None:  # None: no separate CPT instance verified for this index
                self.cpt.append(result["cpt"])
            if self.tally is not None:
                self.tally.keep(result["sft"], result["cpt"])

    def _reason_to_remove(self, result: dict[str, Any]) -> str:
        record, document = result["sft"], (result["cpt"] or {}).get("text", "")
        sample = record["meta"]["id"]
        messages = record["messages"]
        prompt, answer = messages[1]["content"], messages[2]["content"]
        if self.benchmarks is not None:
            found_sft = self.benchmarks.matches(f"{prompt}\n{answer}")
            found_cpt = self.benchmarks.matches(document)
            self.contamination.add(sample, "sft", found_sft)
            self.contamination.add(sample, "cpt", found_cpt)
            if found_sft or found_cpt:
                return "contaminated"
        keys = (exact_key(f"{prompt}\n{answer}"),) + (("cpt:" + exact_key(document),) if document else ())
        if any(key in self._exact for key in keys):
            return "exact_duplicate"
        family = record["meta"]["family"]
        frame = (family, skeleton(prompt))
        if self._skeletons[frame] >= max(3, math.ceil(self.skeleton_share * self._family_kept[family])):
            return "skeleton_cap"
        prompt_signature, cpt_signature = minhash(prompt), minhash(document or prompt)
        if self._near_prompt.find(prompt_signature) or (document and self._near_cpt.find(cpt_signature)):
            return "near_duplicate"
        self._exact.update(keys)
        self._skeletons[frame] += 1
        self._family_kept[family] += 1
        self._near_prompt.add(sample, prompt_signature)
        if document:
            self._near_cpt.add(sample, cpt_signature)
        return ""
