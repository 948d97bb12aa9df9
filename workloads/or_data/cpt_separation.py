"""Keeping the continued-pretraining documents apart from the SFT samples.

Each CPT document is written about its own instance (`pipeline.cpt_instance`: the same family,
another data stream, verified), never the SFT sample's. Two checks then make sure no document
teaches an SFT problem after all, decided over the finished outputs (`separate`; `Separation`
does the per-text work sample by sample while a run goes on):

| check | a CPT document is dropped when |
| --- | --- |
| instance | its LP file (whitespace-normalized digest, `lp_digest`) equals the LP file of any SFT sample (for a what-if, the base instance's and the changed one's) |
| text | it shares a word 13-gram with an SFT prompt, counting only 13-grams of prose and tables (code blocks, LP files and clock times left out) with at least three numbers of two or more digits: the instance's data, not the boilerplate of the templates (`1e-6`, `{0, 1}`, "00:00-04:00") nor two common numbers meeting by chance |

The SFT prompts are what the student is asked; a CPT document repeating one of their data
passages (the same 13 words with the same numbers) would let the model memorize an SFT problem.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trex.workloads.or_data.decontamination import DEFAULT_NGRAM, gram_digest, words


def lp_digest(lp: str) -> str:
    """A digest of an LP file with comments and whitespace normalized: the instance's identity."""
    lines = [" ".join(line.split()) for line in lp.splitlines() if line.strip() and not line.lstrip().startswith("\\")]
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()[:24]


_FENCE = re.compile(r"```.*?```", re.S)
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}\b")
DATA_NUMBERS = 3  # multi-digit numbers a 13-gram needs to count as instance data


def _numeric_grams(text: str, n: int) -> Iterable[int]:
    """13-grams of the prose and tables (code, LP files and clock times left out) that carry at
    least `DATA_NUMBERS` numbers of two or more digits. The count is a running window over the
    words, and only the grams that qualify are hashed (most prose 13-grams carry no data)."""
    tokens = words(_CLOCK.sub(" ", _FENCE.sub(" ", text)))
    data = [word.isdigit() and len(word) >= 2 for word in tokens]
    inside = sum(data[:n])
    for start in range(len(tokens) - n + 1):
        if start:
            inside += data[start + n - 1] - data[start - 1]
        if inside >= DATA_NUMBERS:
            yield gram_digest(tokens[start : start + n])


@dataclass
class SeparationReport:
    checked: int = 0
    dropped_instance: list[int] = field(default_factory=list)  # positions in the CPT list
    dropped_text: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpt_checked": self.checked,
            "dropped_same_instance": len(self.dropped_instance),
            "dropped_shared_data_ngram": len(self.dropped_text),
            "ngram": DEFAULT_NGRAM,
        }


class Separation:
    """`separate` one sample at a time, so that a run does its work while later shards are still
    being made: `add_sft` / `add_cpt` take the kept samples as the merger keeps them (each text's
    13-grams hashed then), `finish` decides once every SFT sample is known (a document may share
    data with an SFT sample kept after it). The decisions are `separate`'s exactly."""

    def __init__(self, n: int = DEFAULT_NGRAM):
        self.n = n
        self._instances: set[str] = set()
        self._sft_grams: list[np.ndarray] = []
        self._documents: list[tuple[dict[str, Any], np.ndarray]] = []

    def add_sft(self, record: dict[str, Any]) -> None:
        self._instances.add(lp_digest(record["meta"]["lp"]))
        base = (record["meta"].get("what_if") or {}).get("base_lp_digest")
        if base is not None:
            self._instances.add(base)
        self._sft_grams.append(np.fromiter(_numeric_grams(record["messages"][1]["content"], self.n), dtype=np.uint64))

    def add_cpt(self, document: dict[str, Any]) -> None:
        self._documents.append((document, np.fromiter(_numeric_grams(document["text"], self.n), dtype=np.uint64)))

    def finish(self) -> tuple[list[dict[str, Any]], SeparationReport]:
        """The kept documents (as `{"text": ...}`) and the report, as `separate` gives them."""
        index = np.unique(np.concatenate(self._sft_grams)) if self._sft_grams else np.empty(0, dtype=np.uint64)
        report = SeparationReport()
        kept: list[dict[str, Any]] = []
        for position, (document, grams) in enumerate(self._documents):
            report.checked += 1
            if document.get("lp_digest") in self._instances:
                report.dropped_instance.append(position)
                continue
            if grams.size and _any_in(grams, index):
                report.dropped_text.append(position)
                continue
            kept.append({"text": document["text"]})
        return kept, report


def _any_in(values: np.ndarray, index: np.ndarray) -> bool:
    """Whether any of `values` is in `index` (sorted, distinct): a binary search per value.
    `np.isin` would sort or hash the whole index again for every document."""
    if not index.size:
        return False
    positions = np.minimum(np.searchsorted(index, values), index.size - 1)
    return bool((index[positions] == values).any())


def separate(
    sft: list[dict[str, Any]], cpt: list[dict[str, Any]], n: int = DEFAULT_NGRAM
) -> tuple[list[dict[str, Any]], SeparationReport]:
    """The CPT documents (as `{"text": ...}`) that pass both checks of the module docstring, and
    the report. `cpt` entries carry `lp_digest` (dropped from the output)."""
    separation = Separation(n)
    for record in sft:
        separation.add_sft(record)
    for document in cpt:
        separation.add_cpt(document)
    return separation.finish()
