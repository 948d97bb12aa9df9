"""The evaluation run: hostile programs do not stop it, results survive kills, re-runs resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from workload_helpers import CPU_LOOP_LIMITS, FAST_LIMITS

from trex.workloads.llm_clients import OpenAIClient
from trex.workloads.or_eval import Rule, build_report, evaluate
from trex.workloads.or_eval.errors import ClientError, RunStateError
from trex.workloads.or_eval.replay_client import ReplayClient
from trex.workloads.sandbox import Sandbox

HOSTILE = {
    "loop": ("while True:\n    pass", "cpu_limit"),
    "fork": ("import os\nwhile True:\n    os.fork()", "process_limit"),
    "memory": ("x = bytearray(50 * 1024**3)", "memory_limit"),
    "write": ("open('/tmp/trex-runner-pwned', 'w').write('x')", "file_denied"),
    "network": ("import socket\nsocket.create_connection(('10.1.2.3', 80), timeout=2)", "network_denied"),
    "read": ("print(open({repo!r} + '/setup.py').read())", "file_denied"),
    "kill": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)", "signal_denied"),
}


def replay_file(path, programs: list[tuple[str, object]]) -> str:
    """A predictions file that is its own benchmark: question i, answer, program."""
    with open(path, "w", encoding="utf-8") as file:
        for i, (program, answer) in enumerate(programs):
            file.write(json.dumps({"question": f"question {i}", "answer": answer, "program": program}) + "\n")
    return str(path)


def test_hostile_programs_fail_with_their_kind_and_the_run_goes_on(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["trex"].__file__)))
    programs = [("print('Optimal objective value: 10')", 10)]
    programs += [(source.format(repo=repo), 1) for source, _ in HOSTILE.values()]
    programs += [
        (
            "import pyscipopt\nm = pyscipopt.Model(); m.hideOutput()\nx = m.addVar(ub=4); m.setObjective(x, 'maximize'); m.optimize()",
            4,
        )
    ]
    client = ReplayClient(replay_file(tmp_path / "hostile.jsonl", programs))
    benchmark = client.as_benchmark()
    with Sandbox(CPU_LOOP_LIMITS) as sandbox:  # the loop must end on the CPU limit
        run = evaluate(benchmark, client, sandbox, workers=2, progress=False)
    kinds = [run.results[f"{i}#0"].failure for i in range(len(programs))]
    assert kinds == [None, *(kind for _, kind in HOSTILE.values()), None]
    report = build_report(run, Rule.STRICT)
    assert (report.correct, report.pass_at_1) == (2, pytest.approx(2 / 9))
    assert report.failures == {kind: 1 if kind not in ("file_denied",) else 2 for _, kind in HOSTILE.values()}
    assert not os.path.exists("/tmp/trex-runner-pwned")


def slow_programs(count: int) -> list[tuple[str, object]]:
    """Programs that take a moment each, half of them right (answer i) and half wrong."""
    return [
        (f"import time\ntime.sleep(0.3)\nprint('Optimal objective value: {i}')", i if i % 2 == 0 else i + 1)
        for i in range(count)
    ]


def test_a_killed_run_loses_nothing_and_the_rerun_finishes_the_rest(tmp_path):
    predictions = replay_file(tmp_path / "slow.jsonl", slow_programs(24))
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "trex",
        "eval",
        "--client",
        "replay",
        "--predictions",
        predictions,
        "--out",
        str(out),
        "--workers",
        "2",
        "--no-progress",
        "--isolation",
        "process",
    ]
    scratch = tmp_path / "scratch"  # the killed evaluator cannot remove its sandbox directory
    scratch.mkdir()
    environment = {**os.environ, "TMPDIR": str(scratch)}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=environment
    )
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if results.exists() and results.read_text().count("\n") >= 6:
            break
        if process.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {process.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    kept = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    assert 6 <= len(kept) < 24

    client = ReplayClient(predictions)
    with Sandbox(FAST_LIMITS, isolation="process") as sandbox:
        run = evaluate(client.as_benchmark(), client, sandbox, out_dir=out, workers=2, progress=False)
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    keys = [line["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 24  # every sample exactly once
    assert lines[: len(kept)] == kept  # what the killed run wrote is untouched
    assert run.programs_executed <= 24 - len(kept) + 2  # only the rest (and at most the 2 in flight) ran again
    assert build_report(run, Rule.STRICT).correct == 12


def test_rerunning_a_finished_run_executes_nothing_and_reports_the_same(tmp_path):
    predictions = replay_file(tmp_path / "p.jsonl", [(f"print('Optimal objective value: {i}')", i) for i in range(4)])
    client = ReplayClient(predictions)
    benchmark = client.as_benchmark()
    with Sandbox(FAST_LIMITS, isolation="process") as sandbox:
        first = evaluate(benchmark, client, sandbox, out_dir=tmp_path / "out", progress=False)
        second = evaluate(benchmark, client, sandbox, out_dir=tmp_path / "out", progress=False)
    assert (first.programs_executed, second.programs_executed) == (4, 0)
    assert second.programs_per_s is None
    assert build_report(second, Rule.STRICT).pass_at_1 == build_report(first, Rule.STRICT).pass_at_1 == 1.0


def test_an_output_directory_of_another_benchmark_is_refused(tmp_path):
    first = ReplayClient(replay_file(tmp_path / "a.jsonl", [("print(1)", 1)]))
    second = ReplayClient(replay_file(tmp_path / "b.jsonl", [("print(2)", 2)]))
    with Sandbox(FAST_LIMITS, isolation="process") as sandbox:
        evaluate(first.as_benchmark(), first, sandbox, out_dir=tmp_path / "out", progress=False)
        with pytest.raises(RunStateError, match="holds results of a different run .*benchmark_sha256"):
            evaluate(second.as_benchmark(), second, sandbox, out_dir=tmp_path / "out", progress=False)


def test_a_failing_server_stops_the_run_but_keeps_finished_samples(tmp_path, fake_server):
    programs = [(f"print('Optimal objective value: {i}')", i) for i in range(6)]
    benchmark = ReplayClient(replay_file(tmp_path / "b.jsonl", programs)).as_benchmark()

    def respond(prompt: str) -> str:
        number = prompt.split("question ")[1].split()[0]
        return f"Model.\n```python\nprint('Optimal objective value: {number}')\n```\n"

    server = fake_server(script=[None, None, None, 400], respond=respond)  # the 4th request fails
    out = tmp_path / "out"
    with Sandbox(FAST_LIMITS, isolation="process") as sandbox:
        with pytest.raises(ClientError, match="HTTP 400"):
            evaluate(benchmark, OpenAIClient(server.url, "m", concurrency=1), sandbox, out_dir=out, progress=False)
        assert len((out / "results.jsonl").read_text().splitlines()) == 3  # the answers that arrived ran
        run = evaluate(benchmark, OpenAIClient(server.url, "m", concurrency=1), sandbox, out_dir=out, progress=False)
    assert len(server.requests) == 4 + 3  # the re-run asked only for the three missing samples
    assert build_report(run, Rule.STRICT).pass_at_1 == 1.0
    assert len((out / "generations.jsonl").read_text().splitlines()) == 6
