"""Decontamination against the OR benchmarks: word n-gram overlap with every benchmark file.

Every JSON or JSON-lines file under the benchmark directory (NL4OPT, MAMO, OptMATH-Bench,
OptiBench, ORLM's prediction files: questions, answers and the programs models wrote) is read;
every string field with at least `n` words contributes its word n-grams. A generated text that
shares any n-gram with that index is contaminated. n = 13 follows GPT-3's contamination analysis
(Brown et al. 2020, appendix C); shorter n catches more paraphrase-level overlap and more
coincidence (boilerplate such as "how many units of each product should be produced").

Words are lowercase alphanumeric runs, so punctuation, case and spacing do not hide an overlap.
N-grams are stored as 8-byte BLAKE2b digests (deterministic across processes).

The package ships the index of the five benchmark files' questions (`data/benchmark_13grams.npz`:
digests and where each first occurs, no benchmark text), so decontamination works from any
directory and without the benchmark files; `--bench-dir` indexes files of your own instead.
Rebuild it after the benchmarks change: `python -m trex.workloads.or_data.decontamination DIR`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path

from trex.workloads.or_eval.jsonio import read_records

DEFAULT_NGRAM = 13
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def gram_digest(gram: Sequence[str]) -> int:
    """The 8-byte BLAKE2b digest of an n-gram (its words joined by spaces): the index's key."""
    return int.from_bytes(blake2b(" ".join(gram).encode(), digest_size=8).digest(), "big")


def ngram_digests(text: str, n: int) -> Iterator[tuple[int, tuple[str, ...]]]:
    tokens = words(text)
    for start in range(len(tokens) - n + 1):
        gram = tuple(tokens[start : start + n])
        yield gram_digest(gram), gram


@dataclass(frozen=True)
class Source:
    file: str  # path relative to the benchmark directory
    line: int
    field: str


@dataclass(frozen=True)
class Match:
    ngram: str
    source: Source


@dataclass
class BenchmarkIndex:
    """Word n-grams of every benchmark text, each with the first place it occurs."""

    n: int = DEFAULT_NGRAM
    root: str = ""
    grams: dict[int, Source] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)  # file -> texts indexed

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, n: int = DEFAULT_NGRAM) -> BenchmarkIndex:
        """The index of every benchmark file under `directory` (or a saved index file, `.npz`)."""
        root = Path(directory)
        if root.is_file() and root.suffix == ".npz":
            return cls.load(root, n)
        if not root.is_dir():
            from trex.errors import TrexError

            raise TrexError(
                f"benchmark directory {root} does not exist; pass --bench-dir (the OR benchmarks, e.g. ../shared/data/or_bench)"
            )
        index = cls(n=n, root=str(root))
        paths = sorted(path for path in root.rglob("*") if path.is_file() and path.suffix in (".json", ".jsonl"))
        if not paths:
            from trex.errors import TrexError

            raise TrexError(f"no .json or .jsonl files under {root}; nothing to decontaminate against")
        for path in paths:
            index.add_file(path)
        return index

    def add_file(self, path: Path) -> None:
        relative = str(path.relative_to(self.root)) if self.root else str(path)
        texts = 0
        for line, record in read_records(path):
            for name, text in _strings(record):
                if len(words(text)) < self.n:
                    continue
                texts += 1
                source = Source(relative, line, name)
                for digest, _ in ngram_digests(text, self.n):
                    self.grams.setdefault(digest, source)
        self.files[relative] = texts

    def matches(self, text: str, limit: int = 5) -> list[Match]:
        found = []
        for digest, gram in ngram_digests(text, self.n):
            source = self.grams.get(digest)
            if source is not None:
                found.append(Match(" ".join(gram), source))
                if len(found) >= limit:
                    break
        return found

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index (digests and their first sources; no text) as a compressed numpy archive."""
        import numpy as np

        sources = sorted(set(self.grams.values()), key=lambda s: (s.file, s.line, s.field))
        number = {source: i for i, source in enumerate(sources)}
        ordered = sorted(self.grams.items(), key=lambda item: (number[item[1]], item[0]))
        digests = np.array([d for d, _ in ordered], dtype=np.uint64)
        counts = np.bincount(np.array([number[s] for _, s in ordered], dtype=np.int64), minlength=len(sources))
        table = json.dumps({"n": self.n, "files": self.files, "sources": [[s.file, s.line, s.field] for s in sources]})
        path = Path(path)
        np.savez_compressed(path, digests=digests, counts=counts, table=np.frombuffer(table.encode(), dtype=np.uint8))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, n: int = DEFAULT_NGRAM) -> BenchmarkIndex:
        import numpy as np

        from trex.errors import TrexError

        with np.load(path) as archive:
            table = json.loads(archive["table"].tobytes().decode())
            digests, counts = archive["digests"].tolist(), archive["counts"].tolist()
        if table["n"] != n:
            raise TrexError(
                f"the benchmark index {path} holds {table['n']}-grams, and {n}-grams were asked for; index the benchmark files "
                f"themselves for another n (--bench-dir DIR)"
            )
        index = cls(n=n, root=str(path), files=dict(table["files"]))
        position = 0
        for (file, line, name), count in zip(table["sources"], counts):
            source = Source(file, line, name)
            for digest in digests[position : position + count]:
                index.grams[digest] = source
            position += count
        return index

    def fingerprint(self) -> str:
        """Identifies the index (files, sizes, n) for the run manifest."""
        payload = json.dumps({"n": self.n, "files": self.files, "grams": len(self.grams)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _strings(record: object, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(record, str):
        yield prefix or "text", record
    elif isinstance(record, dict):
        for key, value in record.items():
            yield from _strings(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(record, list):
        for position, value in enumerate(record):
            yield from _strings(value, f"{prefix}[{position}]")


@dataclass
class ContaminationReport:
    """What decontamination found: flagged samples per benchmark file, and examples."""

    checked: int = 0
    flagged: int = 0
    by_file: Counter = field(default_factory=Counter)
    ngrams: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)

    def add(self, sample_id: str, kind: str, found: list[Match]) -> None:
        self.checked += 1
        if not found:
            return
        self.flagged += 1
        for match in found:
            self.by_file[match.source.file] += 1
            self.ngrams[match.ngram] += 1
        if len(self.examples) < 20:
            first = found[0]
            self.examples.append(
                {
                    "id": sample_id,
                    "output": kind,
                    "ngram": first.ngram,
                    "file": first.source.file,
                    "line": first.source.line,
                    "field": first.source.field,
                }
            )

    def to_json(self) -> dict:
        return {
            "checked": self.checked,
            "flagged": self.flagged,
            "by_file": dict(self.by_file.most_common()),
            "top_ngrams": dict(self.ngrams.most_common(20)),
            "examples": self.examples,
        }


def packaged_index() -> Path:
    """The benchmark index shipped with trex (see the module docstring)."""
    return Path(__file__).parent / "data" / f"benchmark_{DEFAULT_NGRAM}grams.npz"


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m trex.workloads.or_data.decontamination BENCHMARK_DIR  (writes the packaged index)")
    source_dir = Path(sys.argv[1])
    files = sorted(p for p in source_dir.glob("*.json"))  # the benchmark files themselves (not prediction files)
    built = BenchmarkIndex(n=DEFAULT_NGRAM, root=str(source_dir))
    for file in files:
        built.add_file(file)
    packaged_index().parent.mkdir(exist_ok=True)
    print(f"{built.save(packaged_index())}: {len(built.grams)} {DEFAULT_NGRAM}-grams of {len(files)} files")
