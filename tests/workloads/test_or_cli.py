"""`trex eval` on the command line: its JSON contract, its reports, and clean errors."""

from __future__ import annotations

import json
import socket
import time

import pytest

from trex.cli import main


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["eval", "--no-progress", "--isolation", "process", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def predictions(tmp_path):
    records = [
        {"question": "q0", "answer": 3, "program": "print('Optimal objective value: 3')"},
        {"question": "q1", "answer": "No Best Solution", "program": "print('Optimal objective value: infeasible')"},
        {"question": "q2", "answer": 5, "program": "print('Optimal objective value: 4')"},
        {"question": "q3", "answer": 1, "program": "raise RuntimeError('bad model')"},
    ]
    return write_jsonl(tmp_path / "predictions.jsonl", records)


def test_json_report_has_the_documented_fields(capsys, predictions):
    code, out, err = run_cli(capsys, "--client", "replay", "--predictions", predictions, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["n"], report["pass_at_1"], report["rule"]) == (4, 0.5, "strict")
    assert report["failures"] == {"runtime_error": 1}
    assert report["wrong_answer"] == 1
    assert report["programs_per_s"] > 0
    assert report["benchmark_sha256"] and report["benchmark_version"].startswith("sha256:")
    assert report["isolation"] and report["cgroup"]  # the cgroup limits in force, or why there are none


def test_markdown_report_names_rule_and_version_and_is_written_to_out(capsys, predictions, tmp_path):
    out_dir = tmp_path / "run"
    code, out, _ = run_cli(
        capsys, "--client", "replay", "--predictions", predictions, "--rule", "lenient", "--out", str(out_dir)
    )
    assert code == 0
    assert out.startswith("# predictions: pass@1 50.0% (lenient)")
    assert "sha256:" in out and "round both to integers" in out
    assert json.loads((out_dir / "report.json").read_text())["rule"] == "lenient"
    assert (out_dir / "report.md").read_text() == out
    assert len((out_dir / "results.jsonl").read_text().splitlines()) == 4


def test_malformed_benchmark_fails_with_file_line_and_field(capsys, predictions, tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"question": "q0", "answer": 3}\n{"question": "q1", "answer": "three"}\n')
    code, _, err = run_cli(capsys, "--bench", str(bench), "--client", "replay", "--predictions", predictions)
    assert code == 2
    assert (
        err.strip()
        == f"trex eval: error: {bench}:2: field 'answer': 'three' is neither a number nor 'No Best Solution'"
    )


def test_replay_needs_a_predictions_file(capsys):
    code, _, err = run_cli(capsys, "--client", "replay")
    assert code == 2 and "--client replay needs --predictions FILE" in err


def test_generating_clients_need_a_benchmark(capsys):
    code, _, err = run_cli(capsys, "--client", "openai", "--base-url", "http://127.0.0.1:9", "--model", "m")
    assert code == 2 and "needs --bench" in err


def test_unreachable_server_fails_fast_with_the_url(capsys, predictions):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    code, _, err = run_cli(
        capsys, "--bench", predictions, "--client", "openai", "--base-url", f"http://127.0.0.1:{port}", "--model", "m"
    )
    assert code == 2
    assert f"cannot reach the model server at http://127.0.0.1:{port}/v1/models" in err
    assert time.monotonic() - started < 10


def test_openai_client_end_to_end_with_pass_at_k(capsys, tmp_path, fake_server):
    bench = write_jsonl(tmp_path / "bench.jsonl", [{"id": "a", "question": "Find 6 times 7.", "answer": 42}])
    replies = iter(
        ["```python\nprint('Optimal objective value: 42')\n```", "```python\nprint('Optimal objective value: 41')\n```"]
    )
    server = fake_server(respond=lambda prompt: next(replies))
    code, out, err = run_cli(
        capsys,
        "--bench",
        bench,
        "--client",
        "openai",
        "--base-url",
        server.url,
        "--model",
        "m",
        "--samples",
        "2",
        "--k",
        "1,2",
        "--temperature",
        "0.7",
        "--concurrency",
        "1",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["pass_at"] == {"1": 0.5, "2": 1.0}
    assert "Find 6 times 7." in server.requests[0]["messages"][-1]["content"]
    assert "pyscipopt" in server.requests[0]["messages"][-1]["content"]
