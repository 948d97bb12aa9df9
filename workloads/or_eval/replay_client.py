"""Replay client: predictions read from a JSON/JSONL file instead of a model.

Each record holds one sample: a program to run (`to_run_script`, `program`, `code`) and/or the
model's full output (`en_math_model_coptpy_code`, `output`, `completion`, `response`,
`generation`, `text`). ORLM's released `executed.jsonl` files are read as they are: the program
is `to_run_script`, the output `en_math_model_coptpy_code`, and the question and answer are
carried in the same record (`en_question`, `en_answer`), so such a file is its own benchmark.
Its recorded execution results are ignored: programs are run again.

Records are matched to benchmark items by id when the file has an id field and otherwise by the
question text (whitespace-normalized). Several records for one item are samples 0, 1, ... in
file order (ORLM's pass@8 files hold 8 records per question).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from trex.workloads.llm_clients.base import Completion, GenerationRequest
from trex.workloads.or_eval.answers import parse_answer
from trex.workloads.or_eval.benchmarks import (
    ANSWER_FIELDS,
    ID_FIELDS,
    QUESTION_FIELDS,
    Benchmark,
    FieldNames,
    benchmark_from_records,
    file_sha256,
)
from trex.workloads.or_eval.errors import DataFormatError
from trex.workloads.or_eval.jsonio import read_records

PROGRAM_FIELDS = ("to_run_script", "program", "code")
OUTPUT_FIELDS = ("en_math_model_coptpy_code", "output", "completion", "response", "generation", "prediction", "text")
REPLAY_SOURCES = ("auto", "program", "output")


def normalize_question(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class ReplayRecord:
    line: int
    record: dict


class ReplayClient:
    """Serves stored predictions; see the module docstring for the file format."""

    persist_generations = False

    def __init__(self, path: str | Path, *, source: str = "auto", fields: FieldNames | None = None):
        if source not in REPLAY_SOURCES:
            raise ValueError(f"replay source {source!r}; valid: {', '.join(REPLAY_SOURCES)}")
        self.path = str(path)
        self.fields = fields if fields is not None else FieldNames()
        self.records = [ReplayRecord(line, record) for line, record in read_records(self.path)]
        if not self.records:
            raise DataFormatError(self.path, None, "holds no predictions")
        self.sha256 = file_sha256(self.path)
        first = self.records[0]
        self.program_field = _first_present(first.record, PROGRAM_FIELDS) if source in ("auto", "program") else None
        self.output_field = _first_present(first.record, OUTPUT_FIELDS) if source in ("auto", "output") else None
        if source == "program" and self.program_field is None:
            raise DataFormatError(
                self.path, first.line, f"no program field; expected one of {', '.join(PROGRAM_FIELDS)}"
            )
        if self.program_field is None and self.output_field is None:
            raise DataFormatError(
                self.path,
                first.line,
                f"no program or output field; expected one of {', '.join(PROGRAM_FIELDS + OUTPUT_FIELDS)} "
                f"(fields: {', '.join(first.record)})",
            )
        self._by_item: dict[str, list[ReplayRecord]] = {}
        self.unmatched: list[int] = []  # lines of records no benchmark item claimed

    def identity(self) -> dict:
        return {
            "client": "replay",
            "predictions": self.path,
            "sha256": self.sha256,
            "field": self.program_field or self.output_field,
        }

    def as_benchmark(self) -> Benchmark:
        """The file as its own benchmark (it must carry questions and answers); one item per
        distinct question, its records being that item's samples."""
        groups: dict[str, list[ReplayRecord]] = {}
        for replay in self.records:
            question = replay.record.get(self.fields.question or _first_present(replay.record, QUESTION_FIELDS) or "")
            if not isinstance(question, str):
                raise DataFormatError(self.path, replay.line, "no question to group predictions by (pass --bench)")
            groups.setdefault(normalize_question(question), []).append(replay)
        firsts = [(group[0].line, group[0].record) for group in groups.values()]
        name = Path(self.path).name.split(".executed")[0].removesuffix(".jsonl").removesuffix(".json")
        benchmark = benchmark_from_records(name, self.path, firsts, self.fields)
        self._by_item = {item.id: group for item, group in zip(benchmark.items, groups.values(), strict=True)}
        answer_field = self.fields.answer or _first_present(self.records[0].record, ANSWER_FIELDS)
        for item, group in zip(benchmark.items, groups.values(), strict=True):
            for replay in group[1:]:
                if answer_field not in replay.record:
                    raise DataFormatError(self.path, replay.line, "missing", answer_field)
                answer = parse_answer(replay.record[answer_field], self.path, replay.line, answer_field)
                if answer != item.answer:
                    raise DataFormatError(
                        self.path,
                        replay.line,
                        f"differs from the same question's answer at line {group[0].line}",
                        answer_field,
                    )
        return benchmark

    def match(self, benchmark: Benchmark) -> None:
        """Assign the file's records to `benchmark`'s items (by id, else by question text)."""
        id_field = self.fields.id or _first_present(self.records[0].record, ID_FIELDS)
        index: dict[str, str] = {}
        if id_field is not None:
            index = {item.id: item.id for item in benchmark.items}
        questions = {normalize_question(item.question): item.id for item in benchmark.items}
        self._by_item, self.unmatched = {}, []
        for replay in self.records:
            item_id = None
            if id_field is not None and id_field in replay.record:
                item_id = index.get(str(replay.record[id_field]))
            if item_id is None:
                question = replay.record.get(
                    self.fields.question or _first_present(replay.record, QUESTION_FIELDS) or ""
                )
                if isinstance(question, str):
                    item_id = questions.get(normalize_question(question))
            if item_id is None:
                self.unmatched.append(replay.line)
            else:
                self._by_item.setdefault(item_id, []).append(replay)

    def samples_per_item(self) -> int:
        return max((len(group) for group in self._by_item.values()), default=1)

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Completion]:
        for request in requests:
            group = self._by_item.get(request.item.id, [])
            if request.sample >= len(group):
                yield Completion(key=request.key, text=None, origin="replay:missing")
                continue
            replay = group[request.sample]
            yield self._completion(request.key, replay)

    def _completion(self, key: str, replay: ReplayRecord) -> Completion:
        program = replay.record.get(self.program_field) if self.program_field else None
        output = replay.record.get(self.output_field) if self.output_field else None
        for field_name, value in ((self.program_field, program), (self.output_field, output)):
            if value is not None and not isinstance(value, str):
                raise DataFormatError(
                    self.path, replay.line, f"expected text, found {type(value).__name__}", field_name
                )
        if isinstance(program, str) and program.strip():
            return Completion(key=key, text=output, program=program, origin=f"replay:{self.program_field}")
        return Completion(key=key, text=output or "", origin=f"replay:{self.output_field or self.program_field}")

    def close(self) -> None:
        pass


def _first_present(record: dict, options: tuple[str, ...]) -> str | None:
    return next((option for option in options if option in record), None)
