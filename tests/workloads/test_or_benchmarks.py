"""Benchmark loading: the public sets by name, any question/answer file, and errors that say where."""

from __future__ import annotations

import json

import pytest
from workload_helpers import DATA_DIR, requires_data

from trex.workloads.or_eval import FieldNames, NoSolution, Objective, Quantities, load_benchmark
from trex.workloads.or_eval.benchmarks import file_sha256
from trex.workloads.or_eval.errors import DataFormatError, UnknownBenchmarkError
from trex.workloads.or_eval.jsonio import JsonlLog, read_records


@requires_data
@pytest.mark.parametrize(
    "name, size, answer_kinds",
    [
        ("nl4opt", 245, {Objective, NoSolution}),
        ("mamo_easylp", 652, {Objective}),
        ("MAMO-ComplexLP", 211, {Objective}),
        ("optmath", 166, {Objective}),
        ("optibench", 605, {Quantities}),
    ],
)
def test_public_benchmarks_load_by_name(name, size, answer_kinds):
    benchmark = load_benchmark(name, data_dir=DATA_DIR)
    assert len(benchmark) == size
    assert {type(item.answer) for item in benchmark.items} == answer_kinds
    assert benchmark.sha256 == file_sha256(benchmark.path)
    assert benchmark.version == f"sha256:{benchmark.sha256[:16]}"


@requires_data
def test_no_best_solution_ground_truths_are_no_solution():
    benchmark = load_benchmark("nl4opt", data_dir=DATA_DIR)
    raw = [json.loads(line) for line in (DATA_DIR / "NL4OPT.json").read_text().splitlines()]
    assert sum(record["en_answer"] == "No Best Solution" for record in raw) == 17
    assert sum(isinstance(item.answer, NoSolution) for item in benchmark.items) == 17


@requires_data
def test_optibench_keeps_named_quantities_ids_and_categories():
    benchmark = load_benchmark("optibench", data_dir=DATA_DIR)
    first = benchmark.items[0]
    assert first.answer == Quantities((("The maximum profit you can get", 3600.0),))
    assert first.category == "linear-notable"
    assert {item.category for item in benchmark.items} == {
        "linear-notable",
        "nonlinear-notable",
        "linear-table",
        "nonlinear-table",
    }


def test_jsonl_and_json_array_files_give_the_same_items_with_line_numbers(tmp_path):
    records = [{"question": "q1", "answer": "1.5"}, {"question": "q2", "answer": 2}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (tmp_path / "b.json").write_text(json.dumps(records, indent=4))
    lines = {name: [line for line, _ in read_records(tmp_path / name)] for name in ("a.jsonl", "b.json")}
    assert lines == {"a.jsonl": [1, 2], "b.json": [2, 6]}
    a, b = load_benchmark(tmp_path / "a.jsonl"), load_benchmark(tmp_path / "b.json")
    assert [(i.question, i.answer) for i in a.items] == [(i.question, i.answer) for i in b.items]
    assert a.name == "a" and a.sha256 != b.sha256


def test_bad_answer_names_file_line_and_field(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text('{"en_question": "q", "en_answer": "12"}\n\n{"en_question": "q2", "en_answer": "twelve"}\n')
    with pytest.raises(DataFormatError) as error:
        load_benchmark(path)
    assert str(error.value) == f"{path}:3: field 'en_answer': 'twelve' is neither a number nor 'No Best Solution'"


def test_broken_json_names_file_and_line(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text('{"question": "q", "answer": 1}\n{"question": "q2", "answer": \n')
    with pytest.raises(DataFormatError, match=rf"{path}:2: not valid JSON"):
        load_benchmark(path)
    array = tmp_path / "bench.json"
    array.write_text('[\n  {"question": "q", "answer": 1},\n  {"question": "q2" "answer": 2}\n]')
    with pytest.raises(DataFormatError, match=rf"{array}:3: not valid JSON"):
        load_benchmark(array)


def test_missing_fields_are_named_with_the_fields_found(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text('{"q": "text", "a": 1}\n')
    with pytest.raises(DataFormatError, match="no question field; expected one of en_question, question"):
        load_benchmark(path)
    item = load_benchmark(path, fields=FieldNames(question="q", answer="a")).items[0]
    assert (item.question, item.answer) == ("text", Objective(1.0))
    path.write_text('{"q": "text", "a": 1}\n{"q": "other"}\n')
    with pytest.raises(DataFormatError, match=":2: field 'a': missing"):
        load_benchmark(path, fields=FieldNames(question="q", answer="a"))


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text('{"id": 7, "question": "a", "answer": 1}\n{"id": 7, "question": "b", "answer": 2}\n')
    with pytest.raises(DataFormatError, match=":2: field 'id': id '7' repeats the record at line 1"):
        load_benchmark(path)


@pytest.mark.parametrize("bad", ["NaN", True, None, [1], "1,160"])
def test_non_numeric_answers_are_refused(tmp_path, bad):
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": bad}) + "\n")
    with pytest.raises(DataFormatError, match=":1: field 'answer'"):
        load_benchmark(path)


def test_unknown_benchmark_lists_the_known_ones(tmp_path):
    with pytest.raises(UnknownBenchmarkError, match="known: nl4opt, mamo_easylp"):
        load_benchmark("industryor", data_dir=tmp_path)
    with pytest.raises(UnknownBenchmarkError, match="does not exist; pass the file's path"):
        load_benchmark("nl4opt", data_dir=tmp_path)


def test_jsonl_log_recovers_everything_but_a_torn_last_line(tmp_path):
    path = tmp_path / "results.jsonl"
    with JsonlLog(path) as log:
        log.append({"key": "a"})
        log.append({"key": "b"})
    with open(path, "a") as file:
        file.write('{"key": "c", "trunc')  # what a kill in the middle of a write leaves
    with JsonlLog(path) as log:
        assert [record["key"] for record in log.records] == ["a", "b"]
        log.append({"key": "c"})
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_jsonl_log_refuses_a_corrupted_middle_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(DataFormatError, match=rf"{path}:2: not valid JSON"):
        JsonlLog(path)
