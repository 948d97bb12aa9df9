"""How varied generated statements are: measurable paraphrase variety, numbers set aside.

- `distinct_ngram_share`: distinct word n-grams over all n-grams in a set of texts ("distinct-n",
  Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models"),
  computed with every number replaced by one token, so varied data does not pass for varied
  wording. One template filled with fresh numbers scores near 0 on it; varied templates, names and
  presentations score higher.
- `skeleton`: a statement's first sentence with numbers and capitalized names masked: how many
  distinct openings a family produces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_WORD = re.compile(r"[a-z#]+|[^\sa-z#]")
_NAME = re.compile(r"\b[A-Z][\w&'-]*(?:\s+[A-Z0-9][\w&'-]*)*")


def masked_words(text: str) -> list[str]:
    return _WORD.findall(_NUMBER.sub("#", text).lower())


def distinct_ngram_share(texts: Iterable[str], n: int = 4) -> float:
    seen: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        words = masked_words(text)
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


def skeleton(text: str) -> str:
    first = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return _NUMBER.sub("#", _NAME.sub("NAME", first))
