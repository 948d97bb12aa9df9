"""Benchmark loaders: the public OR test sets by name, or any JSON/JSONL file with question and answer fields.

Every benchmark carries its version (the SHA-256 of the file's bytes), which goes into every
report, because cleaned and original versions of these sets circulate under the same names.

| name | file | fields |
| --- | --- | --- |
| nl4opt | NL4OPT.json (JSON lines) | en_question, en_answer |
| mamo_easylp | MAMO_EasyLP.json | en_question, en_answer |
| mamo_complexlp | MAMO_ComplexLP.json | en_question, en_answer |
| optmath_bench | OptMATH_Bench.json (JSON array) | en_question, en_answer, id |
| optibench | OptiBench.json (JSON array) | question, results (named quantities), index, type |

Names are looked up in the data directory: `data_dir=`, else `$TREX_OR_BENCH_DIR`, else
`../shared/data/or_bench` next to the repository checkout.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trex.workloads.or_eval.answers import Answer, Quantities, parse_answer
from trex.workloads.or_eval.errors import DataFormatError, UnknownBenchmarkError
from trex.workloads.or_eval.jsonio import read_records

KNOWN_BENCHMARKS: dict[str, str] = {
    "nl4opt": "NL4OPT.json",
    "mamo_easylp": "MAMO_EasyLP.json",
    "mamo_complexlp": "MAMO_ComplexLP.json",
    "optmath_bench": "OptMATH_Bench.json",
    "optibench": "OptiBench.json",
}
_ALIASES = {"optmath": "optmath_bench", "mamo_easy": "mamo_easylp", "mamo_complex": "mamo_complexlp"}

# Tried in order when the caller names no field.
QUESTION_FIELDS = ("en_question", "question", "problem", "description")
ANSWER_FIELDS = ("en_answer", "answer", "results", "ground_truth", "optimal_value", "objective_value")
ID_FIELDS = ("id", "index", "idx", "uid")
CATEGORY_FIELDS = ("type", "category")

DATA_DIR_ENV = "TREX_OR_BENCH_DIR"


@dataclass(frozen=True)
class Item:
    """One benchmark question with its ground truth."""

    id: str
    question: str
    answer: Answer
    category: str
    line: int  # where the record starts in its file


@dataclass(frozen=True)
class Benchmark:
    name: str
    path: str
    sha256: str
    items: tuple[Item, ...]

    @property
    def version(self) -> str:
        return f"sha256:{self.sha256[:16]}"

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class FieldNames:
    """Which record fields hold what; None means "detect from the first record"."""

    question: str | None = None
    answer: str | None = None
    id: str | None = None
    category: str | None = None


def default_data_dir() -> Path:
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured)
    import trex.workloads

    checkout = Path(trex.workloads.__file__).resolve().parents[1]
    return checkout.parent / "shared" / "data" / "or_bench"


def canonical_name(name: str) -> str:
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    return _ALIASES.get(key, key)


def resolve_benchmark_path(name_or_path: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> Path:
    """A file path as given, or a known benchmark's file in the data directory."""
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    key = canonical_name(str(name_or_path))
    if key not in KNOWN_BENCHMARKS:
        raise UnknownBenchmarkError(
            f"{str(name_or_path)!r} is neither a file nor a known benchmark; known: {', '.join(KNOWN_BENCHMARKS)}"
        )
    directory = Path(data_dir) if data_dir is not None else default_data_dir()
    path = directory / KNOWN_BENCHMARKS[key]
    if not path.is_file():
        raise UnknownBenchmarkError(
            f"benchmark {key} expects {path}, which does not exist; pass the file's path, "
            f"a data directory (--data-dir), or set ${DATA_DIR_ENV}"
        )
    return path


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_benchmark(
    name_or_path: str | os.PathLike,
    *,
    data_dir: str | os.PathLike | None = None,
    fields: FieldNames = FieldNames(),
) -> Benchmark:
    path = resolve_benchmark_path(name_or_path, data_dir)
    key = canonical_name(str(name_or_path))
    name = key if key in KNOWN_BENCHMARKS and not Path(name_or_path).is_file() else path.stem
    return benchmark_from_records(name, path, read_records(path), fields)


def benchmark_from_records(
    name: str, path: str | os.PathLike, records: Iterable[tuple[int, dict]], fields: FieldNames = FieldNames()
) -> Benchmark:
    """Items from `(line, record)` pairs; the first record decides fields that were not named."""
    path_text = str(path)
    items: list[Item] = []
    seen: dict[str, int] = {}
    chosen: FieldNames | None = None
    for ordinal, (line, record) in enumerate(records):
        if chosen is None:
            chosen = _choose_fields(path_text, line, record, fields)
        question = _required(path_text, line, record, chosen.question)
        if not isinstance(question, str) or not question.strip():
            raise DataFormatError(path_text, line, "empty or not a string", chosen.question)
        answer = parse_answer(_required(path_text, line, record, chosen.answer), path_text, line, chosen.answer)
        item_id = str(_required(path_text, line, record, chosen.id)) if chosen.id else str(ordinal)
        if item_id in seen:
            raise DataFormatError(
                path_text, line, f"id {item_id!r} repeats the record at line {seen[item_id]}", chosen.id
            )
        seen[item_id] = line
        category = str(record.get(chosen.category, name)) if chosen.category else name
        items.append(Item(id=item_id, question=question.strip(), answer=answer, category=category, line=line))
    if not items:
        raise DataFormatError(path_text, None, "holds no records")
    return Benchmark(name=name, path=path_text, sha256=file_sha256(path_text), items=tuple(items))


def _choose_fields(path: str, line: int, record: dict, fields: FieldNames) -> FieldNames:
    def pick(given: str | None, options: tuple[str, ...], what: str, required: bool) -> str | None:
        if given is not None:
            if given not in record:
                raise DataFormatError(
                    path, line, f"the {what} field {given!r} is missing (fields: {', '.join(record)})"
                )
            return given
        for option in options:
            if option in record:
                return option
        if required:
            raise DataFormatError(
                path, line, f"no {what} field; expected one of {', '.join(options)} (fields: {', '.join(record)})"
            )
        return None

    return FieldNames(
        question=pick(fields.question, QUESTION_FIELDS, "question", True),
        answer=pick(fields.answer, ANSWER_FIELDS, "answer", True),
        id=pick(fields.id, ID_FIELDS, "id", False),
        category=pick(fields.category, CATEGORY_FIELDS, "category", False),
    )


def _required(path: str, line: int, record: dict, field_name: str | None) -> object:
    if field_name not in record:
        raise DataFormatError(path, line, "missing", field_name)
    return record[field_name]


def has_quantities(benchmark: Benchmark) -> bool:
    return any(isinstance(item.answer, Quantities) for item in benchmark.items)
